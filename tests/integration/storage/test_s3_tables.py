"""Tables on object storage, against a real SeaweedFS S3 and real delta-rs (no Spark here).

The embedded store itself (loopback only, free ports, cleanup, crash keeps its log), the
committer on S3 (footers, stats, schema checks, compare-and-set, vacuum), zombie fencing with
two committers racing on the store, and the checks that run before a pipeline starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from table_files import K0, K1, PIPELINE, records, stage

from rayconnect.config.sink import ConfigError, DeltaSink
from rayconnect.storage.embedded_s3 import EmbeddedS3
from rayconnect.storage.location import TableLocation
from rayconnect.tables.base import (
    CommitConflictError,
    OffsetMismatchError,
    SchemaMismatchError,
    StaleEpochError,
)
from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.files import STAGING_DIR, describe_file

pytestmark = [pytest.mark.timeout(120)]


def rows(location: TableLocation) -> list[tuple[int, int]]:
    t = DeltaTable(location.uri, storage_options=location.delta_options()).to_pyarrow_table(
        columns=["partition", "offset"]
    )
    return list(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))


@pytest.fixture
def location(embedded_s3: EmbeddedS3, s3_bucket: str) -> TableLocation:
    return TableLocation.parse(f"s3://{s3_bucket}/orders", embedded_s3.storage_options)


@pytest.fixture
def committer(location: TableLocation) -> DeltaCommitter:
    c = DeltaCommitter(location, PIPELINE)
    c.ensure_table()
    return c


# -- the embedded store --------------------------------------------------------------------


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on (from /proc, no extra tools)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A = LISTEN
                address, port = local.split(":")
                found.append((address, int(port, 16)))
    return found


@pytest.mark.timeout(120)
def test_embedded_s3_loopback_free_ports_cleanup_and_crash_log() -> None:
    with EmbeddedS3(buckets=["lake"]) as s3:
        pid, root, ports = s3.pid, s3.log_path.parent, set(s3._ports.values())
        assert pid is not None and s3.start_seconds is not None
        listening = _listening(pid)
        assert listening, "weed listens on nothing?"
        # loopback only (0100007F = 127.0.0.1), and only on the ports we picked: none of
        # weed's defaults (8333, 9333, 8888, 8181, 7333, 23646...) that other runs would share
        assert {a for a, _ in listening} == {"0100007F"}, listening
        assert {p for _, p in listening} <= ports
        assert s3.filesystem().get_file_info("lake").type.name == "Directory"
        assert s3.secret_key not in repr(s3)
    assert not root.exists()
    assert not [
        p for p in Path("/tmp").glob("seaweedfs-*.sock") if int(p.stem.split("-")[-1]) in ports
    ]
    assert not s3.running

    crashed = EmbeddedS3().start()
    try:
        os.kill(crashed.pid, signal.SIGKILL)
        crashed._proc.wait(10)
        log = crashed.log_path
    finally:
        crashed.stop()
    assert log.exists() and "S3" in log.read_text()  # kept for diagnosis
    assert not (log.parent / "data").exists()  # the data is not
    shutil.rmtree(log.parent)


@pytest.mark.timeout(120)
def test_embedded_s3_killed_comes_back_on_its_port_with_its_data() -> None:
    """``kill()`` is an outage (the endpoint refuses), ``start()`` the same store again."""
    with EmbeddedS3(buckets=["lake"]) as s3:
        endpoint = s3.endpoint_url
        with s3.filesystem().open_output_stream("lake/x") as f:
            f.write(b"kept")
        s3.kill()
        assert not s3.running
        with pytest.raises(OSError):
            s3.filesystem().get_file_info("lake/x")
        s3.start()
        assert s3.endpoint_url == endpoint
        # start() returns once stored objects read back, not when the gateway first answers.
        assert s3.filesystem().open_input_stream("lake/x").read() == b"kept"
        root = s3.log_path.parent
    assert not root.exists()


# -- the committer on S3 -------------------------------------------------------------------


def test_commit_footers_stats_and_polars_on_s3(
    location: TableLocation, committer: DeltaCommitter
) -> None:
    a, b = stage(location, records(K0, 0, 5)), stage(location, records(K1, 0, 3))
    assert a.records == 5 and a.size > 0 and a.stats.min_values["offset"] == 0
    version = committer.commit([a, b], {K0: 5, K1: 3}, {K0: None, K1: None})
    assert version == committer.version() == 1
    assert sorted(rows(location)) == [(0, o) for o in range(5)] + [(1, o) for o in range(3)]
    assert DeltaCommitter(location, PIPELINE).committed_offsets() == {K0: 5, K1: 3}
    frame = pl.read_delta(location.uri, storage_options=location.delta_options())
    assert frame.height == 8 and frame["offset"].sum() == 10 + 3

    bad = pa.table({"offset": [1]})
    rel = f"{STAGING_DIR}/{uuid.uuid4().hex}/bad.parquet"
    pq.write_table(bad, location.path(rel), filesystem=location.filesystem())
    bad_file, _ = describe_file(location, rel)
    with pytest.raises(SchemaMismatchError, match="bad.parquet"):
        committer.commit([bad_file], {K0: 6}, {K0: 5})
    with pytest.raises(OffsetMismatchError):  # compare-and-set: the round's start is stale
        committer.commit([stage(location, records(K0, 0, 5))], {K0: 5}, {K0: None})
    assert len(rows(location)) == 8 and committer.committed_offsets() == {K0: 5, K1: 3}


def test_vacuum_on_s3_removes_only_uncommitted_files(
    location: TableLocation, committer: DeltaCommitter
) -> None:
    kept = stage(location, records(K0, 0, 4))
    committer.commit([kept], {K0: 4}, {K0: None})
    orphan = stage(location, records(K0, 4, 4))  # written, round aborted, never committed
    assert committer.vacuum(retention_hours=0) == [orphan.path]
    fs = location.filesystem()
    assert fs.get_file_info(location.path(orphan.path)).type.name == "NotFound"
    assert fs.get_file_info(location.path(kept.path)).type.name == "File"
    assert sorted(rows(location)) == [(0, o) for o in range(4)]


# -- fencing: two committers racing on the store -----------------------------------------


def _race(*contenders: Callable[[], object]) -> list[object]:
    """Run the contenders at the same instant (threads released by one barrier); return
    each one's result or exception."""
    barrier = threading.Barrier(len(contenders))
    results: list[object] = [None] * len(contenders)

    def run(i: int, fn: Callable[[], object]) -> None:
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as e:  # collected: the test looks at which one lost, and how
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _past_the_check(committer: DeltaCommitter, barrier: threading.Barrier) -> None:
    """Hold ``committer`` right after its compare-and-set passed, until its rival's passed
    too: both then write a commit of the same table version with the same txn app ids, and
    only the store's conditional put can stop one of them."""
    original = committer._check_fence

    def check_then_wait(*args, **kwargs):
        original(*args, **kwargs)
        barrier.wait(30)

    committer._check_fence = check_then_wait  # type: ignore[method-assign]


def test_compaction_racing_a_round_and_tidy_on_s3(
    location: TableLocation, committer: DeltaCommitter
) -> None:
    """Upkeep on S3 (conditional put): a compaction planned before a round commits after it,
    both land; tidy checkpoints, cleans the log and vacuums; offsets and rows exact."""
    from rayconnect.protocol.upkeep import CompactSettings, LogSettings
    from rayconnect.tables.delta_upkeep import DeltaUpkeep

    keeper = DeltaUpkeep(
        location, PIPELINE, CompactSettings(min_files=2), LogSettings(checkpoint_interval=5), 0
    )
    keeper.configure_table()
    for n in range(4):
        committer.commit(
            [stage(location, records(K0, n * 3, 3))], {K0: n * 3 + 3}, {K0: n * 3 or None}
        )
    snapshot = DeltaTable(location.uri, storage_options=location.delta_options())
    committer.commit([stage(location, records(K0, 12, 3))], {K0: 15}, {K0: 12})
    assert keeper._compact_once(snapshot)["numFilesRemoved"] == 4
    done = keeper.tidy()
    assert done["files_vacuumed"] == 4 and keeper.last_checkpoint() is not None
    assert sorted(rows(location)) == [(0, o) for o in range(15)]
    assert DeltaCommitter(location, PIPELINE).committed_offsets() == {K0: 15}


@pytest.mark.timeout(180)
def test_two_coordinators_racing_on_s3_exactly_one_commits(location: TableLocation) -> None:
    """Five rounds; each time two committers of the same pipeline read the same version,
    pass the offset check, and commit the same records at the same instant."""
    DeltaCommitter(location, PIPELINE).ensure_table()
    expected_rows: list[tuple[int, int]] = []
    start = None
    for round_no in range(5):
        a, b = DeltaCommitter(location, PIPELINE), DeltaCommitter(location, PIPELINE)
        barrier = threading.Barrier(2)
        _past_the_check(a, barrier)
        _past_the_check(b, barrier)
        end = (start or 0) + 10
        files = [stage(location, records(K0, start or 0, 10)) for _ in range(2)]
        before = a.version()
        results = _race(
            lambda a=a, f=files[0], s=start, e=end: a.commit([f], {K0: e}, {K0: s}),
            lambda b=b, f=files[1], s=start, e=end: b.commit([f], {K0: e}, {K0: s}),
        )
        wins = [r for r in results if isinstance(r, int)]
        losses = [r for r in results if isinstance(r, Exception)]
        assert len(wins) == 1 and len(losses) == 1, f"round {round_no}: {results}"
        assert isinstance(losses[0], CommitConflictError), repr(losses[0])
        assert wins[0] == before + 1
        expected_rows += [(0, o) for o in range(start or 0, end)]
        start = end
    table_rows = rows(location)
    assert [r for r, c in Counter(table_rows).items() if c > 1] == []
    assert sorted(table_rows) == expected_rows
    assert DeltaCommitter(location, PIPELINE).committed_offsets() == {K0: 50}


@pytest.mark.timeout(120)
def test_zombie_commit_racing_a_new_epoch_claim_on_s3(location: TableLocation) -> None:
    """The old coordinator commits while a new one claims the next epoch, at the same
    instant: whichever lands, the zombie's round never lands after the claim."""
    old = DeltaCommitter(location, PIPELINE)
    old.ensure_table()
    assert old.claim_epoch() == 1
    new = DeltaCommitter(location, PIPELINE)
    new.ensure_table()
    barrier = threading.Barrier(2)
    _past_the_check(old, barrier)
    data = stage(location, records(K0, 0, 7))

    def claim() -> int:
        barrier.wait(30)  # the zombie passed its epoch and offset checks
        return new.claim_epoch()

    commit_result, claim_result = _race(
        lambda: old.commit([data], {K0: 7}, {K0: None}, epoch=1), claim
    )
    assert claim_result == 2 or isinstance(claim_result, CommitConflictError), claim_result
    fresh = DeltaCommitter(location, PIPELINE)
    if isinstance(commit_result, int) and claim_result == 2:
        # one after the other: the claim read the table after the zombie's commit landed
        # (legal - epoch 1 was still current); the round is in the table BEFORE the claim
        claimed_at = [
            v
            for v in range(fresh.version() + 1)
            for a in fresh.log.commit_actions(v)
            if a.get("txn", {}).get("appId") == f"{PIPELINE}/_coordinator"
            and a["txn"]["version"] == 2
        ]
        assert claimed_at and commit_result < claimed_at[0]
        assert fresh.committed_offsets() == {K0: 7} and fresh.epoch() == 2
    elif isinstance(commit_result, int):  # the zombie's commit landed first: the claim lost
        assert isinstance(claim_result, CommitConflictError)
        assert fresh.committed_offsets() == {K0: 7} and fresh.epoch() == 1
    else:
        assert isinstance(commit_result, CommitConflictError), commit_result
        assert fresh.committed_offsets() == {} and fresh.epoch() == 2
        with pytest.raises(StaleEpochError):
            old.commit([data], {K0: 7}, {K0: None}, epoch=1)
    assert len(rows(location)) == sum(fresh.committed_offsets().values())


# -- checked before start ------------------------------------------------------------------


def _sink(uri: str, options: dict[str, str]) -> DeltaSink:
    return DeltaSink(uri, storage_options=options)


def test_checks_before_start_name_the_setting(embedded_s3: EmbeddedS3, s3_bucket: str) -> None:
    from rayconnect.pipelines.sink import check_sink

    good = embedded_s3.storage_options
    check_sink(_sink(f"s3://{s3_bucket}/t", good))  # fine: nothing raised
    with pytest.raises(ConfigError, match=r"bucket 'no-such-bucket' does not exist"):
        check_sink(_sink("s3://no-such-bucket/t", good))
    wrong = {**good, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    with pytest.raises(ConfigError, match=r"sink.storage_options.AWS_SECRET_ACCESS_KEY") as e:
        check_sink(_sink(f"s3://{s3_bucket}/t", wrong))
    assert "not-the-secret" not in str(e.value) and "refused" in str(e.value)
    unreachable = {**good, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    with pytest.raises(ConfigError, match=r"sink.storage_options.AWS_ENDPOINT_URL: cannot reach"):
        check_sink(_sink(f"s3://{s3_bucket}/t", unreachable))


PIPELINE_FILE = """\
kind: sink
name: s3check
source:
  metadata:
    streams:
      - stream_id: orders
        clusters:
          local: {{bootstrap_servers: "127.0.0.1:9", topics: [orders]}}
sink:
  path: {path}
  storage_options:
    AWS_ENDPOINT_URL: {endpoint}
    AWS_ACCESS_KEY_ID: ${{S3_KEY}}
    AWS_SECRET_ACCESS_KEY: ${{S3_SECRET}}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("problem", ["bucket", "credentials", "endpoint"])
def test_rayconnect_run_exits_2_before_anything_starts(
    embedded_s3: EmbeddedS3, s3_bucket: str, tmp_path: Path, problem: str
) -> None:
    path, endpoint, secret = f"s3://{s3_bucket}/t", embedded_s3.endpoint_url, embedded_s3.secret_key
    expected = {
        "bucket": "bucket 'missing-bucket' does not exist",
        "credentials": "sink.storage_options.AWS_SECRET_ACCESS_KEY",
        "endpoint": "sink.storage_options.AWS_ENDPOINT_URL: cannot reach",
    }[problem]
    if problem == "bucket":
        path = "s3://missing-bucket/t"
    elif problem == "credentials":
        secret = "wrong-secret"
    else:
        endpoint = "http://127.0.0.1:9"
    file = tmp_path / "pipeline.yaml"
    file.write_text(PIPELINE_FILE.format(path=path, endpoint=endpoint))
    env = {**os.environ, "S3_KEY": embedded_s3.access_key, "S3_SECRET": secret}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rayconnect.cli", "run", str(file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert secret not in proc.stderr + proc.stdout
    assert "starting pipeline" in proc.stdout  # it got as far as start(), and no further
    assert time.monotonic() - started < 60
    assert "running" not in proc.stdout  # no actor, no Ray: the check came first
