"""The writer's cache of a routed sink's table schemas (``tables.table_set.RouteSchemas``)
on real Delta tables, no Spark: read once, then only the tables a write did not match."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typed_files import stage_decoded

import rayconnect as rc
from rayconnect.formats.settings import RecordFormat
from rayconnect.spark_bridge.parquet_writer import _changes_schema
from rayconnect.tables.factory import open_committer
from rayconnect.tables.table_set import RouteSchemas

pytestmark = [pytest.mark.timeout(60)]
FMT = RecordFormat(value_format="json")
KEY = "c/t/0"


def _commit(sink: rc.DeltaSink, name: str, values: list[bytes], start: int) -> pa.Schema:
    """One round of ``values`` into route table ``name``; the staged file's schema."""
    committer = open_committer(sink.route_table(name), "p", FMT)
    committer.ensure_table()
    table = Path(sink.route_table(name).path)
    files = stage_decoded(table, values, start, FMT, committer.current_schema())
    expected = committer.committed_offsets([KEY]) or {KEY: None}
    committer.commit(files, {KEY: start + len(values)}, expected)
    return pq.read_schema(table / files[0].path)


def test_schemas_are_read_once_then_only_for_tables_a_write_did_not_match(
    tmp_path: Path,
) -> None:
    routes = rc.Routes((rc.Route("t_{1}", topic_pattern=r"s\.(.*)"),))
    sink = rc.DeltaSink(str(tmp_path / "lake"), routes=routes)
    _commit(sink, "t_a", [b'{"id":1}'], 0)
    schemas = RouteSchemas(sink, "p", FMT)
    first = schemas()
    assert sorted(first) == ["t_a"] and "id" in first["t_a"].names
    assert schemas.reads == 1
    # a new table and a new column: not seen until a write says so - no read per call
    _commit(sink, "t_b", [b'{"id":2}'], 0)
    evolved = _commit(sink, "t_a", [b'{"id":3,"color":"red"}'], 1)
    assert _changes_schema(evolved, first["t_a"])
    assert sorted(schemas()) == ["t_a"] and schemas.reads == 1
    schemas.changed(["t_a", "t_b", "t_c"])  # t_c: a table not made yet stays out
    now = schemas()
    assert sorted(now) == ["t_a", "t_b"] and schemas.reads == 4
    assert "color" in now["t_a"].names
    assert not _changes_schema(evolved, now["t_a"])
    assert schemas() == now and schemas.reads == 4
    # a restarted writer lists them again
    assert sorted(RouteSchemas(sink, "p", FMT)()) == ["t_a", "t_b"]


def test_a_file_changes_a_schema_with_a_new_column_a_new_type_or_no_table() -> None:
    table = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    assert not _changes_schema(pa.schema([pa.field("id", pa.int64())]), table)
    assert _changes_schema(pa.schema([pa.field("x", pa.int64())]), table)
    assert _changes_schema(pa.schema([pa.field("id", pa.float64())]), table)
    assert _changes_schema(pa.schema([pa.field("id", pa.int64())]), None)
