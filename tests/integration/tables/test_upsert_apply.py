"""An upsert round applied to real tables - Delta through delta-rs's MERGE, Iceberg through
pyiceberg's copy-on-write DELETE + APPEND - from random change streams: the table equals
the stream's final state (checked against a dict), the offsets land in the same commit, and
a MERGE built on a version a rival commit moved past fails instead of landing twice."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet  # noqa: F401 - pa.parquet
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from rayconnect.write_modes.delta_merge import merge_round
from rayconnect.write_modes.fold import (
    DELETE_COLUMN,
    PARTITION_TRUNCATE_COLUMN,
    TRUNCATE_COLUMN,
    Folded,
    fold,
)
from rayconnect.write_modes.iceberg_upsert import upsert_round

pytestmark = [pytest.mark.timeout(120)]
KEYS = 2_000


def _initial() -> pa.Table:
    ids = np.arange(KEYS // 2)
    return pa.table(
        {
            "_kafka_partition": pa.array(ids % 4, pa.int32()),
            "_kafka_offset": pa.array(ids, pa.int64()),
            "id": pa.array(ids, pa.int64()),
            "v": pa.array([f"v{i}" for i in ids]),
        }
    )


def _rounds(seed: int, rounds: int = 4, per_round: int = 1_500) -> list[pa.Table]:
    """Rounds of changes over KEYS keys: 70% updates/inserts, 30% deletes, keys repeating
    within a round; a key's partition is key % 4 and offsets ascend per partition."""
    rng = np.random.default_rng(seed)
    offset = KEYS
    out = []
    for r in range(rounds):
        ids = rng.integers(0, KEYS, per_round)
        out.append(
            pa.table(
                {
                    "_kafka_partition": pa.array(ids % 4, pa.int32()),
                    "_kafka_offset": pa.array(np.arange(offset, offset + per_round), pa.int64()),
                    "id": pa.array(ids, pa.int64()),
                    "v": pa.array([f"r{r}-{i}" for i in range(per_round)]),
                    DELETE_COLUMN: pa.array(rng.random(per_round) < 0.3),
                }
            )
        )
        offset += per_round
    return out


def _expected(rounds: list[pa.Table]) -> dict[int, str]:
    state = _as_dict(_initial())
    for changes in rounds:
        for row in changes.to_pylist():  # offsets ascend overall: stream order is offset order
            if row[DELETE_COLUMN]:
                state.pop(row["id"], None)
            else:
                state[row["id"]] = row["v"]
    return state


def _as_dict(table: pa.Table) -> dict[int, str]:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    return dict(zip(ids, table.column("v").to_pylist(), strict=True))


def test_delta_rounds_merge_to_the_streams_final_state_with_offsets_in_each_version(
    tmp_path: Path,
):
    path = str(tmp_path / "t")
    write_deltalake(path, _initial())
    rounds = _rounds(seed=1)
    for n, changes in enumerate(rounds, start=1):
        txns = [Transaction("p/0", n)]
        merge_round(
            DeltaTable(path), fold(changes, ["id"]), ["id"], CommitProperties(app_transactions=txns)
        )
        assert DeltaTable(path).version() == n  # one version per round
        assert DeltaTable(path).transaction_version("p/0") == n
    assert _as_dict(DeltaTable(path).to_pyarrow_table()) == _expected(rounds)


def test_delta_merge_on_a_stale_version_fails_and_leaves_the_rivals_round(tmp_path: Path):
    path = str(tmp_path / "t")
    write_deltalake(path, _initial())
    changes = _rounds(seed=2, rounds=1)
    stale = DeltaTable(path)  # a zombie coordinator read the table here
    merge_round(
        DeltaTable(path),
        fold(changes[0], ["id"]),
        ["id"],
        CommitProperties(app_transactions=[Transaction("p/0", 7)]),
    )
    with pytest.raises(CommitFailedError):
        merge_round(
            stale,
            fold(changes[0], ["id"]),
            ["id"],
            CommitProperties(app_transactions=[Transaction("p/0", 7)]),
        )
    assert DeltaTable(path).version() == 1
    assert _as_dict(DeltaTable(path).to_pyarrow_table()) == _expected(changes)


def test_iceberg_rounds_upsert_to_the_streams_final_state_in_one_commit_each(tmp_path: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", _initial().schema, properties={"format-version": "2"})
    table.append(_initial())
    rounds = _rounds(seed=3)
    for n, changes in enumerate(rounds, start=1):
        table = catalog.load_table("db.t")
        with table.transaction() as tx:
            upsert_round(tx, fold(changes, ["id"]), ["id"], {"rayconnect.round": str(n)})
        current = catalog.load_table("db.t").current_snapshot()
        assert current.summary.additional_properties["rayconnect.round"] == str(n)
    assert _as_dict(catalog.load_table("db.t").scan().to_arrow()) == _expected(rounds)


# -- a truncate in a round: the table's rows and the round's changes before it go -------


def _truncating_round() -> pa.Table:
    """A round whose partition 0 truncates the table mid-way: changes before it (partition
    0 by offset, partition 1 by timestamp) are gone, those after it are the table."""
    rows = [  # (partition, offset, id, v, delete, timestamp ms, truncate)
        (0, 10, 1, "gone", False, 100, False),
        (1, 10, 2, "gone", False, 150, False),
        (0, 11, None, None, False, 200, True),
        (1, 11, 3, "kept", False, 250, False),
        (0, 12, 1, "kept", False, 300, False),
        (0, 13, 5, None, True, 300, False),  # deletes a key of the table before it: a no-op
    ]
    names = ["_kafka_partition", "_kafka_offset", "id", "v", DELETE_COLUMN]
    types = [pa.int32(), pa.int64(), pa.int64(), pa.string(), pa.bool_()]
    table = pa.table({n: pa.array([r[i] for r in rows], t) for i, (n, t) in
                      enumerate(zip(names, types, strict=True))})  # fmt: skip
    return table.append_column(
        "_kafka_timestamp", pa.array([r[5] for r in rows], pa.timestamp("ms"))
    ).append_column(TRUNCATE_COLUMN, pa.array([r[6] for r in rows]))


def _folded_truncating_round() -> Folded:
    """The round folded, its rows in the table's columns (as the committers conform them)."""
    folded = fold(_truncating_round(), ["id"])
    assert folded.truncated
    return replace(folded, rows=folded.rows.select(_initial().column_names))


def test_delta_truncating_round_is_one_version_removing_every_file(tmp_path: Path):
    path = str(tmp_path / "t")
    write_deltalake(path, _initial())
    write_deltalake(path, _initial().slice(0, 10).set_column(3, "v", pa.array(["x"] * 10)),
                    mode="overwrite")  # fmt: skip
    write_deltalake(path, _initial().slice(10), mode="append")
    before = DeltaTable(path)
    version, old_files = before.version(), set(before.file_uris())
    merge_round(
        before,
        _folded_truncating_round(),
        ["id"],
        CommitProperties(app_transactions=[Transaction("p/0", 9)]),
    )
    after = DeltaTable(path)
    assert after.version() == version + 1 and after.transaction_version("p/0") == 9
    assert not (set(after.file_uris()) & old_files)
    assert _as_dict(after.to_pyarrow_table()) == {1: "kept", 3: "kept"}


def test_iceberg_truncating_round_deletes_everything_and_appends_in_one_commit(tmp_path: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", _initial().schema, properties={"format-version": "2"})
    table.append(_initial())
    table = catalog.load_table("db.t")
    with table.transaction() as tx:
        upsert_round(tx, _folded_truncating_round(), ["id"], {"rayconnect.round": "1"})
    table = catalog.load_table("db.t")
    assert _as_dict(table.scan().to_arrow()) == {1: "kept", 3: "kept"}
    assert table.current_snapshot().summary.additional_properties["rayconnect.round"] == "1"
    deleted = table.snapshots()[-2].summary
    assert deleted["deleted-records"] == str(KEYS // 2)


# -- per-partition truncates: only the rows of the truncate's partition go --------------

#: the rows' cluster id: a quote in it (a cluster id is the user's name; the Delta
#: predicate quotes it as a SQL literal)
CLUSTER = "o'c"
#: (topic, partition, offset, id, v, delete, per-partition truncate) of cluster CLUSTER
Marked = tuple[str, int, int, int | None, str | None, bool, bool]
_MARKED_NAMES = ["_kafka_cluster", "_kafka_topic", "_kafka_partition", "_kafka_offset", "id", "v"]
_MARKED_TYPES = [pa.string(), pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.string()]


def _marked_initial() -> pa.Table:
    """400 rows of topic t (partition id % 4) and 20 of topic u (partition 0)."""
    rows = [("t", i % 4, i, i, f"v{i}") for i in range(400)]
    rows += [("u", 0, i, i, f"v{i}") for i in range(400, 420)]
    return _marked_table([(*r, False, False) for r in rows]).drop_columns(
        [DELETE_COLUMN, PARTITION_TRUNCATE_COLUMN]
    )


def _marked_table(rows: list[Marked]) -> pa.Table:
    columns = {
        name: pa.array([(CLUSTER, *r)[i] for r in rows], t)
        for i, (name, t) in enumerate(zip(_MARKED_NAMES, _MARKED_TYPES, strict=True))
    }
    columns[DELETE_COLUMN] = pa.array([r[5] for r in rows])
    columns[PARTITION_TRUNCATE_COLUMN] = pa.array([r[6] for r in rows])
    return pa.table(columns)


#: rounds read unevenly: partition 0 of t truncates in round 1, partition 1 (behind) in
#: round 2 - a round of only its truncate - and partition 3 in round 3; 2 never does.
#: Round 4 changes no row (the table still gets a version, a commit, with its offsets)
MARKED_ROUNDS: list[list[Marked]] = [
    [
        ("t", 0, 1000, 0, "before", False, False),
        ("t", 0, 1001, None, None, False, True),
        ("t", 0, 1002, 4, "after", False, False),
        ("t", 0, 1003, 8, None, True, False),  # deletes a row the truncate took: a no-op
        ("t", 1, 1000, 1, "p1-not-yet-truncated", False, False),
        ("u", 0, 1000, 400, "u-same-partition-number", False, False),
    ],
    [("t", 1, 1001, None, None, False, True)],
    [
        ("t", 3, 1000, None, None, False, True),
        ("t", 3, 1001, 3, "after", False, False),
        ("t", 2, 1000, 2, None, True, False),
    ],
    # partition 1 truncated again, nothing of it left: the round changes no row
    [("t", 1, 1002, None, None, False, True), ("t", 2, 1001, 998, None, True, False)],
]


def _marked_expected(rounds: int) -> dict[int, str]:
    """The table after the first ``rounds`` of MARKED_ROUNDS, by the rules' definition."""
    state = {i: f"v{i}" for i in range(420)}
    gone = {1: {0}, 2: {0, 1}, 3: {0, 1, 3}, 4: {0, 1, 3}}[rounds]
    state = {i: v for i, v in state.items() if i >= 400 or i % 4 not in gone}
    state |= {4: "after", 400: "u-same-partition-number"}
    if rounds == 1:
        state[1] = "p1-not-yet-truncated"
    if rounds >= 3:
        state.pop(2)
        state[3] = "after"
    return state


def _folded_marked(n: int) -> Folded:
    folded = fold(_marked_table(MARKED_ROUNDS[n]), ["id"])
    assert not folded.truncated and len(folded.truncated_partitions) == 1
    return replace(folded, rows=folded.rows.select(_MARKED_NAMES))


def test_delta_partition_truncates_remove_only_their_partitions_rows_one_version_a_round(
    tmp_path: Path,
):
    path = str(tmp_path / "t")
    initial = _marked_initial()
    for start in range(0, initial.num_rows, 150):  # several files: the truncates span them
        write_deltalake(path, initial.slice(start, 150), mode="append")
    version = DeltaTable(path).version()
    for n in range(len(MARKED_ROUNDS)):
        txns = [Transaction("p/0", n + 1)]
        merge_round(
            DeltaTable(path), _folded_marked(n), ["id"], CommitProperties(app_transactions=txns)
        )
        after = DeltaTable(path)
        assert after.version() == version + n + 1 and after.transaction_version("p/0") == n + 1
        assert _as_dict(after.to_pyarrow_table()) == _marked_expected(n + 1)


def test_iceberg_partition_truncates_remove_only_their_partitions_rows_one_commit_a_round(
    tmp_path: Path,
):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    initial = _marked_initial()
    table = catalog.create_table("db.t", initial.schema, properties={"format-version": "2"})
    for start in range(0, initial.num_rows, 150):
        table.append(initial.slice(start, 150))
    for n in range(len(MARKED_ROUNDS)):
        table = catalog.load_table("db.t")
        with table.transaction() as tx:
            upsert_round(tx, _folded_marked(n), ["id"], {"rayconnect.round": str(n + 1)})
        table = catalog.load_table("db.t")
        summary = table.current_snapshot().summary.additional_properties
        # (round 4 deletes nothing: pyiceberg makes no snapshot of it - the committer's
        # offsets are in a table property, set in the same transaction)
        assert summary["rayconnect.round"] == str(min(n + 1, 3))
        assert _as_dict(table.scan().to_arrow()) == _marked_expected(n + 1)


# -- partitioned tables: keys that move partition, and rounds pruned by partition --------

REGIONS = ("north", "south", "east")


def _with_region(table: pa.Table, seed: int) -> pa.Table:
    """``table`` with a ``region`` column drawn at random per row: an update may move its
    key to another partition."""
    rng = np.random.default_rng(seed)
    region = np.array(REGIONS)[rng.integers(0, len(REGIONS), table.num_rows)]
    return table.append_column("region", pa.array(region))


def _regional_rounds(seed: int) -> list[pa.Table]:
    return [_with_region(r, seed + n) for n, r in enumerate(_rounds(seed))]


def _expected_regions(rounds: list[pa.Table]) -> dict[int, tuple[str, str]]:
    state = {r["id"]: (r["region"], r["v"]) for r in _with_region(_initial(), 0).to_pylist()}
    for changes in rounds:
        for row in changes.to_pylist():
            if row[DELETE_COLUMN]:
                state.pop(row["id"], None)
            else:
                state[row["id"]] = (row["region"], row["v"])
    return state


def _as_regions(table: pa.Table) -> dict[int, tuple[str, str]]:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    rows = zip(table.column("region").to_pylist(), table.column("v").to_pylist(), strict=True)
    return dict(zip(ids, rows, strict=True))


def test_delta_partitioned_upserts_move_keys_between_partitions(tmp_path: Path):
    path = str(tmp_path / "t")
    write_deltalake(path, _with_region(_initial(), 0), partition_by=["region"])
    rounds = _regional_rounds(seed=4)
    moved = 0
    for n, changes in enumerate(rounds, start=1):
        before = _as_regions(DeltaTable(path).to_pyarrow_table())
        folded = fold(changes, ["id"])
        moved += sum(
            r["id"] in before and before[r["id"]][0] != r["region"] for r in folded.rows.to_pylist()
        )
        merge_round(
            DeltaTable(path),
            folded,
            ["id"],
            CommitProperties(app_transactions=[Transaction("p/0", n)]),
        )
    assert moved > 500  # the rounds did move keys
    # a row's region is read from its file's partition values: every row is in its own
    # region's files (an updated row left its old partition), each key once
    assert _as_regions(DeltaTable(path).to_pyarrow_table()) == _expected_regions(rounds)


def _northern_round(seed: int) -> pa.Table:
    """A round of changes to keys of the region north only (keyed by region and id: the
    initial table's northern keys and new ones)."""
    initial = _with_region(_initial(), 0).to_pylist()
    elsewhere = pa.array([r["id"] for r in initial if r["region"] != "north"])
    changes = _rounds(seed, rounds=1)[0].append_column("region", pa.array(["north"] * 1_500))
    return changes.filter(pa.compute.invert(pa.compute.is_in(changes.column("id"), elsewhere)))


def test_delta_merge_reads_only_the_partitions_of_a_rounds_keys(tmp_path: Path):
    """With the partition column in the key, a round reads and rewrites only its keys'
    partitions: delta-rs's MERGE turns ``t.region = s.region`` into a partition filter."""
    path = str(tmp_path / "t")
    write_deltalake(path, _with_region(_initial(), 0), partition_by=["region"])
    files = {r: len(DeltaTable(path).file_uris([("region", "=", r)])) for r in REGIONS}
    north = _northern_round(seed=5)
    metrics = merge_round(
        DeltaTable(path),
        fold(north, ["region", "id"]),
        ["region", "id"],
        CommitProperties(app_transactions=[Transaction("p/0", 1)]),
    )
    assert metrics["num_target_files_scanned"] == files["north"]
    assert metrics["num_target_files_skipped_during_scan"] == files["south"] + files["east"]
    after = DeltaTable(path)
    for region in ("south", "east"):  # untouched: the very same files
        assert len(after.file_uris([("region", "=", region)])) == files[region]
    assert _as_regions(after.to_pyarrow_table()) == _expected_regions([north])


def _iceberg_regional(tmp_path: Path, key_partitioned: bool):  # noqa: ANN202 - pyiceberg
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.transforms import IdentityTransform

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    initial = _with_region(_initial(), 0)
    table = catalog.create_table("db.t", initial.schema, properties={"format-version": "2"})
    with table.update_spec() as spec:
        spec.add_field("region", IdentityTransform(), "region")
    catalog.load_table("db.t").append(initial)
    return catalog


def test_iceberg_partitioned_upserts_move_keys_between_partitions(tmp_path: Path):
    catalog = _iceberg_regional(tmp_path, key_partitioned=False)
    rounds = _regional_rounds(seed=6)
    for n, changes in enumerate(rounds, start=1):
        table = catalog.load_table("db.t")
        with table.transaction() as tx:
            upsert_round(tx, fold(changes, ["id"]), ["id"], {"rayconnect.round": str(n)})
    table = catalog.load_table("db.t")
    assert _as_regions(table.scan().to_arrow()) == _expected_regions(rounds)
    for task in table.scan().plan_files():  # each file holds its own partition's rows only
        region = task.file.partition[0]
        rows = pa.parquet.read_table(task.file.file_path.removeprefix("file://"))
        assert set(rows.column("region").to_pylist()) == {region}


def test_iceberg_upsert_rewrites_only_the_partitions_of_a_rounds_keys(tmp_path: Path):
    catalog = _iceberg_regional(tmp_path, key_partitioned=True)
    north = _northern_round(seed=7)
    table = catalog.load_table("db.t")
    with table.transaction() as tx:
        upsert_round(tx, fold(north, ["region", "id"]), ["region", "id"], {})
    table = catalog.load_table("db.t")
    summaries = [s.summary for s in table.snapshots()[-2:]]  # the round: DELETE, then APPEND
    assert [s.additional_properties.get("changed-partition-count") for s in summaries] == ["1", "1"]
    assert _as_regions(table.scan().to_arrow()) == _expected_regions([north])
