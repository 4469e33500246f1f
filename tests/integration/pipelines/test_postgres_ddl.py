"""DDL beyond adding and dropping columns, from a real Postgres 15 to an upsert table: what
the source's events carry after ``ALTER COLUMN ... TYPE`` and ``RENAME COLUMN``, and what the
sink makes of them (docs/guides/upserts.md#ddl) - widenings change nothing in the lake, a
rename starts a new column, any other type change is a dead letter with its reason, never
a value lost or bent. The source task alone (no Kafka, no Ray) feeds the sink's own decoding
and fold, then a real Delta MERGE: a few seconds."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from fixtures.postgres import PostgresServer

import rayconnect as rc
from rayconnect.demo.mirror_database import CHANGE_FORMAT
from rayconnect.formats import evolution
from rayconnect.formats.rows import decode_block
from rayconnect.formats.settings import RecordFormat
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.source_tasks.base import SourceTaskContext, TransactionContext
from rayconnect.write_modes.delta_merge import merge_round
from rayconnect.write_modes.fold import fold

#: as the database mirror's sink reads the source's topics: inferred JSON, keyed by ``id``
MIRROR = RecordFormat(**CHANGE_FORMAT, upsert_keys=("id",))

STEPS = [  # (DDL, then the change that follows it)
    (None, "INSERT INTO acct VALUES (1, 5, 1.5, 'ab', 'first')"),
    (
        "ALTER TABLE acct ALTER COLUMN qty TYPE bigint, ALTER COLUMN price TYPE double "
        "precision, ALTER COLUMN code TYPE text",
        "INSERT INTO acct VALUES (2, 1099511627776, 0.1, 'longer than varchar(4)', 'second')",
    ),
    ("ALTER TABLE acct RENAME COLUMN note TO remark", "UPDATE acct SET qty = 6 WHERE id = 1"),
    ("ALTER TABLE acct ALTER COLUMN qty TYPE text USING qty::text",
     "INSERT INTO acct VALUES (3, 'many', 2, 'c', 'third')"),
]  # fmt: skip


def _events(postgres: PostgresServer) -> list[Any]:
    postgres.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, qty int, price real, code varchar(4), note text)"
    )
    task = rc.PostgresSource(
        dsn=postgres.dsn, slot="ddl", tables=["acct"], password_env="PGPASSWORD", snapshot=False
    )
    txn = TransactionContext()

    async def run() -> list[Any]:
        await task.start(SourceTaskContext("p", 0, 1, {}, txn))
        for ddl, change in STEPS:
            if ddl is not None:
                postgres.psql(ddl)
            postgres.psql(change)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < len(STEPS) and time.monotonic() < deadline:
            records += await task.poll()
            txn.take()
            await task.commit()
        await task.stop()
        return records

    return asyncio.run(run())


def _raw(records: list[Any], first_offset: int) -> pa.Table:
    """The records as the sink's readers hand them on (one partition, offsets in order)."""
    n = len(records)
    return pa.table(
        {
            "cluster": ["c"] * n,
            "topic": [r.topic for r in records],
            "partition": [0] * n,
            "offset": list(range(first_offset, first_offset + n)),
            "timestamp": [1_800_000_000_000_000] * n,
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "headers": [[]] * n,
        },
        schema=RAW_RECORD_SCHEMA,
    )


@pytest.mark.timeout(60)
def test_widenings_change_nothing_a_rename_is_a_new_column_other_types_dead_letter(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    events = _events(postgres)
    afters = [json.loads(r.value)["after"] for r in events]
    # the source: each event in the shape its Relation message gave (the new name, the new
    # type's JSON: bigint and double are JSON numbers as int and real were, text a string)
    assert afters == [
        {"id": 1, "qty": 5, "price": 1.5, "code": "ab", "note": "first"},
        {"id": 2, "qty": 1099511627776, "price": 0.1, "code": "longer than varchar(4)",
         "note": "second"},
        {"id": 1, "qty": 6, "price": 1.5, "code": "ab", "remark": "first"},
        {"id": 3, "qty": "many", "price": 2, "code": "c", "remark": "third"},
    ]  # fmt: skip
    # the sink, a block per event as rounds would bring them, the table growing as the
    # committer grows it (``evolution.merge``)
    path = str(tmp_path / "acct")
    schema: pa.Schema | None = None
    dead: list[tuple[int, str]] = []
    for offset, record in enumerate(events):
        block = decode_block(_raw([record], offset), MIRROR, schema)
        dead += [(r["_kafka_offset"], r["reason"]) for r in block.dead_letters.to_pylist()]
        folded = fold(block.rows, ["id"])
        if schema is None:
            write_deltalake(path, folded.rows)
        else:
            grown, conflicts = evolution.merge(schema, folded.rows.schema)
            assert conflicts == []
            if grown != schema:
                write_deltalake(path, grown.empty_table(), mode="append", schema_mode="merge")
            rows = folded.rows.cast(pa.schema([grown.field(n) for n in folded.rows.column_names]))
            merge_round(DeltaTable(path), type(folded)(rows, folded.deleted), ["id"],
                        CommitProperties(app_transactions=[Transaction("p/0", offset)]))  # fmt: skip
        schema = pa.schema(DeltaTable(path).schema().to_arrow())
    assert dead == [
        (3, "not a JSON object of the table's types: JSON parse error: Column(/qty) changed "
            "from number to string in row 0"),
    ]  # fmt: skip
    table = DeltaTable(path).to_pyarrow_table()
    assert schema is not None
    assert {n: str(schema.field(n).type) for n in ("qty", "price", "code", "note", "remark")} == {
        "qty": "int64", "price": "double", "code": "string", "note": "string",
        "remark": "string",
    }  # fmt: skip
    rows = sorted(table.select(["id", "qty", "note", "remark"]).to_pylist(), key=lambda r: r["id"])
    assert rows == [
        {"id": 1, "qty": 6, "note": None, "remark": "first"},  # updated after the rename
        {"id": 2, "qty": 1099511627776, "note": "second", "remark": None},
    ]
