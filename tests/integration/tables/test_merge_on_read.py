"""Merge-on-read upserts on real tables, through the committer's one round-commit path:
random change histories (inserts, updates, deletes, re-inserts, keys moving between table
partitions, truncates of a Kafka partition and of the whole table, updates that do not
carry a value - Postgres's unchanged TOAST, kept from the round or the table) over several rounds,
the table against a plain dict after every round - read by every reader the docs name -
and each round's offsets in its one version. The same histories for both table kinds."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from iceberg_reads import duckdb_query, load_table
from table_files_duckdb import duckdb_delta_rows

import rayconnect as rc
from rayconnect.formats.settings import RecordFormat
from rayconnect.protocol.upkeep import FoldDeletes
from rayconnect.storage.location import TableLocation
from rayconnect.tables.base import TableCommitter
from rayconnect.tables.factory import open_committer, open_upkeep
from rayconnect.tables.files import STAGING_DIR, describe_file
from rayconnect.write_modes.fold import DELETE_COLUMN, PARTITION_TRUNCATE_COLUMN, TRUNCATE_COLUMN
from rayconnect.write_modes.modes import MergeOnRead
from rayconnect.write_modes.unchanged import UNCHANGED_PREFIX

pytestmark = [pytest.mark.timeout(180)]
PARTITIONS = 4
KEYS = 3_000
Model = dict[int, tuple[str, str]]
#: the mark of a change that does not carry ``v`` (``write_modes.unchanged``)
UNCHANGED_V = UNCHANGED_PREFIX + "v"


def fmt(partition_by: tuple[str, ...] = ()) -> RecordFormat:
    return RecordFormat(
        value_format="json",
        value_schema={"id": "long", "v": "string", "region": "string"},
        upsert_keys=("id",),
        partition_by=partition_by,
    )


class History:
    """A random change stream: each key lives in Kafka partition ``id % PARTITIONS``,
    offsets ascend per partition, a key's region may change (it moves between table
    partitions), truncates now and then."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.next_offset = [0] * PARTITIONS
        self.model: Model = {}
        self.round = 0

    def changes(self, n: int, truncate: str | None = None) -> pa.Table:
        """``n`` changes; ``truncate``: 'table' or 'partition' (of partition 1) somewhere in
        the middle of the round."""
        self.round += 1
        rows: list[dict] = []
        at = n // 2 if truncate else -1
        for i in range(n):
            if i == at:
                rows.extend(self._truncate(truncate))
            key = int(self.rng.integers(0, KEYS))
            delete = bool(self.rng.random() < 0.25)
            region = ("eu", "us", "ap")[int(self.rng.integers(0, 3))]
            # an update that does not carry ``v`` (Postgres's unchanged TOAST): only of a
            # key the table holds, as Postgres updates only a row that exists
            unchanged = not delete and key in self.model and bool(self.rng.random() < 0.3)
            rows.append(self._change(key, delete, f"r{self.round}-{i}", region, unchanged))
        return self._table(rows)

    def _change(self, key: int, delete: bool, v: str, region: str, unchanged: bool) -> dict:
        p = key % PARTITIONS
        row = {
            "_kafka_partition": p,
            "_kafka_offset": self._offset(p),
            "id": key,
            "v": None if delete or unchanged else v,
            "region": None if delete else region,
            DELETE_COLUMN: delete,
            TRUNCATE_COLUMN: False,
            PARTITION_TRUNCATE_COLUMN: False,
            UNCHANGED_V: unchanged,
        }
        if delete:
            self.model.pop(key, None)
        else:
            self.model[key] = (self.model[key][0] if unchanged else v, region)
        return row

    def _truncate(self, kind: str | None) -> list[dict]:
        """A whole-table truncate (in every partition, as its one event in partition 0) or
        partition 1's."""
        if kind == "table":
            self.model.clear()
            marks = [(0, TRUNCATE_COLUMN)]
        else:
            self.model = {k: v for k, v in self.model.items() if k % PARTITIONS != 1}
            marks = [(1, PARTITION_TRUNCATE_COLUMN)]
        out = []
        for p, column in marks:
            out.append(
                {
                    "_kafka_partition": p,
                    "_kafka_offset": self._offset(p),
                    "id": None,
                    "v": None,
                    "region": None,
                    DELETE_COLUMN: False,
                    TRUNCATE_COLUMN: column == TRUNCATE_COLUMN,
                    PARTITION_TRUNCATE_COLUMN: column == PARTITION_TRUNCATE_COLUMN,
                    UNCHANGED_V: None,
                }
            )
        return out

    def _offset(self, p: int) -> int:
        self.next_offset[p] += 1
        return self.next_offset[p] - 1

    @staticmethod
    def _table(rows: list[dict]) -> pa.Table:
        n = len(rows)
        # timestamps follow the stream (a whole-table truncate orders other partitions by it)
        stamps = pa.array(np.arange(n, dtype=np.int64) * 1000, pa.timestamp("us", tz="UTC"))
        return pa.table(
            {
                "_kafka_cluster": pa.array(["c"] * n),
                "_kafka_topic": pa.array(["t"] * n),
                "_kafka_partition": pa.array([r["_kafka_partition"] for r in rows], pa.int32()),
                "_kafka_offset": pa.array([r["_kafka_offset"] for r in rows], pa.int64()),
                "_kafka_timestamp": stamps,
                "id": pa.array([r["id"] for r in rows], pa.int64()),
                "v": pa.array([r["v"] for r in rows], pa.string()),
                "region": pa.array([r["region"] for r in rows], pa.string()),
                DELETE_COLUMN: pa.array([r[DELETE_COLUMN] for r in rows]),
                TRUNCATE_COLUMN: pa.array([r[TRUNCATE_COLUMN] for r in rows]),
                PARTITION_TRUNCATE_COLUMN: pa.array([r[PARTITION_TRUNCATE_COLUMN] for r in rows]),
                UNCHANGED_V: pa.array([r[UNCHANGED_V] for r in rows], pa.bool_()),
            }
        )

    def offsets(self) -> dict[str, int]:
        return {f"c/t/{p}": o for p, o in enumerate(self.next_offset)}


def stage(c: TableCommitter, changes: pa.Table) -> list:
    """The round's change file, staged as the writers stage it."""
    rel = f"{STAGING_DIR}/{uuid.uuid4().hex}.parquet"
    location: TableLocation = c.location
    c.filesystem.create_dir(location.path(STAGING_DIR), recursive=True)
    pq.write_table(changes, location.path(rel), filesystem=c.filesystem)
    return [describe_file(location, rel, c.filesystem)[0]]


def as_model(rows: pa.Table) -> Model:
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    return dict(
        zip(
            ids,
            zip(rows.column("v").to_pylist(), rows.column("region").to_pylist(), strict=True),
            strict=True,
        )
    )


#: (partition_by, key_index_rows): with the key index (the default) and without it
LAYOUTS = [((), 100_000_000), (("region",), 100_000_000), ((), 0)]
LAYOUT_IDS = ["unpartitioned", "by-region", "no-key-index"]


def iceberg_sink(
    tmp_path: Path, partition_by: tuple[str, ...] = (), key_index_rows: int = 100_000_000
) -> rc.IcebergSink:
    return rc.IcebergSink(
        "db.mor",
        warehouse=str(tmp_path / "warehouse"),
        write_mode="upsert",
        key_columns=("id",),
        partition_by=partition_by,
        upsert_mode="merge_on_read",
        fold_deletes=FoldDeletes(min_deleted_fraction=0.05),
        key_index_rows=key_index_rows,
    )


def iceberg_reads(sink: rc.IcebergSink) -> Reads:
    def pyiceberg() -> Model:
        return as_model(load_table(sink).scan(selected_fields=("id", "v", "region")).to_arrow())

    def duckdb() -> Model:
        rows = duckdb_query(sink, "SELECT id, v, region FROM TABLE")
        return {r[0]: (r[1], r[2]) for r in rows} if len({r[0] for r in rows}) == len(rows) else {}

    return {"pyiceberg": pyiceberg, "duckdb iceberg_scan": duckdb}


def delta_sink(
    tmp_path: Path, partition_by: tuple[str, ...] = (), key_index_rows: int = 100_000_000
) -> rc.DeltaSink:
    return rc.DeltaSink(
        str(tmp_path / "delta"),
        write_mode="upsert",
        key_columns=("id",),
        partition_by=partition_by,
        upsert_mode="merge_on_read",
        key_index_rows=key_index_rows,
    )


def delta_reads(path: str) -> Reads:
    def query_builder() -> Model:
        from deltalake import DeltaTable, QueryBuilder

        q = QueryBuilder().register("t", DeltaTable(path))
        return as_model(pa.table(q.execute("SELECT id, v, region FROM t").read_all()))

    def polars() -> Model:
        import polars as pl

        return as_model(pl.read_delta(path).select("id", "v", "region").to_arrow())

    def duckdb() -> Model:
        rows = duckdb_delta_rows(path, "SELECT id, v, region FROM TABLE")
        assert len({r[0] for r in rows}) == len(rows), "a key is in the table twice"
        return {r[0]: (r[1], r[2]) for r in rows}

    return {"delta-rs QueryBuilder": query_builder, "polars": polars, "duckdb delta_scan": duckdb}


#: rounds of 1,500 changes, truncates and upkeep's folding of deletes between them
PLAN = [None, None, "partition", "fold", None, None, "table", None, "fold", None]
Reads = dict[str, Callable[[], Model]]


def run_history(
    sink: rc.DeltaSink | rc.IcebergSink,
    partition_by: tuple[str, ...],
    reads: Reads,
    seed: int,
    after_round: Callable[[TableCommitter, str | None, int], None],
    fold: Callable[[], None],
) -> TableCommitter:
    """``PLAN`` through the committer; after each round (``after_round(committer,
    truncate, version before)``) and each fold, every reader equals the model. Returns the
    committer."""
    c = open_committer(sink, "p", fmt(partition_by))
    c.ensure_table()
    history = History(seed)
    expected: dict[str, int | None] = {f"c/t/{p}": None for p in range(PARTITIONS)}
    for step in PLAN:
        if step == "fold":
            fold()
            for reader, read in reads.items():
                assert read() == history.model, f"{reader} after folding deletes"
            continue
        before = c.version()
        files = stage(c, history.changes(1_500, step))
        offsets = history.offsets()
        c.commit(files, offsets, expected)
        expected = dict(offsets)
        assert c.committed_offsets() == offsets
        after_round(c, step, before)
        for reader, read in reads.items():
            assert read() == history.model, f"{reader} after round {history.round}"
    return c


def uses_key_index(c: TableCommitter) -> bool:
    mode = c.apply
    assert isinstance(mode, MergeOnRead)
    return mode.index.usable and mode.index.rows > 0


@pytest.mark.parametrize(("partition_by", "key_index_rows"), LAYOUTS, ids=LAYOUT_IDS)
def test_delta_merge_on_read_histories_equal_the_model_after_every_round(
    tmp_path: Path, partition_by: tuple[str, ...], key_index_rows: int
) -> None:
    sink = delta_sink(tmp_path, partition_by, key_index_rows)
    upkeep = open_upkeep(sink, "p", fmt(partition_by))

    def with_dvs() -> bool:
        return any(f.entry.get("deletionVector") for f in live_delta_files(sink))

    rounds = [0]

    def after_round(c: TableCommitter, truncate: str | None, before: int) -> None:
        assert c.version() == before + 1  # one version: rows, deletion vectors, offsets
        rounds[0] += 1
        if truncate is None and rounds[0] > 1:  # the replaced rows: deleted in place
            assert with_dvs()

    def fold() -> None:  # delta-rs's compaction applies the deletion vectors
        upkeep.compact()
        assert not with_dvs()

    c = run_history(sink, partition_by, delta_reads(sink.path), 11, after_round, fold)
    assert uses_key_index(c) == bool(key_index_rows)


@pytest.mark.parametrize(("partition_by", "key_index_rows"), LAYOUTS, ids=LAYOUT_IDS)
def test_iceberg_merge_on_read_histories_equal_the_model_after_every_round(
    tmp_path: Path, partition_by: tuple[str, ...], key_index_rows: int
) -> None:
    sink = iceberg_sink(tmp_path, partition_by, key_index_rows)
    upkeep = open_upkeep(sink, "p", fmt(partition_by))
    seen: list[set[str]] = [set()]

    def after_round(c: TableCommitter, truncate: str | None, before: int) -> None:
        now = data_files(sink)
        summary = load_table(sink).current_snapshot().summary
        if truncate == "table":
            assert now.isdisjoint(seen[0])  # dropped whole, nothing read
        else:  # merge-on-read: no live file rewritten, the replaced rows deleted by position
            assert seen[0] <= now
            assert not seen[0] or int(summary["added-position-deletes"] or 0) > 0
        seen[0] = now

    def fold() -> None:
        deletes = delete_files(sink)
        done = upkeep.compact()
        assert done["files_rewritten"] > 0 and done["delete_files_dropped"] > 0, done
        assert len(delete_files(sink)) < len(deletes)
        seen[0] = data_files(sink)

    c = run_history(sink, partition_by, iceberg_reads(sink), 7, after_round, fold)
    assert uses_key_index(c) == bool(key_index_rows)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_copy_on_write_histories_equal_the_model_too(tmp_path: Path, kind: str) -> None:
    """The same histories copy-on-write: the fold and the values a change does not carry
    (read from the table by a key search) are the write modes' shared part."""
    sink: rc.DeltaSink | rc.IcebergSink
    if kind == "delta":
        sink = rc.DeltaSink(str(tmp_path / "delta"), write_mode="upsert", key_columns=("id",))
        reads = delta_reads(sink.path)
    else:
        sink = rc.IcebergSink(
            "db.cow",
            warehouse=str(tmp_path / "warehouse"),
            write_mode="upsert",
            key_columns=("id",),
            upsert_mode="copy_on_write",
        )
        reads = iceberg_reads(sink)
    c = run_history(sink, (), reads, 5, lambda c, truncate, before: None, lambda: None)
    assert not isinstance(c.apply, MergeOnRead)


def live_delta_files(sink: rc.DeltaSink) -> list:
    c = open_committer(sink, "reader", fmt())
    return list(c.live_files(DeltaTable(sink.path)))


def data_files(sink: rc.IcebergSink) -> set[str]:
    return set(load_table(sink).inspect.data_files()["file_path"].to_pylist())


def delete_files(sink: rc.IcebergSink) -> set[str]:
    return set(load_table(sink).inspect.delete_files()["file_path"].to_pylist())


def test_folding_deletes_planned_before_a_round_fails_and_retries_after_it(
    tmp_path: Path,
) -> None:
    """A round that landed after the fold read the table may have deleted rows of a file
    the fold rewrites: the fold's commit fails (the catalog swaps only on the snapshot it
    read), nothing lost; run again on a fresh read, it lands."""
    from pyiceberg.exceptions import CommitFailedException

    from rayconnect.tables.iceberg_compaction import fold_deletes

    sink = iceberg_sink(tmp_path)
    c = open_committer(sink, "p", fmt())
    c.ensure_table()
    history = History(seed=5)
    expected: dict[str, int | None] = {f"c/t/{p}": None for p in range(PARTITIONS)}
    for _ in range(3):
        c.commit(stage(c, history.changes(1_500)), history.offsets(), expected)
        expected = dict(history.offsets())
    stale = load_table(sink)  # the fold reads here ...
    c.commit(stage(c, history.changes(1_500)), history.offsets(), expected)  # ... a round lands
    with pytest.raises(CommitFailedException):
        fold_deletes(stale, 100, 0.01, {})
    for read in iceberg_reads(sink).values():
        assert read() == history.model
    done = open_upkeep(sink, "p", fmt()).compact()
    assert done["files_rewritten"] > 0
    for read in iceberg_reads(sink).values():
        assert read() == history.model
