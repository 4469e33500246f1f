"""Merge-on-read rounds committed to real Delta tables as deletion vectors
(``tables.delta_row_delta``), read back by every reader here - delta-rs's DataFusion scan,
Polars and DuckDB (delta-kernel) - row for row: deleted rows gone, older deletes kept,
dropped files gone, new rows there; and the table stays a table delta-rs works on
(checkpoint, compaction, vacuum, its own appends, txn versions)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, Transaction
from table_files_duckdb import duckdb_delta_rows

from rayconnect.formats import partitioning
from rayconnect.storage.location import TableLocation
from rayconnect.tables import delta_row_delta as rd
from rayconnect.tables.base import CommitConflictError
from rayconnect.tables.delta_dv import Descriptor
from rayconnect.tables.files import delta_stats_json, describe_file
from rayconnect.write_modes.changes import RowDelta
from rayconnect.write_modes.row_delta import ColumnReader, FileDeletes, LiveFile

pytestmark = [pytest.mark.timeout(120)]

FILES = 4
PER_FILE = 25
APP = "pipe/c/t/0"
Row = tuple[int, str, str]


def _batch(ids: range | list[int], tag: str = "v") -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": pa.array([f"{tag}{i}" for i in ids]),
            "p": pa.array(["a" if i % 2 else "b" for i in ids]),
        }
    )


class Table:
    """A Delta table with DVs enabled, and the rows it must hold (``expected``)."""

    def __init__(self, path: Path, partition_by: list[str]) -> None:
        self.path = str(path)
        self.partition_by = partition_by
        for f in range(FILES):
            rows = _batch(range(f * PER_FILE, (f + 1) * PER_FILE))
            write_deltalake(self.path, rows, mode="append", partition_by=partition_by or None)
        self.dt = DeltaTable(self.path)
        rd.enable_deletion_vectors(self.dt)
        self.location = TableLocation.parse(self.path)
        self.fs = self.location.filesystem()
        self.expected: set[Row] = {
            (i, f"v{i}", "a" if i % 2 else "b") for i in range(FILES * PER_FILE)
        }

    @property
    def schema(self) -> pa.Schema:
        return pa.schema(self.dt.schema().to_arrow())

    def live(self) -> list[LiveFile]:
        self.dt.update_incremental()
        return rd.live_files(self.dt, self.location, self.fs)

    def ids(self, live: LiveFile) -> list[int]:
        return ColumnReader(self.fs)(live, ["id"]).column("id").to_pylist()

    def deleting(self, live: LiveFile, ids: set[int]) -> FileDeletes:
        """The positions of ``ids`` in a file (the search's job in a round), and forget
        those rows."""
        in_file = self.ids(live)
        positions = [pos for pos, i in enumerate(in_file) if i in ids]
        self.expected -= {r for r in self.expected if r[0] in ids and r[0] in in_file}
        return FileDeletes(live, np.array(positions, dtype=np.uint64))

    def commit(
        self,
        deletes: tuple[FileDeletes, ...] = (),
        rows: pa.Table | None = None,
        drop: tuple[LiveFile, ...] = (),
        offset: int = 1,
    ) -> int:
        self.dt.update_incremental()
        for live in drop:
            dropped = set(self.ids(live))
            self.expected -= {r for r in self.expected if r[0] in dropped}
        if rows is not None:
            self.expected |= set(_rows(rows))
        changes = RowDelta(rows=rows, deletes=deletes, drop=drop)
        version = rd.commit_row_delta(
            self.dt,
            self.location,
            self.fs,
            changes,
            [(APP, offset)],
            {"rayconnect.commitId": f"round-{offset}"},
            self.partition_by,
            self.schema,
        )
        self.dt.update_incremental()
        assert self.dt.version() == version
        return version

    def check_reads(self) -> None:
        """Every reader returns exactly ``expected``."""
        fresh = DeltaTable(self.path)
        got = QueryBuilder().register("t", fresh).execute("select id, v, p from t").read_all()
        assert sorted(_rows(pa.table(got))) == sorted(self.expected), "delta-rs QueryBuilder"
        import polars as pl

        polars_rows = pl.read_delta(self.path).select(["id", "v", "p"]).rows()
        assert sorted(polars_rows) == sorted(self.expected), "polars read_delta"
        duck = duckdb_delta_rows(self.path, "select id, v, p from TABLE")
        assert sorted(duck) == sorted(self.expected), "duckdb delta_scan"


def _rows(table: pa.Table) -> list[Row]:
    return list(zip(*(table.column(c).to_pylist() for c in ("id", "v", "p")), strict=True))


@pytest.fixture(params=[[], ["p"]], ids=["unpartitioned", "partitioned"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Table:
    return Table(tmp_path / "t", request.param)


def _file_with(live: list[LiveFile], key: int) -> LiveFile:
    return next(
        f for f in live if f.bounds["id"][0] <= key <= f.bounds["id"][1] and key in _ids_of(f)
    )


def _ids_of(f: LiveFile) -> set[int]:
    return set(pq.read_table(f.path, columns=["id"]).column("id").to_pylist())


def _dvs(t: Table) -> dict[str, dict]:
    return {
        f.entry["path"]: f.entry["deletionVector"] for f in t.live() if "deletionVector" in f.entry
    }


def test_round_deletes_and_appends_exactly(table: Table) -> None:
    live = table.live()
    assert len(live) == FILES * (2 if table.partition_by else 1)
    assert all(f.rows == sum(1 for _ in table.ids(f)) for f in live)
    first, second = _file_with(live, 0), _file_with(live, 31)
    deletes = (table.deleting(first, {0, 2, 4, 7}), table.deleting(second, {31, 33}))
    table.commit(deletes, _batch([0, 2, 500, 501], tag="new"))
    table.check_reads()
    dvs = _dvs(table)
    assert sorted(dvs) == sorted({first.entry["path"], second.entry["path"]})
    for f in table.live():
        if f.entry["path"] in dvs:
            assert f.rows == len(table.ids(f)), "numRecords stays the physical count"
            descriptor = Descriptor.from_json(dvs[f.entry["path"]])
            assert descriptor.storage_type == "u"
            assert descriptor.absolute_path(table.path).startswith(f"{table.path}/{rd.DV_DIR}/")
        if table.partition_by and "new" in str(f.entry["stats"]):
            value = f.entry["partitionValues"]["p"]
            assert f.entry["path"].startswith(f"p={value}/")
    # delta-rs's own view of the masks agrees
    masks = pa.table(DeltaTable(table.path).deletion_vectors())
    assert masks.num_rows == 2


def test_second_round_keeps_the_first_rounds_deletes(table: Table) -> None:
    live = table.live()
    first = _file_with(live, 1 if table.partition_by else 0)
    table.commit((table.deleting(first, set(list(_ids_of(first))[:3])),), offset=1)
    table.check_reads()
    again = next(f for f in table.live() if f.entry["path"] == first.entry["path"])
    old_dv = again.entry["deletionVector"]
    more = set(sorted(_ids_of(again))[5:8])
    version = table.commit((table.deleting(again, more),), offset=2)
    table.check_reads()
    new_dv = _dvs(table)[first.entry["path"]]
    assert new_dv["cardinality"] == old_dv["cardinality"] + 3
    log = Path(table.path, "_delta_log", f"{version:020d}.json").read_text()
    assert Descriptor.from_json(old_dv).path_or_inline_dv in log, "the remove names the old DV"
    # a round that deletes only rows already deleted changes no file
    table.commit((table.deleting(_file_with(table.live(), min(more)), more),), offset=3)
    assert _dvs(table)[first.entry["path"]] == new_dv
    table.check_reads()


def test_drop_files_and_files_left_empty(table: Table) -> None:
    live = table.live()
    dropped, emptied = live[0], live[1]
    # a DV'd file dropped whole: its remove ends the logical file with the DV
    table.commit((table.deleting(dropped, {min(_ids_of(dropped))}),), offset=1)
    dropped = next(f for f in table.live() if f.entry["path"] == dropped.entry["path"])
    table.commit(
        (table.deleting(emptied, _ids_of(emptied)),), _batch([900]), drop=(dropped,), offset=2
    )
    paths = {f.entry["path"] for f in table.live()}
    assert dropped.entry["path"] not in paths
    assert emptied.entry["path"] not in paths, "a file with every row deleted is removed"
    table.check_reads()


def test_checkpoint_keeps_dvs_and_reads(table: Table) -> None:
    live = table.live()
    table.commit((table.deleting(_file_with(live, 10), {10, 12}),), _batch([700]), offset=1)
    before = _dvs(table)
    table.dt.create_checkpoint()
    assert any(n.endswith(".checkpoint.parquet") for n in os.listdir(f"{table.path}/_delta_log"))
    assert _dvs(table) == before, "live_files reads the DVs from the checkpoint"
    table.check_reads()
    # a round on top of the checkpoint: the DV read from the checkpoint's descriptor is kept
    again = next(f for f in table.live() if f.entry["path"] in before)
    table.commit((table.deleting(again, {max(_ids_of(again))}),), offset=2)
    table.check_reads()
    assert DeltaTable(table.path).transaction_version(APP) == 2


def test_compaction_applies_dvs(table: Table) -> None:
    live = table.live()
    table.commit((table.deleting(_file_with(live, 20), {20, 21, 22}),), _batch([800]), offset=1)
    metrics = table.dt.optimize.compact()
    assert metrics["numFilesRemoved"] > 0
    table.dt.update_incremental()
    assert _dvs(table) == {}, "compaction rewrites the DV'd files without their deleted rows"
    assert sum(f.rows for f in table.live()) == len(table.expected)
    table.check_reads()


def test_compaction_from_before_a_round_conflicts(table: Table) -> None:
    """A compaction that read the files before a round's DVs would write their deleted
    rows back; delta-rs's conflict check sees the round's removes and refuses it."""
    stale = DeltaTable(table.path)
    table.commit((table.deleting(_file_with(table.live(), 60), {60}),), offset=1)
    with pytest.raises(CommitFailedError, match="concurrent transaction deleted data"):
        stale.optimize.compact()
    table.check_reads()


def test_vacuum_keeps_dv_files_in_use(table: Table) -> None:
    live = table.live()
    table.commit((table.deleting(_file_with(live, 40), {40}),), offset=1)
    (dv_path,) = {Descriptor.from_json(dv).absolute_path(table.path) for dv in _dvs(table).values()}
    listed = table.dt.vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=True, full=True
    )
    assert not any(p.endswith(os.path.basename(dv_path)) for p in listed)
    assert rd.vacuum_dv_files(table.dt, table.location, table.fs, 0) == []
    # a second round replaces the DV: the first file is unused from then on
    again = next(f for f in table.live() if "deletionVector" in f.entry)
    table.commit((table.deleting(again, {max(_ids_of(again))}),), offset=2)
    stale = rd.vacuum_dv_files(table.dt, table.location, table.fs, 0, dry_run=False)
    assert stale == [f"{rd.DV_DIR}/{os.path.basename(dv_path)}"]
    assert not os.path.exists(dv_path)
    table.check_reads()


def test_commit_racing_another_conflicts(table: Table) -> None:
    live = table.live()
    stale = DeltaTable(table.path)
    taken = Path(table.path, "_delta_log", f"{stale.version() + 1:020d}.json")
    taken.write_text('{"commitInfo":{"operation":"WRITE"}}\n')
    changes = RowDelta(
        rows=_batch([1000]), deletes=(FileDeletes(live[0], np.array([0], np.uint64)),)
    )
    args = (table.location, table.fs, changes, [(APP, 9)], {}, table.partition_by, table.schema)
    with pytest.raises(CommitConflictError):
        rd.commit_row_delta(stale, *args)
    taken.unlink()
    # the version file appearing between the check and the link
    real_link = os.link

    def racing_link(src: str, dst: str) -> None:
        Path(dst).write_text('{"commitInfo":{"operation":"WRITE"}}\n')
        real_link(src, dst)

    os.link = racing_link  # type: ignore[assignment]
    try:
        with pytest.raises(CommitConflictError):
            rd.commit_row_delta(stale, *args)
    finally:
        os.link = real_link
    assert not [n for n in os.listdir(f"{table.path}/_delta_log") if n.endswith(".tmp")]


def test_txns_and_delta_rs_appends_on_top(table: Table) -> None:
    live = table.live()
    seen = DeltaTable(table.path)
    version = table.commit((table.deleting(_file_with(live, 50), {50, 51}),), offset=7)
    seen.update_incremental()
    assert seen.version() == version
    assert seen.transaction_version(APP) == 7
    assert DeltaTable(table.path).transaction_version(APP) == 7
    before = _dvs(table)
    # delta-rs's own appends on top: write_deltalake, and create_write_transaction (how an
    # append round commits) with a txn
    rows = _batch([2000, 2001])
    write_deltalake(table.path, rows, mode="append", partition_by=table.partition_by or None)
    table.expected |= set(_rows(rows))
    rows = _batch([3000])
    folder = "p=b/" if table.partition_by else ""
    rel = f"{folder}staged-3000.parquet"
    pq.write_table(rows.drop_columns(table.partition_by), f"{table.path}/{rel}")
    data_file, _ = describe_file(table.location, rel)
    table.expected |= set(_rows(rows))
    table.dt.update_incremental()
    add = AddAction(
        path=rel,
        size=data_file.size,
        partition_values=partitioning.values_of(rel),
        modification_time=data_file.modification_time_ms,
        data_change=True,
        stats=delta_stats_json(data_file),
    )
    table.dt.create_write_transaction(
        [add],
        "append",
        table.schema,
        partition_by=table.partition_by or None,
        commit_properties=CommitProperties(app_transactions=[Transaction(APP, 8)]),
    )
    assert _dvs(table) == before, "delta-rs's commits keep the DVs"
    assert DeltaTable(table.path).transaction_version(APP) == 8
    table.check_reads()


def test_read_columns_fills_partition_columns(tmp_path: Path) -> None:
    t = Table(tmp_path / "t", ["p"])
    f = t.live()[0]
    got = ColumnReader(t.fs, {"p": t.schema.field("p").type})(f, ["p", "id"])
    assert got.column_names == ["p", "id"]
    assert got.num_rows == f.rows
    assert pc.unique(got.column("p")).to_pylist() == [f.entry["partitionValues"]["p"]]
    assert got.schema.field("p").type == t.schema.field("p").type
