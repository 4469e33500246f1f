"""The writer's cache of a routed sink's table schemas (``tables.table_set.RouteSchemas``)
on real Delta tables, no Spark: read once, then only the tables a write did not match."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typed_files import stage_decoded

import rayconnect as rc
from rayconnect.config.routes import RouteFormats
from rayconnect.formats.settings import RecordFormat
from rayconnect.spark_bridge.written_files import changes_schema
from rayconnect.tables.factory import open_committer
from rayconnect.tables.table_set import RouteSchemas

pytestmark = [pytest.mark.timeout(60)]
FMT = RecordFormat(value_format="json")


def _formats(routes: rc.Routes) -> RouteFormats:
    """Every route table decoded as ``FMT`` (what ``SinkPipelineConfig.route_formats`` builds
    for rules without settings of their own)."""
    return RouteFormats(routes, FMT, (FMT,) * len(routes.rules))


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
    schemas = RouteSchemas(sink, "p", _formats(routes))
    first = schemas()
    assert sorted(first) == ["t_a"] and "id" in first["t_a"].names
    assert schemas.reads == 1
    # a new table and a new column: not seen until a write says so - no read per call
    _commit(sink, "t_b", [b'{"id":2}'], 0)
    evolved = _commit(sink, "t_a", [b'{"id":3,"color":"red"}'], 1)
    assert changes_schema(evolved, first["t_a"])
    assert sorted(schemas()) == ["t_a"] and schemas.reads == 1
    schemas.changed(["t_a", "t_b", "t_c"])  # t_c: a table not made yet stays out
    now = schemas()
    assert sorted(now) == ["t_a", "t_b"] and schemas.reads == 4
    assert "color" in now["t_a"].names
    assert not changes_schema(evolved, now["t_a"])
    assert schemas() == now and schemas.reads == 4
    # a restarted writer lists them again
    assert sorted(RouteSchemas(sink, "p", _formats(routes))()) == ["t_a", "t_b"]


def test_a_file_changes_a_schema_with_a_new_column_a_new_type_or_no_table() -> None:
    table = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    assert not changes_schema(pa.schema([pa.field("id", pa.int64())]), table)
    assert changes_schema(pa.schema([pa.field("x", pa.int64())]), table)
    assert changes_schema(pa.schema([pa.field("id", pa.float64())]), table)
    assert changes_schema(pa.schema([pa.field("id", pa.int64())]), None)


def _round(  # noqa: ANN202
    sink: rc.DeltaSink,
    epoch: int,
    txn: int,
    starts: dict[str, int],
    n: int,
    cut: int | None = None,
):
    """A round of ``n`` records for each table ``t_<i>`` (partition ``c/s.<i>/0``); ``cut``:
    the consistent cut its versions record."""
    import msgspec

    from rayconnect.protocol.effects import CommitTable, RoundMetadata

    files = []
    for key, start in starts.items():
        name = "t_" + key.split("/")[1].removeprefix("s.")
        table = Path(sink.route_table(name).path)
        table.mkdir(parents=True, exist_ok=True)
        values = [b'{"id":%d}' % i for i in range(start, start + n)]
        staged = stage_decoded(table, values, start, FMT, pa.schema([]))
        files += [msgspec.structs.replace(f, shared_by=(key,), table=name) for f in staged]
    return CommitTable(
        epoch=epoch,
        txn_id=txn,
        files=tuple(files),
        expected={k: (v or None) for k, v in starts.items()},
        offsets={k: v + n for k, v in starts.items()},
        metadata=RoundMetadata("p", epoch, txn, False, n * len(starts), cut_lsn=cut),
        starts=dict(starts),
    )


def test_twenty_tables_adopted_and_committed_side_by_side_and_a_failure_keeps_the_rest(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    from rayconnect.tables.base import OffsetMismatchError
    from rayconnect.tables.table_set import TableSet

    routes = rc.Routes((rc.Route("t_{1}", topic_pattern=r"s\.(.*)"),))
    sink = rc.DeltaSink(str(tmp_path / "lake"), routes=routes)
    tables = TableSet(sink, "p", _formats(routes))
    tables.ensure_table()
    epoch = tables.claim_epoch()
    assert tables.committed_offsets() == {}
    keys = {f"c/s.{i:02d}/0": 0 for i in range(20)}
    tables.commit_round(_round(sink, epoch, 1, keys, 5))
    for i in range(20):  # a table's first round: made carrying the epoch and offsets, rows
        first = DeltaTable(sink.route_table(f"t_{i:02d}").path)
        ops = [h["operation"] for h in sorted(first.history(), key=lambda h: h["version"])]
        assert ops == ["CREATE TABLE", "WRITE"] and "id" in first.schema().to_arrow().names
        assert first.transaction_version(f"p/c/s.{i:02d}/0") == 5
    tables.commit_round(_round(sink, epoch, 2, dict.fromkeys(keys, 5), 3))
    status = tables.table_status()
    assert sorted(status) == [f"t_{i:02d}" for i in range(20)]
    for name, table in status.items():
        delta = DeltaTable(sink.route_table(name).path)
        assert table.version == delta.version() and table.rows_since_start == 8
        assert table.offsets == {f"c/s.{name[2:]}/0": 8}
        assert sorted(delta.to_pyarrow_table()["id"].to_pylist()) == list(range(8))
    # a rival commits table t_07 meanwhile: that table refuses, the other 19 land
    rival = open_committer(sink.route_table("t_07"), "p", FMT)
    rival.commit([], {"c/s.07/0": 9}, {"c/s.07/0": 8})
    with pytest.raises(OffsetMismatchError):
        tables.commit_round(_round(sink, epoch, 3, dict.fromkeys(keys, 8), 2))
    after = tables.table_status()
    assert after["t_07"].offsets == {"c/s.07/0": 8}  # as this set last knew it
    assert [n for n, t in after.items() if t.rows_since_start == 10] == [
        n for n in after if n != "t_07"
    ]
    # read again: each table's own offsets, the partition of t_07 where the rival left it
    restart = TableSet(sink, "p", _formats(routes)).committed_offsets()
    assert restart == {k: 9 if k == "c/s.07/0" else 10 for k in keys}


def test_the_committed_cut_of_a_routed_sink_is_the_highest_of_its_tables(
    tmp_path: Path,
) -> None:
    """The tables of a round commit one after another: a table the last round did not
    touch holds an older cut, and the sink's last cut is the newest of them."""
    from rayconnect.tables.table_set import TableSet

    routes = rc.Routes((rc.Route("t_{1}", topic_pattern=r"s\.(.*)"),))
    sink = rc.DeltaSink(str(tmp_path / "lake"), routes=routes)
    tables = TableSet(sink, "p", _formats(routes))
    tables.ensure_table()
    epoch = tables.claim_epoch()
    assert tables.committed_cut() is None
    tables.commit_round(_round(sink, epoch, 1, {"c/s.a/0": 0, "c/s.b/0": 0}, 2, cut=100))
    tables.commit_round(_round(sink, epoch, 2, {"c/s.a/0": 2}, 2, cut=300))  # t_b untouched
    restarted = TableSet(sink, "p", _formats(routes))
    restarted.claim_epoch()
    assert restarted.committed_cut() == 300
