"""Snapshots while streaming, the Postgres source task alone (no Kafka, no Ray) against a
real Postgres 15: a table added to the publication mid-stream and a table re-snapshotted
on request, under concurrent writes, through a task dropped mid-snapshot and restarted from
the last committed offset - the records, applied in order, equal ``SELECT *``."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg2
import pytest
from fixtures.postgres import PASSWORD, PostgresServer

import rayconnect as rc
from rayconnect.source_tasks.base import SourceTaskContext, TransactionContext, encode_partition

SLOT = "live"


def _apply(lake: dict[str, dict[bytes, Any]], records: list[Any]) -> None:
    for r in records:
        event = json.loads(r.value)
        rows = lake.setdefault(r.topic, {})
        if event["op"] == "d":
            rows.pop(r.key, None)
        else:
            rows[r.key] = event["after"]


def _table(postgres: PostgresServer, name: str) -> dict[int, Any]:
    conn = psycopg2.connect(postgres.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, v FROM {name}")
            return dict(cur.fetchall())
    finally:
        conn.close()


async def _polled(
    settings: dict[str, Any],
    committed: dict[str, Any],
    take: Callable[[list[Any]], None],
    until: Callable[[rc.PostgresSource], Any],
    killed: bool,
) -> None:
    """A task from the committed offset, polled until ``until(task)``; each poll's records
    taken and its offset committed - but with ``killed``, the poll that meets ``until`` is
    lost (never committed), as a SIGKILL would lose it."""
    task = rc.PostgresSource(**settings)
    txn = TransactionContext()
    await task.start(SourceTaskContext("p", 0, 1, dict(committed), txn))
    deadline = time.monotonic() + 40
    while True:
        assert time.monotonic() < deadline, f"not done in 40 s: {task.metrics()}"
        records = await task.poll()
        txn.take()
        if killed and until(task):
            break
        if records:
            take(records)
            committed[encode_partition(task.source_partition)] = records[-1].source_offset
        await task.commit()
        if not killed and until(task):
            break
    await task.stop()


@pytest.mark.timeout(60)
def test_tables_added_live_and_snapshotted_on_request_equal_the_database(
    postgres: PostgresServer,
) -> None:
    postgres.psql("CREATE TABLE a (id int PRIMARY KEY, v int)")
    postgres.psql("INSERT INTO a SELECT g, g FROM generate_series(1, 300) g")
    settings = {
        "dsn": postgres.dsn, "slot": SLOT, "tables": ["a"], "password_env": "PGPASSWORD",
        "batch_size": 40, "discovery_interval_s": 0.3,
    }  # fmt: skip
    lake: dict[str, dict[bytes, Any]] = {}
    committed: dict[str, Any] = {}
    stop = threading.Event()

    def writes() -> None:  # updates, deletes and inserts on both tables while they are read
        conn = psycopg2.connect(postgres.dsn)
        conn.autocommit = True
        i = 0
        with conn.cursor() as cur:
            while not stop.is_set():
                i += 1
                cur.execute("UPDATE a SET v = v + 1000 WHERE id %% 7 = %s", (i % 7,))
                cur.execute("UPDATE b SET v = -v - %s WHERE id %% 11 = %s", (i, i % 11))
                cur.execute("DELETE FROM b WHERE id = %s", (i * 13 % 600,))
                cur.execute("INSERT INTO b VALUES (%s, %s) ON CONFLICT DO NOTHING", (1000 + i, i))
                time.sleep(0.01)
        conn.close()

    async def run(until: Any, *, killed: bool = False) -> None:
        await _polled(settings, committed, lambda records: _apply(lake, records), until, killed)

    def b_rows() -> int:
        return len(lake.get("pg.public.b", {}))

    def snapshotted(task: rc.PostgresSource) -> bool:
        return not task.progress.pending and task._window is None

    writer = threading.Thread(target=writes, daemon=True)
    try:
        # the initial snapshot of a, then b added to the publication while streaming
        asyncio.run(run(lambda task: len(lake.get("pg.public.a", {})) == 300))
        postgres.psql("CREATE TABLE b (id int PRIMARY KEY, v int)")
        postgres.psql("INSERT INTO b SELECT g, g FROM generate_series(1, 600) g")
        writer.start()
        postgres.psql(f"ALTER PUBLICATION {SLOT}_pub ADD TABLE b")
        # killed mid-snapshot of b (several chunks in), then a new task from the offset
        asyncio.run(run(lambda task: b_rows() > 150, killed=True))
        (offset,) = committed.values()
        assert offset.get("pending") == ["public.b"], offset
        assert offset.get("known") == ["public.a", "public.b"], offset
        asyncio.run(run(snapshotted))
        # a re-snapshot of a on request (a message in the WAL), with a kill in it too
        rc.PostgresSource(**settings).request_snapshot(["a"])
        asyncio.run(
            run(
                lambda task: task.progress.pending == ["public.a"] and task.progress.pending_after,
                killed=True,
            )
        )
        asyncio.run(run(snapshotted))
        with pytest.raises(rc.ConfigError, match="not captured"):
            rc.PostgresSource(**settings).request_snapshot(["nope"])
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(5)
    # drained: everything written is in the lake
    asyncio.run(run(lambda task: (lag := task.lag()) is not None and lag.bytes == 0))
    for name in ("a", "b"):
        want = {json.dumps({"id": k}, separators=(",", ":")).encode(): {"id": k, "v": v}
                for k, v in _table(postgres, name).items()}  # fmt: skip
        assert lake[f"pg.public.{name}"] == want, name


def _row(values: dict[str, Any] | None) -> tuple[Any, ...]:
    assert values is not None
    return (values["a"], values["b"])


@pytest.mark.timeout(60)
def test_a_keyless_table_added_live_is_snapshotted_by_pages_once(postgres: PostgresServer) -> None:
    """A table without a key (REPLICA IDENTITY FULL) added to the publication: read by heap
    page ranges between watermarks, through a task dropped mid-snapshot - the events, kept
    as an append sink keeps them and replayed (r, c add a row; u, d take their before
    away), are exactly the table's rows: no page read twice, none left out."""
    postgres.psql("CREATE TABLE a (id int PRIMARY KEY, v int)")
    settings = {
        "dsn": postgres.dsn, "slot": SLOT, "tables": ["a"], "password_env": "PGPASSWORD",
        "batch_size": 40, "discovery_interval_s": 0.3,
    }  # fmt: skip
    events: list[dict[str, Any]] = []
    committed: dict[str, Any] = {}

    def keep(records: list[Any]) -> None:  # as an append sink keeps them
        mine = [r for r in records if r.topic == "pg.public.k"]
        assert all(r.key is None for r in mine)
        events.extend(json.loads(r.value) for r in mine)

    async def run(until: Any, *, killed: bool = False) -> None:
        await _polled(settings, committed, keep, until, killed)

    asyncio.run(run(lambda task: task.lag() is not None))
    postgres.psql("CREATE TABLE k (a int, b text)")
    postgres.psql("ALTER TABLE k REPLICA IDENTITY FULL")
    postgres.psql("INSERT INTO k SELECT g % 50, repeat('x', g % 7) FROM generate_series(1, 1500) g")
    postgres.psql(f"ALTER PUBLICATION {SLOT}_pub ADD TABLE k")
    asyncio.run(run(lambda task: len(events) > 300, killed=True))  # a few pages in
    (offset,) = committed.values()
    assert offset.get("pending") == ["public.k"] and offset.get("pending_after"), offset
    asyncio.run(run(lambda task: not task.progress.pending and task._window is None))
    assert {e["op"] for e in events} == {"r"}
    postgres.psql("UPDATE k SET b = 'u' WHERE a = 3")
    postgres.psql("DELETE FROM k WHERE a = 4")
    postgres.psql("INSERT INTO k VALUES (99, 'new'), (99, 'new')")
    asyncio.run(run(lambda task: (lag := task.lag()) is not None and lag.bytes == 0))
    replayed: collections.Counter[tuple[Any, ...]] = collections.Counter()
    for event in events:
        if event["op"] in ("u", "d"):
            replayed[_row(event["before"])] -= 1
        if event["op"] in ("r", "c", "u"):
            replayed[_row(event["after"])] += 1
    conn = psycopg2.connect(postgres.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT a, b FROM k")
            table = collections.Counter(cur.fetchall())
    finally:
        conn.close()
    assert +replayed == table and not -replayed


@pytest.mark.timeout(60)
def test_a_table_created_in_a_captured_schema_flows_without_alter_publication(
    postgres: PostgresServer,
) -> None:
    """``schemas: [public]``: the publication is ``FOR TABLES IN SCHEMA public``, so a table
    created mid-stream flows - its changes from its creation, its rows snapshotted - equal
    ``SELECT *``; a user who is no superuser gets a publication of the tables named (and a
    superuser's later start adds the schema to it)."""
    postgres.psql("CREATE TABLE a (id int PRIMARY KEY, v int)")
    settings = {
        "dsn": postgres.dsn, "slot": SLOT, "tables": ["a"], "schemas": ["public"],
        "password_env": "PGPASSWORD", "batch_size": 40, "discovery_interval_s": 0.3,
    }  # fmt: skip
    lake: dict[str, dict[bytes, Any]] = {}
    committed: dict[str, Any] = {}

    async def run(until: Any) -> None:
        await _polled(settings, committed, lambda records: _apply(lake, records), until, False)

    asyncio.run(run(lambda task: task.lag() is not None))
    postgres.psql("CREATE TABLE c (id int PRIMARY KEY, v int)")
    postgres.psql("INSERT INTO c SELECT g, g FROM generate_series(1, 300) g")
    asyncio.run(run(lambda task: "public.c" in task.progress.known and not task.progress.pending))
    postgres.psql("UPDATE c SET v = -v WHERE id % 5 = 0")
    postgres.psql("DELETE FROM c WHERE id > 290")
    asyncio.run(run(lambda task: (lag := task.lag()) is not None and lag.bytes == 0))
    want = {json.dumps({"id": k}, separators=(",", ":")).encode(): {"id": k, "v": v}
            for k, v in _table(postgres, "c").items()}  # fmt: skip
    assert lake["pg.public.c"] == want

    from rayconnect.source_tasks.postgres import catalog

    postgres.psql(
        f"CREATE ROLE cdc LOGIN REPLICATION PASSWORD '{PASSWORD}'; "
        "CREATE TABLE d (id int PRIMARY KEY); "
        "ALTER TABLE d OWNER TO cdc; GRANT CREATE ON DATABASE postgres TO cdc"
    )
    mine = rc.PostgresSource(**{**settings, "slot": "other", "tables": ["d"]}).settings
    conn = psycopg2.connect(postgres.dsn.replace("user=postgres", "user=cdc"))
    conn.autocommit = True
    try:
        catalog.ensure_publication(mine, conn)  # no superuser: FOR TABLE d
        assert catalog.tables_of_publication(conn, "other_pub") == [("public", "d")]
    finally:
        conn.close()
    conn = psycopg2.connect(postgres.dsn)
    conn.autocommit = True
    try:
        catalog.ensure_publication(mine, conn)  # a superuser: the schema added
        assert {t for _, t in catalog.tables_of_publication(conn, "other_pub")} == {"a", "c", "d"}
    finally:
        conn.close()
