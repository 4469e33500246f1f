"""The Postgres source task alone (no Kafka, no Ray) against a real Postgres 15: where its
polls end, which decides its Kafka transactions."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from fixtures.postgres import PostgresServer

import rayconnect as rc
from rayconnect.source_tasks.base import SourceLag, SourceTaskContext, TransactionContext


def _polls(postgres: PostgresServer, **settings: Any) -> list[tuple[int, list[Any]]]:
    """Per poll: its records and the transaction requests, for a backlog of 10 transactions
    of 10 inserts, then one of 100."""
    postgres.psql("CREATE TABLE acct (id int PRIMARY KEY, balance bigint)")
    task = rc.PostgresSource(
        dsn=postgres.dsn, slot="polls", tables=["acct"], password_env="PGPASSWORD", **settings
    )
    txn = TransactionContext()

    async def run() -> list[tuple[int, list[Any]]]:
        await task.start(SourceTaskContext("p", 0, 1, {}, txn))
        for t in range(11):
            values = ", ".join(f"({t * 1000 + i}, {i})" for i in range(10 if t < 10 else 100))
            postgres.psql(f"INSERT INTO acct VALUES {values}")
        _wait_all_sent(postgres)
        polls: list[tuple[int, list[Any]]] = []
        deadline = time.monotonic() + 30
        while sum(n for n, _ in polls) < 200 and time.monotonic() < deadline:
            records = await task.poll()
            if records:  # the first polls may come before Postgres sent anything
                polls.append((len(records), [kind for kind, _ in txn.take()]))
            await task.commit()
        await task.stop()
        return polls

    return asyncio.run(run())


def _wait_all_sent(postgres: PostgresServer, timeout_s: float = 10.0) -> None:
    """A poll ends where the stream has nothing more: the backlog must be in the task's
    socket, not still being decoded by the walsender (slow on a loaded machine), for the
    polls to be the ones the bounds make."""
    deadline = time.monotonic() + timeout_s
    query = "SELECT coalesce(bool_and(sent_lsn >= pg_current_wal_flush_lsn()), false) FROM pg_stat_replication"
    while postgres.psql(query) != "t" and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.timeout(60)
def test_a_full_poll_ends_at_a_postgres_commit(postgres: PostgresServer) -> None:
    """With a backlog of 10-change transactions and batch_size 25, each poll returns whole
    transactions (30 changes) and asks to commit: a poll ending mid-transaction could not
    end the Kafka transaction, and with a backlog every poll would (none would commit)."""
    polls = _polls(postgres, batch_size=25, max_records_per_transaction=45)
    # whole 10-change transactions up to >= 25; then the last small one and the first 35
    # changes of the 100-change one reach the bound of 45: split there, and again
    assert polls == [
        (30, ["commit"]), (30, ["commit"]), (30, ["commit"]),
        (45, ["commit"]), (45, ["commit"]), (20, ["commit"]),
    ]  # fmt: skip


@pytest.mark.timeout(60)
def test_a_poll_ends_at_the_commit_after_batch_bytes(postgres: PostgresServer) -> None:
    """batch_bytes bounds a poll like batch_size: 1 byte ends it at every Postgres commit."""
    polls = _polls(postgres, batch_bytes=1)
    assert polls == [(10, ["commit"])] * 10 + [(100, ["commit"])]


@pytest.mark.timeout(60)
def test_lag_moves_behind_while_reading_a_backlog_and_to_zero_once_caught_up(
    postgres: PostgresServer,
) -> None:
    """``lag()`` (status and metrics): bytes and seconds > 0 while a backlog is read a
    poll at a time, 0 once everything read is committed and the stream is idle."""
    postgres.psql("CREATE TABLE acct (id int PRIMARY KEY, balance bigint)")
    task = rc.PostgresSource(
        dsn=postgres.dsn, slot="lag", tables=["acct"], password_env="PGPASSWORD",
        batch_size=100, snapshot=False,
    )  # fmt: skip
    txn = TransactionContext()

    async def run() -> tuple[list[Any], Any]:
        await task.start(SourceTaskContext("p", 0, 1, {}, txn))
        for t in range(30):  # 30 transactions of 100 inserts
            values = ", ".join(f"({t * 1000 + i}, {i})" for i in range(100))
            postgres.psql(f"INSERT INTO acct VALUES {values}")
        time.sleep(0.2)
        behind = []
        records = 0
        while records < 3000:
            polled = await task.poll()
            records += len(polled)
            txn.take()
            await task.commit()
            if polled and records < 2500:
                behind.append(task.lag())
        deadline = time.monotonic() + 20
        while (lag := task.lag()) is not None and lag.bytes and time.monotonic() < deadline:
            assert await task.poll() == []  # idle: the task confirms the server's position
        await task.stop()
        return behind, lag

    behind, caught_up = asyncio.run(run())
    assert behind and all(lag.bytes > 0 and lag.seconds > 0 for lag in behind), behind
    assert caught_up == SourceLag(bytes=0, seconds=0.0)
    # the task down: the slot's lag as Postgres counts it (pg_replication_slots), asked of a
    # task that never started, as status does for a task that does not answer
    at_rest = rc.PostgresSource(
        dsn=postgres.dsn, slot="lag", tables=["acct"], password_env="PGPASSWORD"
    )
    before = at_rest.lag_at_rest()
    assert before is not None and before.bytes is not None and before.seconds is None
    postgres.psql("INSERT INTO acct SELECT g, g FROM generate_series(100000, 100999) g")
    down = at_rest.lag_at_rest()
    assert down is not None and down.bytes is not None, down
    assert down.bytes > before.bytes + 50_000, (before, down)
    confirmed = "(SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lag')"
    counted = int(postgres.psql(f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), {confirmed})"))
    assert down.bytes <= counted  # nothing of it in Kafka: all of it is lag
    gone = rc.PostgresSource(dsn=postgres.dsn, slot="no_slot", tables=["acct"])
    assert gone.lag_at_rest() is None


SHAPES = """
CREATE TABLE doc (id int PRIMARY KEY, body text, n int);
CREATE TABLE docfull (id int PRIMARY KEY, body text, n int);
ALTER TABLE docfull REPLICA IDENTITY FULL;
CREATE TABLE nokey (a int, b text);
ALTER TABLE nokey REPLICA IDENTITY FULL;
"""
#: 9.6 kB of md5 hex: stored out of line (TOAST), so an update of another column leaves it
#: out of the new row ('u')
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)"


@pytest.mark.timeout(60)
def test_toast_key_changes_keyless_tables_and_dropped_columns(postgres: PostgresServer) -> None:
    """An unchanged TOASTed value is never null: the old row's value under REPLICA IDENTITY
    FULL, else the placeholder; a primary-key change is a delete (+ tombstone) of the old
    key and a create of the new; a table without a key (FULL) has key null, partition 0 and
    the whole old row; a dropped column is gone from the next event on."""
    postgres.psql(SHAPES)
    task = rc.PostgresSource(
        dsn=postgres.dsn, slot="shapes", tables=["doc", "docfull", "nokey"],
        password_env="PGPASSWORD", snapshot=False, tombstones=True,
    )  # fmt: skip
    txn = TransactionContext()

    async def run() -> list[Any]:
        await task.start(SourceTaskContext("p", 0, 1, {}, txn))
        postgres.psql(
            f"INSERT INTO doc VALUES (1, {BIG}, 0); INSERT INTO docfull VALUES (1, {BIG}, 0);"
            "INSERT INTO nokey VALUES (1, 'x')"
        )
        postgres.psql("UPDATE doc SET n = 1 WHERE id = 1; UPDATE docfull SET n = 1 WHERE id = 1")
        postgres.psql("UPDATE doc SET id = 2 WHERE id = 1")
        postgres.psql("UPDATE nokey SET b = 'y'")
        postgres.psql("ALTER TABLE doc DROP COLUMN n")
        postgres.psql("UPDATE doc SET body = 'short' WHERE id = 2")
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < 10 and time.monotonic() < deadline:
            records += await task.poll()
            txn.take()
            await task.commit()
        await task.stop()
        return records

    records = asyncio.run(run())
    big = postgres.psql(f"SELECT {BIG}")
    unavailable = "__debezium_unavailable_value"
    got = [
        (
            r.topic.rsplit(".", 1)[1],
            r.key and json.loads(r.key),
            r.partition,
            r.value
            and {k: v for k, v in json.loads(r.value).items() if k in ("op", "before", "after")},
        )
        for r in records
    ]
    assert got == [
        ("doc", {"id": 1}, None, {"op": "c", "before": None, "after": {"id": 1, "body": big, "n": 0}}),
        ("docfull", {"id": 1}, None, {"op": "c", "before": None, "after": {"id": 1, "body": big, "n": 0}}),
        ("nokey", None, 0, {"op": "c", "before": None, "after": {"a": 1, "b": "x"}}),
        ("doc", {"id": 1}, None, {"op": "u", "before": None, "after": {"id": 1, "body": unavailable, "n": 1}}),
        ("docfull", {"id": 1}, None, {
            "op": "u", "before": {"id": 1, "body": big, "n": 0}, "after": {"id": 1, "body": big, "n": 1}
        }),
        ("doc", {"id": 1}, None, {"op": "d", "before": {"id": 1}, "after": None}),
        ("doc", {"id": 1}, None, None),  # the old key's tombstone
        ("doc", {"id": 2}, None, {"op": "c", "before": None, "after": {"id": 2, "body": unavailable, "n": 1}}),
        ("nokey", None, 0, {"op": "u", "before": {"a": 1, "b": "x"}, "after": {"a": 1, "b": "y"}}),
        ("doc", {"id": 2}, None, {"op": "u", "before": None, "after": {"id": 2, "body": "short"}}),
    ]  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["event", "skip"])
def test_a_truncate_is_an_event_per_table_or_a_counted_skip(
    postgres: PostgresServer, mode: str
) -> None:
    """``TRUNCATE acct, other`` between inserts: with ``truncate: event`` (the default) a
    Debezium truncate event per table (op t, no key, no row) in its place in the stream,
    for every partition of its topic and marked as a partition's truncate; with ``skip``
    nothing, but counted in the task's metrics."""
    postgres.psql(
        "CREATE TABLE acct (id int PRIMARY KEY, v int); CREATE TABLE other (id int PRIMARY KEY)"
    )
    settings = {} if mode == "event" else {"truncate": "skip"}
    task = rc.PostgresSource(
        dsn=postgres.dsn, slot="trunc", tables=["acct", "other"], password_env="PGPASSWORD",
        **settings,
    )  # fmt: skip
    want = 5 if mode == "event" else 3

    async def run() -> tuple[list[Any], dict[str, Any]]:
        await task.start(SourceTaskContext("p", 0, 1, {}, TransactionContext()))
        postgres.psql("INSERT INTO acct VALUES (1, 10), (2, 20)")
        postgres.psql("INSERT INTO other VALUES (7); TRUNCATE acct, other")
        postgres.psql("INSERT INTO acct VALUES (3, 30)")
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < want + 1 and time.monotonic() < deadline:
            records += await task.poll()
            await task.commit()
        metrics = task.metrics()
        await task.stop()
        return records, metrics

    records, metrics = asyncio.run(run())
    seen = []
    for r in records:
        event = json.loads(r.value)
        key = None if r.key is None else json.loads(r.key)
        copies = (r.partition, r.every_partition, tuple(r.headers))
        seen.append((r.topic, event["op"], key, copies, event["before"], event["after"]))
        assert event["source"]["table"] == r.topic.rsplit(".", 1)[1]
    acct, other = "pg.public.acct", "pg.public.other"
    # a row's record: keyed, its table's column types in a header; a truncate: neither
    keyed = (None, False, (("rayconnect.value_schema", b'{"id":"int","v":"int"}'),))
    keyed_other = (None, False, (("rayconnect.value_schema", b'{"id":"int"}'),))
    rows = [
        (acct, "c", {"id": 1}, keyed, None, {"id": 1, "v": 10}),
        (acct, "c", {"id": 2}, keyed, None, {"id": 2, "v": 20}),
        (other, "c", {"id": 7}, keyed_other, None, {"id": 7}),
    ]
    marked = (None, True, (("rayconnect.truncate", b"partition"),))
    truncates = [(acct, "t", None, marked, None, None), (other, "t", None, marked, None, None)]
    last = [(acct, "c", {"id": 3}, keyed, None, {"id": 3, "v": 30})]
    if mode == "event":
        assert seen == rows + truncates + last
        assert metrics["truncates_skipped"] == 0
    else:
        assert seen == rows + last
        assert metrics["truncates_skipped"] == 2
