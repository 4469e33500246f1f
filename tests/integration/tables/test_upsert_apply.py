"""An upsert round applied to real tables - Delta through delta-rs's MERGE, Iceberg through
pyiceberg's copy-on-write DELETE + APPEND - from random change streams: the table equals
the stream's final state (checked against a dict), the offsets land in the same commit, and
a MERGE built on a version a rival commit moved past fails instead of landing twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from rayconnect.write_modes.delta_merge import merge_round
from rayconnect.write_modes.fold import DELETE_COLUMN, fold
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
