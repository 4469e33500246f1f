"""IcebergCommitter against real Iceberg tables (pyiceberg, SQL catalog on sqlite); files
written with pyarrow where the writer would put them (no Spark needed). Read back with
pyiceberg, Polars ``scan_iceberg`` and DuckDB ``iceberg_scan``."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from iceberg_reads import duckdb_rows, iceberg_rows
from table_files import K0, K1, PIPELINE, records, stage

import rayconnect as rc
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.tables.base import (
    CommitConflictError,
    OffsetMismatchError,
    SchemaMismatchError,
    StaleEpochError,
)
from rayconnect.tables.factory import open_committer, open_upkeep
from rayconnect.tables.iceberg import MAINTAIN_EVERY, NUM_RETRIES, IcebergCommitter

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def sink(tmp_path: Path) -> rc.IcebergSink:
    return rc.IcebergSink("db.orders", warehouse=str(tmp_path / "warehouse"))


def new_committer(sink: rc.IcebergSink, pipeline: str = PIPELINE) -> IcebergCommitter:
    """A committer of its own (own catalog connection), as a new coordinator would have."""
    committer = open_committer(sink, pipeline)
    assert isinstance(committer, IcebergCommitter)
    return committer


@pytest.fixture
def committer(sink: rc.IcebergSink) -> IcebergCommitter:
    c = new_committer(sink)
    c.ensure_table()
    return c


def table_dir(sink: rc.IcebergSink) -> Path:
    return Path(sink.location().uri)


def test_create_table_nullable_never_retried_and_idempotent(
    sink: rc.IcebergSink, committer: IcebergCommitter
) -> None:
    table = committer.ensure_table()
    assert table.properties[NUM_RETRIES] == "0"
    assert table.location().removeprefix("file://") == sink.location().uri
    schema = table.schema().as_arrow()
    assert schema.names == RAW_RECORD_SCHEMA.names
    assert all(f.nullable for f in schema)
    new_committer(sink).ensure_table()  # exists, same schema: fine


def test_an_existing_table_is_made_safe_or_refused(sink: rc.IcebergSink) -> None:
    """A table someone else made: retries turned off; another schema refused."""
    catalog = new_committer(sink).catalog()
    catalog.create_namespace("db")
    catalog.create_table("db.orders", schema=RAW_RECORD_SCHEMA, location=sink.location().uri)
    assert NUM_RETRIES not in catalog.load_table("db.orders").properties  # pyiceberg: 4
    assert new_committer(sink).ensure_table().properties[NUM_RETRIES] == "0"
    catalog.create_table("db.other", schema=pa.schema([pa.field("x", pa.int64())]))
    other = rc.IcebergSink("db.other", warehouse=sink.warehouse)
    with pytest.raises(SchemaMismatchError, match="another schema"):
        new_committer(other).ensure_table()


def test_one_snapshot_per_round_with_offsets_in_its_summary_read_by_every_reader(
    sink: rc.IcebergSink, committer: IcebergCommitter
) -> None:
    epoch = committer.claim_epoch()
    files = [stage(table_dir(sink), records(K0, 0, 5)), stage(table_dir(sink), records(K1, 0, 4))]
    before = len(committer._table().metadata.snapshots)
    committer.commit(files, {K0: 5, K1: 4}, {K0: None, K1: None}, {"rayconnect.txn_id": "7"}, epoch)
    table = committer._table()
    assert len(table.metadata.snapshots) == before + 1
    summary = table.current_snapshot().summary
    assert summary[f"rayconnect.{PIPELINE}.offset.{K0}"] == "5"
    assert summary[f"rayconnect.{PIPELINE}.offset.{K1}"] == "4"
    assert summary[f"rayconnect.{PIPELINE}.epoch"] == str(epoch)
    assert summary["rayconnect.txn_id"] == "7"
    assert summary["added-records"] == "9"
    want = sorted(
        [("c1", "orders", 0, o) for o in range(5)] + [("c1", "orders", 1, o) for o in range(4)]
    )
    assert sorted(iceberg_rows(sink)) == want
    assert sorted(duckdb_rows(sink)) == want
    polars_rows = pl.scan_iceberg(table).select("partition", "offset").collect().rows()
    assert sorted(polars_rows) == [(p, o) for _, _, p, o in want]


def test_recovery_from_the_table_alone(sink: rc.IcebergSink, committer: IcebergCommitter) -> None:
    epoch = committer.claim_epoch()
    committer.commit([stage(table_dir(sink), records(K0, 0, 3))], {K0: 3}, {K0: None}, epoch=epoch)
    committer.commit([stage(table_dir(sink), records(K1, 0, 2))], {K1: 2}, {K1: None}, epoch=epoch)
    other = new_committer(sink, "another-pipeline")
    other.commit([], {K0: 99}, {K0: None})  # another pipeline's offsets are its own
    fresh = new_committer(sink)  # a restarted coordinator: nothing but the catalog
    assert fresh.committed_offsets() == {K0: 3, K1: 2}
    assert fresh.committed_offsets([K1, "c1/orders/9"]) == {K1: 2}
    assert fresh.epoch() == epoch
    assert fresh.claim_epoch() == epoch + 1


def test_offset_mismatch_and_bad_files_commit_nothing(
    sink: rc.IcebergSink, committer: IcebergCommitter
) -> None:
    committer.commit([stage(table_dir(sink), records(K0, 0, 3))], {K0: 3}, {K0: None})
    version = committer.version()
    with pytest.raises(OffsetMismatchError, match="expected 1, table has 3"):
        committer.commit([stage(table_dir(sink), records(K0, 1, 5))], {K0: 6}, {K0: 1})
    bad = stage(table_dir(sink), pa.table({"offset": pa.array([1, 2], pa.int64())}))
    with pytest.raises(SchemaMismatchError, match=bad.path):
        committer.commit([bad], {K0: 5}, {K0: 3})
    assert committer.version() == version
    assert committer.committed_offsets() == {K0: 3}
    assert len(iceberg_rows(sink)) == 3


def test_stale_epoch_cannot_commit(sink: rc.IcebergSink, committer: IcebergCommitter) -> None:
    old = committer
    assert old.claim_epoch() == 1
    new = new_committer(sink)
    assert new.claim_epoch() == 2
    with pytest.raises(StaleEpochError):
        old.commit([stage(table_dir(sink), records(K0, 0, 3))], {K0: 3}, {K0: None}, epoch=1)
    new.commit([stage(table_dir(sink), records(K0, 0, 3))], {K0: 3}, {K0: None}, epoch=2)
    assert new.committed_offsets() == {K0: 3}
    assert len(iceberg_rows(sink)) == 3


def _released_together(committer: IcebergCommitter, barrier: threading.Barrier) -> None:
    """Hold ``committer`` after its checks passed, until its rival passed them too: both
    then build their commit on the same snapshot."""
    original = committer._check_fence

    def check_then_wait(*args, **kwargs):
        original(*args, **kwargs)
        barrier.wait(timeout=30)

    committer._check_fence = check_then_wait  # type: ignore[method-assign]


def test_two_committers_racing_on_the_same_round_one_wins_every_time(
    sink: rc.IcebergSink, committer: IcebergCommitter
) -> None:
    """Two threads, two catalog connections, the same round: exactly one lands each time,
    and the table never holds a record twice."""
    a, b = new_committer(sink), new_committer(sink)
    a.ensure_table()
    b.ensure_table()
    barrier = threading.Barrier(2)
    _released_together(a, barrier)
    _released_together(b, barrier)
    won: Counter[str] = Counter()
    offset = 0
    for _ in range(5):
        results: dict[str, BaseException | None] = {}

        def run(
            name: str, c: IcebergCommitter, start: int = offset, results: dict = results
        ) -> None:
            try:
                c.commit(
                    [stage(table_dir(sink), records(K0, start, 10))],
                    {K0: start + 10},
                    {K0: start or None},
                )
                results[name] = None
            except BaseException as error:
                results[name] = error

        threads = [threading.Thread(target=run, args=(n, c)) for n, c in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [n for n, e in results.items() if e is None]
        assert len(winners) == 1, results
        loser = next(e for e in results.values() if e is not None)
        assert isinstance(loser, CommitConflictError), loser
        won[winners[0]] += 1
        offset += 10
    rows = iceberg_rows(sink)
    assert len(rows) == len(set(rows)) == 50
    assert committer.committed_offsets() == {K0: 50}


def test_a_zombie_that_passed_its_epoch_check_loses_to_the_new_claim(
    sink: rc.IcebergSink, committer: IcebergCommitter
) -> None:
    """The window between the epoch check and the swap: the old coordinator is past its
    checks when the new one claims; its commit must fail, not be rebased onto the claim."""
    assert committer.claim_epoch() == 1
    rival = new_committer(sink)
    original = committer._check_fence

    def check_then_rival_claims(*args, **kwargs):
        original(*args, **kwargs)
        claimer = threading.Thread(target=rival.claim_epoch)  # another thread, as in life
        claimer.start()
        claimer.join(30)

    committer._check_fence = check_then_rival_claims  # type: ignore[method-assign]
    with pytest.raises(CommitConflictError):
        committer.commit([stage(table_dir(sink), records(K0, 0, 3))], {K0: 3}, {K0: None}, epoch=1)
    assert rival.epoch() == 2
    assert rival.committed_offsets() == {}
    assert iceberg_rows(sink) == []


def test_vacuum_removes_uncommitted_files_and_keeps_the_table_whole(
    sink: rc.IcebergSink, committer: IcebergCommitter
) -> None:
    committed = stage(table_dir(sink), records(K0, 0, 3))
    committer.commit([committed], {K0: 3}, {K0: None})
    aborted = stage(table_dir(sink), records(K0, 3, 3))  # a round that never committed
    fresh = stage(table_dir(sink), records(K0, 3, 3))  # the open round's file: too young
    old = time.time() - 3 * 3600
    os.utime(table_dir(sink) / aborted.path, (old, old))
    for path in (table_dir(sink) / "metadata").iterdir():
        os.utime(path, (old, old))  # every metadata file is old; the referenced ones stay
    removed = committer.vacuum(retention_hours=1)
    assert removed == [aborted.path]
    assert not (table_dir(sink) / aborted.path).exists()
    assert (table_dir(sink) / fresh.path).exists()
    assert (table_dir(sink) / committed.path).exists()
    assert len(iceberg_rows(sink)) == 3
    assert new_committer(sink).committed_offsets() == {K0: 3}


def test_upkeep_tidies_through_the_same_door_as_deltas(tmp_path: Path) -> None:
    """``open_upkeep`` gives an Iceberg sink a ``TableUpkeep`` too: its tidy vacuums (with
    a committer of its own), nothing to configure or compact."""
    sink = rc.IcebergSink(
        "db.orders", warehouse=str(tmp_path / "warehouse"), vacuum_retention_hours=1
    )
    committer = new_committer(sink)
    committer.commit([stage(table_dir(sink), records(K0, 0, 3))], {K0: 3}, {K0: None})
    aborted = stage(table_dir(sink), records(K0, 3, 3))
    old = time.time() - 3 * 3600
    os.utime(table_dir(sink) / aborted.path, (old, old))
    upkeep = open_upkeep(sink, PIPELINE)
    assert upkeep.configure_table() == {}
    assert upkeep.compact() == {}
    assert upkeep.tidy() == {"files_vacuumed": 1}
    assert not (table_dir(sink) / aborted.path).exists()
    assert len(iceberg_rows(sink)) == 3


def test_expiry_and_manifest_merging_keep_the_metadata_small_and_commits_flat(
    sink: rc.IcebergSink, committer: IcebergCommitter
) -> None:
    """120 rounds: snapshots, manifests and metadata files stay bounded; expired snapshots'
    files become unreferenced and vacuum removes them. Latencies are printed (-s): on a
    loaded machine they are too noisy to assert on beyond a generous bound."""
    latencies = []
    for i in range(120):
        data = stage(table_dir(sink), records(K0, i * 2, 2))
        start = time.perf_counter()
        committer.commit([data], {K0: i * 2 + 2}, {K0: i * 2 or None})
        latencies.append(time.perf_counter() - start)
    table = committer._table()
    assert len(table.metadata.snapshots) <= sink.keep_snapshots + MAINTAIN_EVERY
    assert len(table.current_snapshot().manifests(table.io)) <= 16
    assert len(table.metadata.metadata_log) <= 20
    first, last = statistics.median(latencies[:20]), statistics.median(latencies[-20:])
    print(f"commit latency median: first 20 {first * 1000:.0f} ms, last 20 {last * 1000:.0f} ms")
    assert last < max(4 * first, 0.5)
    old = time.time() - 3 * 3600
    for path in (table_dir(sink) / "metadata").iterdir():
        os.utime(path, (old, old))
    removed = committer.vacuum(retention_hours=1)
    assert removed and all(p.startswith("metadata/") for p in removed)
    assert len(iceberg_rows(sink)) == 240


def test_a_table_on_the_embedded_s3(embedded_s3, s3_bucket: str, tmp_path: Path) -> None:
    """Warehouse on S3 (SeaweedFS), catalog in sqlite: files staged on the store are
    committed, read back by pyiceberg and DuckDB, fenced as on disk, vacuumed there."""
    sink = rc.IcebergSink(
        "db.orders",
        catalog={
            "type": "sql",
            "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"s3://{s3_bucket}/warehouse",
        },
        storage_options=embedded_s3.storage_options,
    )
    location = sink.location()
    assert location.uri == f"s3://{s3_bucket}/warehouse/db/orders"
    old, new = new_committer(sink), new_committer(sink)
    old.ensure_table()
    assert old.claim_epoch() == 1
    old.commit([stage(location, records(K0, 0, 4))], {K0: 4}, {K0: None}, epoch=1)
    assert new.claim_epoch() == 2
    with pytest.raises(StaleEpochError):
        old.commit([stage(location, records(K0, 4, 4))], {K0: 8}, {K0: 4}, epoch=1)
    aborted = stage(location, records(K0, 4, 4))
    new.commit([stage(location, records(K0, 4, 4))], {K0: 8}, {K0: 4}, epoch=2)
    want = [("c1", "orders", 0, o) for o in range(8)]
    assert sorted(iceberg_rows(sink)) == want
    assert new_committer(sink).committed_offsets() == {K0: 8}
    removed = new.vacuum(retention_hours=0)  # nothing is open: every unreferenced file goes
    assert aborted.path in removed
    assert all(p.startswith(("staging/", "metadata/")) for p in removed)
    assert sorted(iceberg_rows(sink)) == want
