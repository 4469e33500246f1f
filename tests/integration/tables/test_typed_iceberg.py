"""Typed Iceberg tables on real pyiceberg tables (SQL catalog on sqlite), rounds staged like
the executors stage them (no Spark): a new field is an optional column added in the round's
own snapshot, narrower ints widen, conflicts are refused, dead letters exactly once across
both tables through a coordinator that dies between the two commits, and a table partitioned
by ``day(ts)`` and a column that pyiceberg, Polars and DuckDB prune. The same rules as Delta's
(``test_typed_delta.py``), through the same committer interface."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from iceberg_reads import duckdb_query, load_table
from typed_files import raw, stage_decoded

import rayconnect as rc
from rayconnect.formats.rows import decode_block
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat
from rayconnect.storage.location import TableLocation
from rayconnect.tables.base import SchemaMismatchError
from rayconnect.tables.factory import open_committer
from rayconnect.tables.files import STAGING_DIR, describe_file
from rayconnect.tables.iceberg import IcebergCommitter

pytestmark = [pytest.mark.timeout(120)]
KEY = "c/t/0"
FMT = RecordFormat(value_format="json", errors="dead_letter")


def committer(sink: rc.IcebergSink, fmt: RecordFormat = FMT) -> IcebergCommitter:
    c = open_committer(sink, "p", fmt)
    assert isinstance(c, IcebergCommitter)
    c.ensure_table()
    return c


def stage_round(c: IcebergCommitter, values: list[bytes], start: int, fmt: RecordFormat = FMT):  # noqa: ANN201
    return stage_decoded(Path(c.location.uri), values, start, fmt, c.current_schema())


def scan(sink: rc.IcebergSink, table: str | None = None) -> pl.DataFrame:
    t = load_table(sink, table)
    return pl.from_arrow(t.scan().to_arrow()).sort("_kafka_offset")


@pytest.fixture
def sink(tmp_path: Path) -> rc.IcebergSink:
    return rc.IcebergSink("db.typed", warehouse=str(tmp_path / "warehouse"))


def test_new_field_is_a_column_of_the_rounds_own_snapshot_old_rows_null(
    sink: rc.IcebergSink,
) -> None:
    c = committer(sink)
    first = [b'{"id":1,"tags":["a"],"s":{"n":"x"}}', b'{"id":2,"tags":[],"s":{"n":"y"}}']
    c.commit(stage_round(c, first, 0), {KEY: 2}, {KEY: None})
    snapshots = len(load_table(sink).metadata.snapshots)
    # Decoded against the table's schema as pyiceberg gives it (large_string, large_list,
    # field ids): the strings, lists and structs of the table's columns still decode.
    second = stage_round(c, [b'{"id":3,"color":"red","tags":["b"],"s":{"n":"z"}}'], 2)
    assert not [f for f in second if f.path.startswith(DEAD_LETTER_DIR)]
    c.commit(second, {KEY: 3}, {KEY: 2})
    table = load_table(sink)
    assert len(table.metadata.snapshots) == snapshots + 1  # schema + files: one commit
    assert table.schema().find_field("color").optional
    df = scan(sink)
    assert df["id"].to_list() == [1, 2, 3] and df["color"].to_list() == [None, None, "red"]
    assert df["tags"].to_list() == [["a"], [], ["b"]] and df["s"].to_list()[2] == {"n": "z"}
    # Polars' own reader (2.1) misreads files without Iceberg field ids once the schema
    # evolved (columns added later read as null); its pyiceberg reader uses the name mapping.
    polars = (
        pl.scan_iceberg(table, reader_override="pyiceberg")
        .select("id", "color")
        .collect()
        .sort("id")
    )
    assert polars.rows() == [(1, None), (2, None), (3, "red")]
    assert duckdb_query(sink, "SELECT id, color FROM TABLE ORDER BY id") == [
        (1, None),
        (2, None),
        (3, "red"),
    ]
    assert c.committed_offsets() == {KEY: 3}
    # A value of another type than its column is a dead letter, not a null or a failure.
    c.commit(stage_round(c, [b'{"id":"four"}', b'{"id":5}'], 3), {KEY: 5}, {KEY: 3})
    assert scan(sink)["id"].to_list() == [1, 2, 3, 5]
    dead = scan(sink, "db.typed_dead_letters")
    assert dead["_kafka_offset"].to_list() == [3] and dead["value"].to_list() == [b'{"id":"four"}']
    assert c.dead_letter_counts() == {KEY: 1}


def test_narrower_int_file_reads_as_the_tables_long(sink: rc.IcebergSink, tmp_path: Path) -> None:
    fmt = RecordFormat(value_format="json", value_schema={"id": "long"})
    c = committer(sink, fmt)
    root = Path(c.location.uri)
    rows = decode_block(raw([b'{"id":7}'], 0), fmt, c.current_schema()).rows
    narrow = rows.set_column(rows.schema.get_field_index("id"), "id", rows["id"].cast("int32"))
    rel = f"{STAGING_DIR}/narrow/part-0.parquet"
    (root / rel).parent.mkdir(parents=True)
    pq.write_table(narrow, str(root / rel))
    c.commit([describe_file(TableLocation.parse(str(root)), rel)[0]], {KEY: 1}, {KEY: None})
    assert str(load_table(sink).schema().find_field("id").field_type) == "long"
    assert scan(sink)["id"].to_list() == [7]


def test_conflicting_file_is_refused(sink: rc.IcebergSink) -> None:
    c = committer(sink)
    c.commit(stage_round(c, [b'{"id":1}'], 0), {KEY: 1}, {KEY: None})
    # A file from elsewhere (decoding always follows the table) whose "id" is a string.
    root = Path(c.location.uri)
    rel = f"{STAGING_DIR}/other/part-0.parquet"
    (root / rel).parent.mkdir(parents=True)
    pq.write_table(decode_block(raw([b'{"id":"x"}'], 1), FMT, None).rows, str(root / rel))
    files = [describe_file(TableLocation.parse(str(root)), rel)[0]]
    with pytest.raises(SchemaMismatchError, match="'id' is string in the data"):
        c.commit(files, {KEY: 2}, {KEY: 1})
    assert c.committed_offsets() == {KEY: 1}
    assert scan(sink)["id"].to_list() == [1]


def test_dead_letters_exactly_once_when_the_coordinator_dies_between_commits(
    sink: rc.IcebergSink,
) -> None:
    first = committer(sink)
    values = [b'{"id":0}', b"bad-1", b'{"id":2}', b"bad-3"]
    files = stage_round(first, values, 0)
    dead = [f for f in files if f.path.startswith(DEAD_LETTER_DIR)]
    # The first coordinator commits the dead letters, then dies before the main commit.
    first.commit_dead_letters(dead, {KEY: 4})
    assert scan(sink, "db.typed_dead_letters").height == 2
    assert first.committed_offsets() == {}
    # Its successor re-reads the round from the table's offsets, with more records now.
    second = committer(sink)
    retry = stage_round(second, [*values, b"bad-4", b'{"id":5}'], 0)
    second.commit(retry, {KEY: 6}, {KEY: None})
    assert scan(sink, "db.typed_dead_letters")["_kafka_offset"].to_list() == [1, 3, 4]
    assert scan(sink)["_kafka_offset"].to_list() == [0, 2, 5]
    assert second.committed_offsets() == {KEY: 6}
    assert second.dead_letter_counts() == {KEY: 3}
    # The retry's staged dead-letter file went in as a filtered copy: vacuum finds the
    # original; the committed ones stay.
    stale = {f.path for f in retry if f.path.startswith(DEAD_LETTER_DIR)}
    found = set(second.vacuum(0, dry_run=True))
    assert stale <= found and not {f.path for f in dead} & found


def test_partition_spec_from_partition_by_and_pruned_reads(tmp_path: Path) -> None:
    sink = rc.IcebergSink(
        "db.parted",
        warehouse=str(tmp_path / "warehouse"),
        partition_by=("day=day(at)", "country"),
    )
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("s", {"c": rc.ClusterMetadata("x:1", ("t",))}),)
    )
    source = rc.KafkaSource(
        meta,
        value_format="json",
        value_schema={"id": "long", "country": "string", "at": "timestamp"},
    )
    fmt = rc.SinkPipeline("p", source, sink).config.record_format()
    c = committer(sink, fmt)
    spec = load_table(sink).spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [
        ("day", "day"),
        ("country", "identity"),
    ]
    values = [
        json.dumps(
            {"id": i, "country": ("DE", "FR")[i % 2], "at": f"2026-11-{20 + i % 3}T10:00:00Z"}
        ).encode()
        for i in range(30)
    ]
    files = stage_round(c, values, 0, fmt)
    assert len(files) == 6  # 3 days x 2 countries
    c.commit(files, {KEY: 30}, {KEY: None})
    table = load_table(sink)
    assert "day" not in table.schema().column_names  # derived by the table, not stored
    partitions = {
        (str(p["day"]), p["country"]) for p in table.inspect.files()["partition"].to_pylist()
    }
    assert len(partitions) == 6
    assert sorted(scan(sink)["id"].to_list()) == list(range(30))
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

    day21 = And(
        GreaterThanOrEqual("at", "2026-11-21T00:00:00+00:00"),
        LessThan("at", "2026-11-22T00:00:00+00:00"),
    )
    assert len(list(table.scan(row_filter=day21).plan_files())) == 2  # of 6: pruned by day
    fr = And(day21, EqualTo("country", "FR"))
    assert len(list(table.scan(row_filter=fr).plan_files())) == 1
    want = sum(1 for i in range(30) if i % 3 == 1 and i % 2 == 1)
    de = pl.scan_iceberg(table).filter(pl.col("country") == "DE").collect()
    assert sorted(de["id"].to_list()) == list(range(0, 30, 2))
    got = duckdb_query(
        sink,
        "SELECT count(*) FROM TABLE WHERE \"at\" >= TIMESTAMPTZ '2026-11-21 00:00:00+00' "
        "AND \"at\" < TIMESTAMPTZ '2026-11-22 00:00:00+00' AND country = 'FR'",
    )
    assert got == [(want,)]
    # Reopening checks the spec; another spec on a table with data is refused.
    committer(sink, fmt)
    other = rc.IcebergSink(
        "db.parted", warehouse=str(tmp_path / "warehouse"), partition_by=("country",)
    )
    other_fmt = rc.SinkPipeline("p", source, other).config.record_format()
    with pytest.raises(SchemaMismatchError, match="partitioned by"):
        committer(other, other_fmt)


def test_partitioned_table_evolves_with_inferred_columns_and_iso_timestamps(tmp_path: Path) -> None:
    from test_typed_delta import EVOLVED, EVOLVING, _evolved, _evolving_rounds

    sink = rc.IcebergSink("db.evolving", warehouse=str(tmp_path / "wh"), partition_by=("region",))
    fmt = msgspec.structs.replace(EVOLVING, partition_values_in_files=True)
    c = committer(sink, fmt)
    offset, before = 0, None
    for values in _evolving_rounds():
        files = stage_round(c, values, offset, fmt)
        offset += len(values)
        c.commit(files, {KEY: offset}, {KEY: before})
        before = offset
    table = load_table(sink)
    assert [f.name for f in table.spec().fields] == ["region"]
    arrow = table.scan().to_arrow()
    assert arrow.schema.field("seen").type == pa.timestamp("us", tz="UTC")
    assert _evolved(arrow.to_pylist()) == EVOLVED
    regions = {p["region"] for p in table.inspect.files()["partition"].to_pylist()}
    assert regions == {"north", "south", "east", None}
