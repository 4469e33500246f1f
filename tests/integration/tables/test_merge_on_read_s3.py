"""Merge-on-read upserts of a Delta table on S3 (the session's SeaweedFS): the log entry is
a conditional PUT (``storage.put_if_absent``, obstore), so rounds land as on a local disk
and of two writers racing for the same version exactly one lands."""

from __future__ import annotations

import copy
import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyarrow import fs as pafs
from test_merge_on_read import PARTITIONS, History, as_model, fmt, stage

import rayconnect as rc
from rayconnect.storage.embedded_s3 import EmbeddedS3
from rayconnect.storage.put_if_absent import put_if_absent
from rayconnect.tables import delta_row_delta
from rayconnect.tables.base import CommitConflictError, TableCommitter
from rayconnect.tables.factory import open_committer

pytestmark = [pytest.mark.timeout(180)]
CHANGES = 600


def s3_sink(s3: EmbeddedS3, bucket: str) -> rc.DeltaSink:
    return rc.DeltaSink(
        f"s3://{bucket}/mor",
        storage_options=s3.storage_options,
        write_mode="upsert",
        key_columns=("id",),
        upsert_mode="merge_on_read",
    )


def read_back(sink: rc.DeltaSink) -> dict:
    dt = DeltaTable(sink.path, storage_options=sink.location().delta_options())
    q = QueryBuilder().register("t", dt)
    return as_model(pa.table(q.execute("SELECT id, v, region FROM t").read_all()))


def log_versions(c: TableCommitter) -> list[str]:
    return sorted(
        info.base_name
        for info in c.filesystem.get_file_info(pafs.FileSelector(c.location.path("_delta_log")))
        if info.base_name.endswith(".json")
    )


def test_rounds_on_s3_equal_the_model_and_a_racing_writer_conflicts(
    embedded_s3: EmbeddedS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = s3_sink(embedded_s3, s3_bucket)
    c = open_committer(sink, "p", fmt())
    c.ensure_table()
    history = History(5)
    expected: dict[str, int | None] = {f"c/t/{p}": None for p in range(PARTITIONS)}
    for _ in range(3):
        before = c.version()
        files = stage(c, history.changes(CHANGES))
        offsets = history.offsets()
        c.commit(files, offsets, expected)
        expected = dict(offsets)
        assert c.version() == before + 1  # rows, deletion vectors, offsets: one version
        assert c.committed_offsets() == offsets
        assert read_back(sink) == history.model
    dt = DeltaTable(sink.path, storage_options=sink.location().delta_options())
    assert any(f.entry.get("deletionVector") for f in c.live_files(dt)), "no DV written"

    # Two writers of the same round from the same read (a zombie coordinator and its
    # successor), other values for the same keys: both pass the offsets check and the
    # log entry's existence check, then race at the conditional PUT.
    rival = copy.deepcopy(history)  # the same keys and offsets, other values
    rival.round += 100
    branches = {"a": history, "b": rival}
    staged = {name: stage(c, h.changes(CHANGES)) for name, h in branches.items()}
    offsets = history.offsets()
    assert rival.offsets() == offsets and rival.model != history.model
    committers = {"a": c, "b": open_committer(sink, "p", fmt())}
    both_checked = threading.Barrier(2, timeout=60)

    puts: list[object] = []

    def racing_put(*args: object, **kwargs: object) -> None:
        puts.append(args)
        both_checked.wait()
        put_if_absent(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(delta_row_delta, "put_if_absent", racing_put)
    before = c.version()
    outcome: dict[str, object] = {}

    def write(name: str) -> None:
        try:
            outcome[name] = committers[name].commit(staged[name], offsets, expected)
        except Exception as exc:
            outcome[name] = exc

    threads = [threading.Thread(target=write, args=(name,)) for name in branches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    monkeypatch.undo()
    won = [name for name, got in outcome.items() if got == before + 1]
    lost = [name for name, got in outcome.items() if isinstance(got, CommitConflictError)]
    assert len(won) == 1 and len(lost) == 1, outcome
    assert len(puts) == 2  # both got past every check: the conditional PUT decided
    assert log_versions(c)[-1] == f"{before + 1:020d}.json"  # nothing landed twice
    assert c.version() == before + 1 and c.committed_offsets() == offsets
    winner = branches[won[0]]
    assert read_back(sink) == winner.model

    # the table goes on from the winner's version
    c = committers[won[0]]
    files = stage(c, winner.changes(CHANGES))
    c.commit(files, winner.offsets(), dict(offsets))
    assert c.version() == before + 2
    assert read_back(sink) == winner.model


def test_concurrent_create_puts_on_seaweedfs_one_wins(
    embedded_s3: EmbeddedS3, s3_bucket: str
) -> None:
    """The store's conditional PUT itself: of 8 writers of one key, one writes it."""
    location = s3_sink(embedded_s3, s3_bucket).location()
    for trial in range(5):
        rel = f"_delta_log/{trial:020d}.json"
        start = threading.Barrier(8, timeout=60)
        results: dict[int, str] = {}

        def put(
            i: int, rel: str = rel, start: threading.Barrier = start, results: dict = results
        ) -> None:
            start.wait()
            try:
                put_if_absent(location, rel, f"writer {i}".encode())
                results[i] = "ok"
            except FileExistsError:
                results[i] = "exists"

        threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [i for i, r in results.items() if r == "ok"]
        assert len(winners) == 1 and len(results) == 8, results
        fs = location.filesystem()
        with fs.open_input_stream(location.path(rel)) as f:
            assert f.read() == f"writer {winners[0]}".encode()
