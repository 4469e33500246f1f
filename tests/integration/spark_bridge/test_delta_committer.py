"""DeltaCommitter against real delta-rs tables; files written with pyarrow (no Spark needed)."""

from __future__ import annotations

import datetime as dt_mod
import json
import os
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from table_files import K0, K1, PIPELINE, records, stage

from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.tables.base import (
    CommitConflictError,
    OffsetMismatchError,
    SchemaMismatchError,
    StaleEpochError,
)
from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.files import delta_stats_json, describe_file

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "table"


@pytest.fixture
def committer(table: Path) -> DeltaCommitter:
    c = DeltaCommitter(str(table), PIPELINE)
    c.ensure_table()
    return c


def test_create_table_nullable_and_idempotent(table: Path, committer: DeltaCommitter) -> None:
    schema = pa.schema(DeltaTable(str(table)).schema().to_arrow())
    assert schema.names == RAW_RECORD_SCHEMA.names
    assert all(f.nullable for f in schema)
    DeltaCommitter(str(table), PIPELINE).ensure_table()  # exists, same schema: fine
    assert committer.version() == 0


def test_existing_table_with_other_schema_is_rejected(tmp_path: Path) -> None:
    DeltaTable.create(str(tmp_path / "t"), pa.schema([pa.field("x", pa.int64())]))
    with pytest.raises(SchemaMismatchError, match="another schema"):
        DeltaCommitter(str(tmp_path / "t"), PIPELINE).ensure_table()


def test_commit_files_and_offsets_in_one_version(table: Path, committer: DeltaCommitter) -> None:
    f0 = stage(table, records(K0, 0, 10))
    f1 = stage(table, records(K1, 0, 7))
    t0 = time.perf_counter()
    version = committer.commit(
        [f0, f1], {K0: 10, K1: 7}, {K0: None, K1: None}, {"rayconnect.txn": "1"}
    )
    elapsed = time.perf_counter() - t0
    assert version == 1
    assert committer.committed_offsets([K0, K1, "c1/orders/9"]) == {K0: 10, K1: 7}
    assert committer.committed_offsets() == {K0: 10, K1: 7}
    log = [json.loads(x) for x in (table / "_delta_log" / f"{version:020d}.json").open()]
    kinds = sorted(next(iter(action)) for action in log)
    assert kinds == ["add", "add", "commitInfo", "txn", "txn"]
    commit_info = next(a["commitInfo"] for a in log if "commitInfo" in a)
    assert commit_info["rayconnect.txn"] == "1"
    # the standard metrics, as Spark (strings) and delta-rs (integers) write them
    size = f0.size + f1.size
    assert commit_info["operationMetrics"] == {
        "numFiles": "2",
        "numAddedFiles": "2",
        "numRemovedFiles": "0",
        "numOutputRows": "17",
        "numOutputBytes": str(size),
        "num_added_files": 2,
        "num_removed_files": 0,
        "num_added_rows": 17,
        "num_partitions": 0,
    }
    history = DeltaTable(str(table)).history(1)[0]
    assert (history["operation"], history["operationMetrics"]["numOutputRows"]) == ("WRITE", "17")
    print(f"commit latency (2 files): {elapsed * 1000:.1f} ms")

    # second round continues from the committed offsets
    f2 = stage(table, records(K0, 10, 5))
    assert committer.commit([f2], {K0: 15}, {K0: 10}) == 2
    assert committer.committed_offsets() == {K0: 15, K1: 7}


def test_row_counts_match_stats_in_every_reader(table: Path, committer: DeltaCommitter) -> None:
    files = [stage(table, records(K0, 0, 100)), stage(table, records(K1, 0, 42))]
    committer.commit(files, {K0: 100, K1: 42}, {K0: None, K1: None})
    stats_rows = sum(json.loads(delta_stats_json(f))["numRecords"] for f in files)
    assert stats_rows == 142
    dt = DeltaTable(str(table))
    arrow = dt.to_pyarrow_table()
    assert arrow.num_rows == stats_rows
    assert pl.read_delta(str(table)).height == stats_rows
    assert dt.count() == stats_rows  # count() answers from the stats alone
    stats = json.loads(delta_stats_json(files[0]))
    assert stats["minValues"]["offset"] == 0 and stats["maxValues"]["offset"] == 99
    assert stats["nullCount"]["value"] == 20
    assert stats["minValues"]["timestamp"] == "2023-11-14T22:13:20.000000Z"
    # Data skipping with our stats gives right answers.
    assert dt.to_pyarrow_table(filters=[("offset", ">=", 90)]).num_rows == 10
    last = dt_mod.datetime.fromtimestamp(1_700_000_000.000099, dt_mod.UTC)
    assert dt.to_pyarrow_table(filters=[("timestamp", ">=", last)]).num_rows == 1
    assert pl.read_delta(str(table)).filter(pl.col("timestamp") >= last).height == 1


def test_offset_mismatch_commits_nothing(table: Path, committer: DeltaCommitter) -> None:
    committer.commit([stage(table, records(K0, 0, 3))], {K0: 3}, {K0: None})
    before = committer.version()
    late = stage(table, records(K0, 0, 3))
    with pytest.raises(OffsetMismatchError) as info:
        committer.commit([late], {K0: 3, K1: 1}, {K0: None, K1: None})
    assert info.value.mismatches == {K0: (None, 3)}
    assert "c1/orders/0: expected None, table has 3" in str(info.value)
    assert committer.version() == before
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 3
    with pytest.raises(ValueError, match="no expected offset"):
        committer.commit([], {K1: 1}, {})


def test_schema_mismatch_names_the_file(table: Path, committer: DeltaCommitter) -> None:
    bad = records(K0, 0, 3).set_column(2, "partition", pa.array([0, 0, 0], pa.int64()))
    bad_file = stage(table, bad)
    good_file = stage(table, records(K0, 0, 3))
    with pytest.raises(SchemaMismatchError, match=bad_file.path):
        committer.commit([good_file, bad_file], {K0: 3}, {K0: None})
    assert committer.version() == 0
    assert committer.committed_offsets() == {}


def test_stale_epoch_cannot_commit(table: Path, committer: DeltaCommitter) -> None:
    old = committer
    assert old.claim_epoch() == 1
    new = DeltaCommitter(str(table), PIPELINE)
    assert new.claim_epoch() == 2
    with pytest.raises(StaleEpochError, match="expected 1, table has 2"):
        old.commit([stage(table, records(K0, 0, 3))], {K0: 3}, {K0: None}, epoch=1)
    assert new.commit([stage(table, records(K0, 0, 3))], {K0: 3}, {K0: None}, epoch=2) == 3
    # Fenced even when its offsets are stale too: the epoch error comes first.
    with pytest.raises(StaleEpochError):
        old.commit([], {K0: 6}, {K0: None}, epoch=1)
    assert new.committed_offsets() == {K0: 3}  # _coordinator is not a partition
    assert new.epoch() == 2


def test_claim_racing_a_commit_conflicts(table: Path, committer: DeltaCommitter) -> None:
    """The window between the epoch check and the write: delta-rs must reject the commit."""
    assert committer.claim_epoch() == 1
    rival = DeltaCommitter(str(table), PIPELINE)
    original = committer._check_fence

    def check_then_rival_claims(*args, **kwargs):  # runs after update_incremental
        original(*args, **kwargs)
        assert rival.claim_epoch() == 2

    committer._check_fence = check_then_rival_claims  # type: ignore[method-assign]
    with pytest.raises(CommitConflictError):
        committer.commit([stage(table, records(K0, 0, 3))], {K0: 3}, {K0: None}, epoch=1)
    assert rival.committed_offsets() == {}
    assert rival.epoch() == 2


def test_concurrent_claims_one_wins(table: Path, committer: DeltaCommitter) -> None:
    a = DeltaCommitter(str(table), PIPELINE)
    b = DeltaCommitter(str(table), PIPELINE)
    a.ensure_table()
    b.ensure_table()
    a_table = a._table()  # a loads its snapshot, then goes stale
    assert a_table is not None
    a_table.update_incremental = lambda: None  # type: ignore[method-assign]  # a is stale
    assert b.claim_epoch() == 1
    with pytest.raises(CommitConflictError):
        a.claim_epoch()


def test_committed_offsets_survive_checkpoint(table: Path, committer: DeltaCommitter) -> None:
    committer.commit([], {K0: 5}, {K0: None})
    DeltaTable(str(table)).create_checkpoint()
    committer.commit([], {K1: 9}, {K1: None})
    DeltaCommitter(str(table), "other").commit([], {K0: 1}, {K0: None})
    assert DeltaCommitter(str(table), PIPELINE).committed_offsets() == {K0: 5, K1: 9}


def test_vacuum_removes_uncommitted_keeps_committed(table: Path, committer: DeltaCommitter) -> None:
    kept = stage(table, records(K0, 0, 4))
    committer.commit([kept], {K0: 4}, {K0: None})
    orphan = stage(table, records(K0, 4, 4))  # written, round aborted, never committed
    old = time.time() - 3600
    os.utime(table / orphan.path, (old, old))
    assert committer.vacuum(retention_hours=1.5) == []  # younger than retention: kept
    removed = committer.vacuum(retention_hours=0)
    assert removed == [orphan.path]
    assert not (table / orphan.path).exists()
    assert not (table / orphan.path).parent.exists()  # emptied staging folder removed
    assert (table / kept.path).exists()
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 4
    assert committer.committed_offsets() == {K0: 4}


def test_offset_race_is_a_conflict_not_a_duplicate(table: Path, committer: DeltaCommitter) -> None:
    """Both pass the compare step; delta-rs must reject the second (same app ids)."""
    rival = DeltaCommitter(str(table), PIPELINE)
    original = committer._check_fence

    def check_then_rival_commits(*args, **kwargs):
        original(*args, **kwargs)
        rival.commit([stage(table, records(K0, 0, 3))], {K0: 3}, {K0: None})

    committer._check_fence = check_then_rival_commits  # type: ignore[method-assign]
    with pytest.raises(CommitConflictError, match="nothing committed"):
        committer.commit([stage(table, records(K0, 0, 3))], {K0: 3}, {K0: None})
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 3
    assert rival.committed_offsets() == {K0: 3}


def test_footer_stats_merge_row_groups(tmp_path: Path) -> None:
    data = records(K0, 0, 35)
    data = data.set_column(6, "value", pa.array([None] * 10 + [b"v"] * 25, pa.binary())).set_column(
        0, "cluster", pa.array([None] * 10 + ["c1"] * 25, pa.string())
    )
    pq.write_table(data, tmp_path / "f.parquet", row_group_size=10)
    assert pq.read_metadata(tmp_path / "f.parquet").num_row_groups == 4
    data_file, schema = describe_file(str(tmp_path), "f.parquet")
    assert data_file.records == 35
    assert data_file.stats.min_values["offset"] == 0
    assert data_file.stats.max_values["offset"] == 34
    assert data_file.stats.min_values["cluster"] == "c1"  # all-null row group ignored
    assert data_file.stats.null_count["value"] == 10
    assert data_file.stats.null_count["cluster"] == 10
    assert "value" not in data_file.stats.min_values  # binary: null count only
    assert "headers" not in data_file.stats.null_count  # nested: no stats
    assert schema.names == RAW_RECORD_SCHEMA.names
