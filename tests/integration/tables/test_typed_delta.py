"""Typed Delta tables on real delta-rs tables, files staged like the executors do (decoded
with ``formats.rows``, no Spark): schema evolution, dead letters exactly once across both
tables through a coordinator that dies between the two commits, reads by Polars and DuckDB."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from table_files_duckdb import duckdb_delta_rows
from typed_files import raw, stage_decoded

from rayconnect.formats.rows import decode_block
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat
from rayconnect.protocol.types import DataFile
from rayconnect.storage.location import TableLocation
from rayconnect.tables.base import SchemaMismatchError
from rayconnect.tables.delta import DeltaCommitter, current_schema
from rayconnect.tables.files import STAGING_DIR, describe_file

pytestmark = [pytest.mark.timeout(60)]
KEY = "c/t/0"
FMT = RecordFormat(value_format="json", errors="dead_letter")


def stage_round(
    table: Path, values: list[bytes], start: int, fmt: RecordFormat = FMT
) -> list[DataFile]:
    """Decode like an executor (against the table's schema now) and stage the files."""
    return stage_decoded(
        table, values, start, fmt, current_schema(TableLocation.parse(str(table)), fmt)
    )


def test_new_field_adds_a_nullable_column_old_rows_null(tmp_path: Path) -> None:
    table = tmp_path / "typed"
    c = DeltaCommitter(str(table), "p", record_format=FMT)
    c.ensure_table()
    c.commit(stage_round(table, [b'{"id":1}', b'{"id":2}'], 0), {KEY: 2}, {KEY: None})
    c.commit(stage_round(table, [b'{"id":3,"color":"red"}'], 2), {KEY: 3}, {KEY: 2})
    df = pl.read_delta(str(table)).sort("_kafka_offset")
    assert df["id"].to_list() == [1, 2, 3]
    assert df["color"].to_list() == [None, None, "red"]
    assert duckdb_delta_rows(table, "SELECT id, color FROM TABLE ORDER BY id") == [
        (1, None),
        (2, None),
        (3, "red"),
    ]
    assert c.committed_offsets() == {KEY: 3}
    # A value of another type than its column is a dead letter, not a null or a failure.
    c.commit(stage_round(table, [b'{"id":"four"}', b'{"id":5}'], 3), {KEY: 5}, {KEY: 3})
    assert pl.read_delta(str(table))["id"].sort().to_list() == [1, 2, 3, 5]
    dead = pl.read_delta(str(table / DEAD_LETTER_DIR))
    assert dead["_kafka_offset"].to_list() == [3] and dead["value"].to_list() == [b'{"id":"four"}']


def test_conflicting_file_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "typed"
    c = DeltaCommitter(str(table), "p", record_format=FMT)
    c.ensure_table()
    c.commit(stage_round(table, [b'{"id":1}'], 0), {KEY: 1}, {KEY: None})
    # A file from elsewhere (decoding always follows the table) whose "id" is a string.
    rel = f"{STAGING_DIR}/other/part-0.parquet"
    (table / rel).parent.mkdir(parents=True)
    rows = decode_block(raw([b'{"id":"x"}'], 1), FMT, None).rows
    pq.write_table(rows, str(table / rel))
    files = [describe_file(TableLocation.parse(str(table)), rel)[0]]
    with pytest.raises(SchemaMismatchError, match="'id' is string in the data"):
        c.commit(files, {KEY: 2}, {KEY: 1})
    assert c.committed_offsets() == {KEY: 1}


def test_dead_letters_exactly_once_when_the_coordinator_dies_between_commits(
    tmp_path: Path,
) -> None:
    table = tmp_path / "typed"
    first = DeltaCommitter(str(table), "p", record_format=FMT)
    first.ensure_table()
    values = [b'{"id":0}', b"bad-1", b'{"id":2}', b"bad-3"]
    files = stage_round(table, values, 0)
    dead = [f for f in files if f.path.startswith(DEAD_LETTER_DIR)]
    assert [f.dead_letters for f in files] == [{}, {KEY: 2}]  # counted as written
    # The first coordinator commits the dead letters, then dies before the main commit.
    first.commit_dead_letters(dead, {KEY: 4})
    assert pl.read_delta(str(table / DEAD_LETTER_DIR)).height == 2
    assert first.committed_offsets() == {}
    # Its successor re-reads the round from the table's offsets, with more records now.
    second = DeltaCommitter(str(table), "p", record_format=FMT)
    second.ensure_table()
    retry = stage_round(table, [*values, b"bad-4", b'{"id":5}'], 0)
    second.commit(retry, {KEY: 6}, {KEY: None})
    dl = pl.read_delta(str(table / DEAD_LETTER_DIR)).sort("_kafka_offset")
    assert dl["_kafka_offset"].to_list() == [1, 3, 4]  # each once
    assert pl.read_delta(str(table))["_kafka_offset"].sort().to_list() == [0, 2, 5]
    assert DeltaTable(str(table / DEAD_LETTER_DIR)).transaction_version(f"p/{KEY}") == 6
    assert second.committed_offsets() == {KEY: 6}
    assert second.dead_letter_counts() == {KEY: 3}
    # The retry's staged dead-letter file was committed as a filtered copy (offset 4 only):
    # the original is not in the table, and vacuum finds it; the committed ones stay.
    stale = {f.path for f in retry if f.path.startswith(DEAD_LETTER_DIR)}
    found = set(second.vacuum(0, dry_run=True))
    assert stale <= found and not {f.path for f in dead} & found


def test_partitioned_table_hive_folders_partition_values_and_pruned_reads(tmp_path: Path) -> None:
    from rayconnect.formats.partitioning import split
    from rayconnect.formats.rows import partition_specs

    fmt = RecordFormat(
        value_format="json",
        value_schema={"id": "long", "country": "string", "at": "timestamp"},
        partition_by=("day=day(at)", "country"),
    )
    table = tmp_path / "parted"
    c = DeltaCommitter(str(table), "p", record_format=fmt)
    c.ensure_table()
    values = [
        json.dumps(
            {"id": i, "country": ("DE", "FR")[i % 2], "at": f"2026-11-{20 + i % 3}T10:00:00Z"}
        ).encode()
        for i in range(30)
    ]
    location = TableLocation.parse(str(table))
    block = decode_block(raw(values, 0), fmt, current_schema(location, fmt))
    files = []
    for folder, rows in split(block.rows, partition_specs(fmt)):
        rel = f"{STAGING_DIR}/w/{folder}/part-0-g0.parquet"
        (table / rel).parent.mkdir(parents=True)
        pq.write_table(rows, str(table / rel))
        files.append(describe_file(location, rel)[0])
    assert len(files) == 6  # 3 days x 2 countries
    c.commit(files, {KEY: 30}, {KEY: None})
    dt = DeltaTable(str(table))
    assert list(dt.metadata().partition_columns) == ["day", "country"]
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert {(a["partition.day"].isoformat(), a["partition.country"]) for a in adds} == {
        (f"2026-11-{d}", cc) for d in (20, 21, 22) for cc in ("DE", "FR")
    }
    df = pl.read_delta(str(table))
    assert sorted(df["id"].to_list()) == list(range(30))
    one = pl.scan_delta(str(table)).filter(pl.col("country") == "DE").collect()
    assert sorted(one["id"].to_list()) == list(range(0, 30, 2))
    got = duckdb_delta_rows(
        table, "SELECT count(*) FROM TABLE WHERE day = DATE '2026-11-21' AND country = 'FR'"
    )
    assert got == [(sum(1 for i in range(30) if i % 3 == 1 and i % 2 == 1),)]
    plan = duckdb_delta_rows(
        table, "EXPLAIN ANALYZE SELECT count(*) FROM TABLE WHERE day = DATE '2026-11-21'"
    )
    assert "Scanning Files: 2/6" in str(plan) or "2/6" in str(plan), plan


def test_the_dead_letter_table_gets_the_same_upkeep(tmp_path: Path) -> None:
    import time

    from rayconnect.protocol.upkeep import CompactSettings, LogSettings
    from rayconnect.tables.delta_upkeep import CHECKPOINT_INTERVAL, DeltaUpkeep

    table = tmp_path / "typed"
    c = DeltaCommitter(str(table), "p", record_format=FMT)
    c.ensure_table()
    keeper = DeltaUpkeep(
        str(table), "p", CompactSettings(min_files=2), LogSettings(checkpoint_interval=3), 0, FMT
    )
    assert keeper.dead_letter_upkeep() is None  # no bad record yet: no table to keep
    for r in range(8):  # a bad record in every round: a small dead-letter file each
        c.commit(
            stage_round(table, [b'{"id":1}', b"bad"], 2 * r), {KEY: 2 * r + 2}, {KEY: 2 * r or None}
        )
    dead_dir = table / DEAD_LETTER_DIR
    assert len(DeltaTable(str(dead_dir)).file_uris()) == 8
    metrics = keeper.compact()
    assert metrics["dead_letters"]["numFilesRemoved"] == 8
    assert len(DeltaTable(str(dead_dir)).file_uris()) == 1
    time.sleep(1)
    done = keeper.tidy()
    assert done["files_vacuumed"] == 16  # the compacted-away files: 8 of each table
    assert done["dead_letters"]["checkpoint_created"]
    assert not list((dead_dir / "staging").rglob("*.parquet"))
    dead = DeltaTable(str(dead_dir))
    assert dead.metadata().configuration[CHECKPOINT_INTERVAL] == "3"
    assert pl.read_delta(str(dead_dir))["_kafka_offset"].sort().to_list() == list(range(1, 16, 2))
    assert dead.transaction_version(f"p/{KEY}") == 16  # offsets untouched by upkeep
    assert c.dead_letter_counts() == {KEY: 8}


def _evolving_rounds() -> list[list[bytes]]:
    """Two rounds of a partitioned table whose schema evolves: ``region`` declared (the
    partition), everything else inferred - ``seen`` ISO times with fractions and offsets,
    ``note`` only from the second round on."""
    first = [
        json.dumps(
            {
                "id": i,
                "region": ("north", "south")[i % 2],
                "seen": f"2026-11-20T10:00:0{i}.25+01:00",
            }
        ).encode()
        for i in range(4)
    ]
    second = [
        json.dumps(
            {"id": 4, "region": "east", "seen": "2026-11-21T00:00:00Z", "note": "new"}
        ).encode(),
        json.dumps({"id": 5, "seen": "2026-11-21 01:02:03.5"}).encode(),  # no region: null
    ]
    return [first, second]


#: the rows ``_evolving_rounds`` leave: id -> (region, seen, note)
EVOLVED = {
    **{
        i: ("north" if i % 2 == 0 else "south", f"2026-11-20 09:00:0{i}.250000+00:00", None)
        for i in range(4)
    },
    4: ("east", "2026-11-21 00:00:00+00:00", "new"),
    5: (None, "2026-11-21 01:02:03.500000+00:00", None),
}

EVOLVING = RecordFormat(
    value_format="json",
    value_schema={"id": "long", "region": "string"},
    infer_other_fields=True,
    partition_by=("region",),
)


def _evolved(rows: list[dict]) -> dict[int, tuple]:
    return {r["id"]: (r["region"], str(r["seen"]), r.get("note")) for r in rows}


def test_partitioned_table_evolves_with_inferred_columns_and_iso_timestamps(tmp_path: Path) -> None:
    table = tmp_path / "evolving"
    c = DeltaCommitter(str(table), "p", record_format=EVOLVING)
    c.ensure_table()
    offset, before = 0, None
    for values in _evolving_rounds():
        files = stage_round(table, values, offset, EVOLVING)
        offset += len(values)
        c.commit(files, {KEY: offset}, {KEY: before})
        before = offset
    dt = DeltaTable(str(table))
    assert list(dt.metadata().partition_columns) == ["region"]
    schema = pa.schema(dt.schema().to_arrow())
    assert schema.field("seen").type == pa.timestamp("us", tz="UTC")
    assert schema.field("note").type == pa.string()
    assert _evolved(dt.to_pyarrow_table().to_pylist()) == EVOLVED
    adds = pa.table(dt.get_add_actions(flatten=True)).column("partition.region").to_pylist()
    assert sorted(adds, key=str) == sorted(["north", "south", "east", None], key=str)
