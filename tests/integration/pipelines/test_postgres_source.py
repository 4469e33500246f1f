"""The Postgres change source, exactly once from the WAL into Kafka, on real parts: a real
Postgres 15 (tests/fixtures/postgres.py), the embedded broker, a local Ray.

A writer thread runs many small transactions (inserts, updates, deletes over two tables, one
keyed by an int, one by text) and keeps the exact history of what committed, in commit
order. What a read_committed consumer then sees of each table's topic must be, per key, the
snapshot's ``r`` event of the row as it was (if it existed) followed by exactly the changes
committed after it - every change once, in commit order - and replaying the topics must give
each table's final rows. The chaos test kills the task (ray.kill and SIGKILL) during the
load, once during the snapshot, restarts Postgres and cuts the network to the broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from fixtures.postgres import PostgresServer
from fixtures.tcp_proxy import TcpProxy, broker_behind_proxy
from test_source_pipeline import _kill_repeatedly

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.errors import ConfigError
from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.read_back import read_topic
from rayconnect.pipelines.source import lag_at_rest

pytestmark = [pytest.mark.usefixtures("ray_session")]

TABLES = {"acct": "id", "item": "k"}
SCHEMA = """
CREATE TABLE acct (id int PRIMARY KEY, balance bigint NOT NULL, note text, ok boolean,
                   amount numeric(12, 2), at timestamptz);
CREATE TABLE item (k text PRIMARY KEY, qty int);
"""
Row = dict[str, Any]
Change = tuple[str, Row | None]  # (op, row after it; None after a delete)


class Writer:
    """Runs random transactions on one connection, recording what committed (commit order
    = the order of this list, one connection committing one transaction after another)."""

    def __init__(self, server: PostgresServer, seed: int = 7) -> None:
        self.conn = psycopg2.connect(server.dsn, options="-c TimeZone=UTC")
        self.rng = random.Random(seed)
        self.state: dict[tuple[str, Any], Row] = {}
        self.history: dict[tuple[str, Any], list[Change]] = {}
        self.transactions = 0
        self._next = 0

    def initial_rows(self, n: int) -> None:
        """Rows that exist before the pipeline starts: the snapshot's."""
        for _ in range(n):
            self._insert(self.conn.cursor(), self._pick_table(), record=False)
        self.conn.commit()

    def _pick_table(self) -> str:
        return self.rng.choice(list(TABLES))

    def _new_row(self, table: str) -> Row:
        self._next += 1
        if table == "acct":
            return {
                "id": self._next,
                "balance": self.rng.randint(-(10**12), 10**12),
                "note": self.rng.choice(["a", "ü é", "x" * 50, None]),
                "ok": self.rng.choice([True, False]),
                "amount": f"{self.rng.randint(0, 10**6)}.{self.rng.randint(0, 99):02d}",
                "at": "2026-01-02T03:04:05.5Z",
            }
        return {"k": f"k{self._next:06d}-{self.rng.choice('AbZ')}", "qty": self.rng.randint(0, 99)}

    def _insert(self, cur: Any, table: str, record: bool = True) -> tuple[tuple[str, Any], Change]:
        new = self._new_row(table)
        cols = ", ".join(new)
        cur.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join(['%s'] * len(new))})",
                    list(new.values()))  # fmt: skip
        key = (table, new[TABLES[table]])
        if not record:
            self.state[key] = new
        return key, ("c", new)

    def transaction(self) -> None:
        cur = self.conn.cursor()
        pending: list[tuple[tuple[str, Any], Change]] = []
        shadow = dict(self.state)
        for _ in range(self.rng.randint(1, 5)):
            table = self._pick_table()
            keys = [k for k in shadow if k[0] == table]
            roll = self.rng.random()
            if roll < 0.4 or not keys:
                key, change = self._insert(cur, table)
                shadow[key] = change[1]  # type: ignore[assignment]
            elif roll < 0.8:
                key = self.rng.choice(keys)
                row = dict(shadow[key])
                if table == "acct":
                    row["balance"] += self.rng.randint(1, 1000)
                    cur.execute(
                        "UPDATE acct SET balance = %s WHERE id = %s", (row["balance"], key[1])
                    )
                else:
                    row["qty"] += 1
                    cur.execute("UPDATE item SET qty = %s WHERE k = %s", (row["qty"], key[1]))
                shadow[key], change = row, ("u", row)
            else:
                key = self.rng.choice(keys)
                cur.execute(f"DELETE FROM {table} WHERE {TABLES[table]} = %s", (key[1],))
                del shadow[key]
                change = ("d", None)
            pending.append((key, change))
        self.conn.commit()  # on an error nothing is recorded: it did not commit
        self.state = shadow
        for key, change in pending:
            self.history.setdefault(key, []).append(change)
        self.transactions += 1

    def run(self, stop: threading.Event, pause: threading.Event, rate_s: float) -> None:
        while not stop.is_set():
            if pause.is_set():
                time.sleep(0.05)
                continue
            self.transaction()
            time.sleep(rate_s)


def _expected_matches(initial: Row | None, history: list[Change], events: list[Row]) -> str | None:
    """None if ``events`` (a key's change events, in Kafka order) are an ``r`` of the row as
    some prefix of ``history`` left it (or nothing, if it did not exist then) followed by
    exactly the rest of ``history``; else why not."""
    got = [(e["op"], e["after"]) for e in events]
    states = [initial]
    for _, after in history:
        states.append(after)
    for j in range(len(history) + 1):
        rest = [(op, after) for op, after in history[j:]]
        if states[j] is None:
            if got == rest:
                return None
        elif got[:1] == [("r", states[j])] and got[1:] == rest:
            return None
    return f"events {got[:6]}... do not continue history {history[:6]}... from any point"


def _normal(table: str, row: Row | None) -> Row | None:
    """A row as the source types it (numeric: a JSON number, exact)."""
    if row is None or table != "acct":
        return row
    return {**row, "amount": float(row["amount"])}


def read_events(bootstrap: str, topic: str) -> dict[Any, list[Row]]:
    by_key: dict[Any, list[Row]] = {}
    for key, value in asyncio.run(read_topic(bootstrap, topic, "read_committed")):
        if value is None:
            continue  # a tombstone
        k = json.loads(key)
        by_key.setdefault(next(iter(k.values())), []).append(json.loads(value))
    return by_key


def check_exactly_the_history(bootstrap: str, writer: Writer, initial: dict) -> str | None:
    """None once every table's topic holds exactly the writer's history (see the module
    docstring) and replays to the table's final rows; else the first difference."""
    for table in TABLES:
        events = read_events(bootstrap, f"pg.public.{table}")
        keys = {k for t, k in writer.history if t == table} | {k for t, k in initial if t == table}
        for key in keys:
            history = [(op, _normal(table, r)) for op, r in writer.history.get((table, key), [])]
            got = [{**e, "after": e["after"]} for e in events.get(key, [])]
            for e in got:
                e["after"] = _normal(table, e["after"]) if e["after"] else e["after"]
            problem = _expected_matches(_normal(table, initial.get((table, key))), history, got)
            if problem:
                return f"{table} {key!r}: {problem}"
        extra = set(events) - keys
        if extra:
            return f"{table}: events of keys never written: {sorted(extra)[:5]}"
        final = {k: _normal(table, r) for (t, k), r in writer.state.items() if t == table}
        replayed: dict[Any, Row] = {}
        for key, evs in events.items():
            last = evs[-1]
            if last["op"] != "d":
                replayed[key] = _normal(table, last["after"])
        if replayed != final:
            return f"{table}: the topic replays to {len(replayed)} rows, the table has {len(final)}"
    return None


def _pipeline(name: str, server: PostgresServer, bootstrap: str, **task: Any) -> rc.SourcePipeline:
    """The tables' topics are the source's to make (``topic_partitions``, default 2)."""
    source = rc.PostgresSource(
        dsn=server.dsn,
        slot="rc_slot",
        tables=list(TABLES),
        password_file=server.password_file,
        **task,
    )
    return rc.SourcePipeline(
        name,
        task=source,
        target=rc.KafkaTarget(bootstrap),
        transaction_boundary="connector",
        commit_timeout_s=10.0,
        exactly_once="required",
    )


async def _partitions(bootstrap: str) -> dict[str, int]:
    """Each table topic's partition count, as the broker describes it."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([f"pg.public.{t}" for t in TABLES])
        return {d["topic"]: len(d["partitions"]) for d in described}
    finally:
        await admin.close()


def _wait_exact(bootstrap: str, writer: Writer, initial: dict, timeout_s: float = 60.0) -> None:
    deadline, problem = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        problem = check_exactly_the_history(bootstrap, writer, initial)
        if problem is None:
            return
        time.sleep(1.0)
    raise AssertionError(problem)


@pytest.fixture
def proxied_target(tmp_path: Path) -> Iterator[TcpProxy]:
    with broker_behind_proxy("target", tmp_path / "kafka") as proxy:
        yield proxy


@pytest.mark.timeout(180)
def test_snapshot_then_stream_exactly_the_history(postgres: PostgresServer, kafka_broker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    postgres.psql(SCHEMA)
    writer = Writer(postgres)
    writer.initial_rows(300)
    initial = dict(writer.state)
    handle = _pipeline("pg-basic", postgres, bootstrap, batch_size=100, topic_partitions=3).start()
    try:
        # the source made each table's topic, with topic_partitions, before it was ready
        assert asyncio.run(_partitions(bootstrap)) == {f"pg.public.{t}": 3 for t in TABLES}
        for _ in range(300):
            writer.transaction()
        postgres.psql("ALTER TABLE item ADD COLUMN color text")
        writer.conn.cursor().execute(
            "UPDATE item SET color = 'red' WHERE k = (SELECT min(k) FROM item)"
        )
        writer.conn.commit()
        (k, qty) = postgres.psql("SELECT k, qty FROM item ORDER BY k LIMIT 1").split("|")
        writer.state[("item", k)] = {"k": k, "qty": int(qty), "color": "red"}
        writer.history.setdefault(("item", k), []).append(("u", writer.state[("item", k)]))
        _wait_exact(bootstrap, writer, initial)
        status = handle.status()["tasks"][0]
        assert status["source"]["phase"] == "stream"
        assert status["lag"]["bytes"] >= 0 and status["lag"]["seconds"] >= 0
        event = read_events(bootstrap, "pg.public.acct")
        one = next(iter(event.values()))[0]
        assert set(one) == {"before", "after", "source", "op", "ts_ms"}
        assert {"lsn", "txId", "ts_ms", "schema", "table", "snapshot"} <= set(one["source"])
    finally:
        handle.stop(release=True)
    assert postgres.psql("SELECT count(*) FROM pg_replication_slots") == "0"


def _chaos(
    postgres: PostgresServer, proxy: TcpProxy, kill, rows: int, rounds: int, kills: int
) -> None:
    """Kill the task mid-snapshot, then per round ``kills`` times (ray.kill and SIGKILL,
    alternately) during the write load and restart Postgres; then cut the broker off once."""
    bootstrap = f"127.0.0.1:{proxy.port}"
    postgres.psql(SCHEMA)
    writer = Writer(postgres, seed=11)
    writer.initial_rows(rows)
    initial = dict(writer.state)
    started = time.time()
    handle = _pipeline(
        "pg-chaos", postgres, bootstrap, batch_size=100,
        snapshot_parallelism=2, snapshot_chunk_rows=rows // 8,
    ).start()  # fmt: skip
    name = names.task("pg-chaos", 0)
    stop, pause = threading.Event(), threading.Event()
    thread = threading.Thread(target=writer.run, args=(stop, pause, 0.002), daemon=True)
    try:
        thread.start()  # writes during the snapshot: the resumed one must skip the right ones
        # mid-snapshot (pages of 100 rows, 8+ chunks, 2 workers): a snapshot worker killed,
        # replaced, its chunk read again from its committed progress; then the task itself
        status = handle.wait_for(
            lambda s: s["tasks"][0].get("source", {}).get("snapshot_worker_pids"), 60, 0.02
        )
        os.kill(status["tasks"][0]["source"]["snapshot_worker_pids"][0], signal.SIGKILL)
        handle.wait_for(lambda s: s["tasks"][0]["records_committed"] >= 300, 60, 0.05)
        kill(name, "ray.kill")  # and the task: a new exported snapshot, unfinished chunks
        for _ in range(rounds):
            _kill_repeatedly(handle, name, kill, kills)
            pause.set()  # a transaction cut by the restart would have no known outcome
            time.sleep(0.2)
            writer.conn.close()
            before = handle.status()["tasks"][0]["restarts"]
            postgres.restart()
            writer.conn = psycopg2.connect(postgres.dsn, options="-c TimeZone=UTC")
            pause.clear()
            # the restart ends the task's stream: it fails, Ray restarts it, it resumes
            handle.wait_for(
                lambda s, b=before: (
                    s["tasks"][0].get("restarts", 0) > b
                    and s["tasks"][0].get("records_committed", 0) > 0
                ),
                60,
                0.1,
            )
        _kill_repeatedly(handle, name, kill, 1)
        proxy.cut()
        time.sleep(3.0)
        proxy.forward()
        time.sleep(2.0)
        stop.set()
        thread.join(10)
        assert writer.transactions > 200
        _wait_exact(bootstrap, writer, initial, timeout_s=90)
        task = handle.status()["tasks"][0]
        assert task["restarts"] >= 2 + rounds * (kills + 1)
        # recovered: no error now; the ones that ended incarnations (Postgres restarted)
        # are history, with their time
        assert task.get("last_error") is None, task
        assert task.errors and all(started <= e.at <= time.time() for e in task.errors)
        # lag from the slot (pg_replication_slots), as status asks it of a task that does
        # not answer: from the task kept for the pipeline, in this process
        down = lag_at_rest("pg-chaos")
        assert down is not None and down.bytes is not None and down.bytes >= 0
        snapshots = {
            e["source"]["lsn"]
            for table in TABLES
            for events in read_events(bootstrap, f"pg.public.{table}").values()
            for e in events
            if e["op"] == "r"
        }
        assert len(snapshots) >= 2, "the kill did not land in the snapshot: nothing resumed"
    finally:
        stop.set()
        handle.stop(release=True)


@pytest.mark.timeout(240)
def test_killed_restarted_and_cut_off_every_change_once_in_order(
    postgres: PostgresServer, proxied_target: TcpProxy, kill
) -> None:
    _chaos(postgres, proxied_target, kill, rows=4000, rounds=1, kills=5)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_20_times_postgres_restarted_3_times(
    postgres: PostgresServer, proxied_target: TcpProxy, kill
) -> None:
    _chaos(postgres, proxied_target, kill, rows=20000, rounds=3, kills=7)


def test_pre_start_checks_name_the_setting(
    postgres: PostgresServer, kafka_broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    postgres.psql("CREATE TABLE nokey (a int); CREATE ROLE plain LOGIN PASSWORD 'pw'")

    def start(**task: Any) -> str:
        base = {
            "dsn": postgres.dsn,
            "slot": "chk",
            "tables": ["acct"],
            "password_env": "PGPASSWORD",
        }
        with pytest.raises(ConfigError) as e:
            rc.SourcePipeline(
                "pg-checks",
                task=rc.PostgresSource(**{**base, **task}),
                target=rc.KafkaTarget(bootstrap),
                transaction_boundary="connector",
            ).start()
        return str(e.value)

    assert start().startswith("tables: public.acct does not exist")
    # password_env naming a variable that is not set: no password, and a server that asks
    # none (this one: trust) lets the task in (the example files work as written)
    assert start(password_env="RC_UNSET_PASSWORD").startswith("tables: public.acct does not")
    assert "has no primary key" in start(tables=["nokey"])
    assert start(dsn=postgres.dsn.replace(f"port={postgres.port}", "port=1")).startswith(
        "dsn: cannot connect to Postgres"
    )
    plain = postgres.dsn.replace("user=postgres", "user=plain")
    monkeypatch.setenv("PLAIN_PW", "pw")
    postgres.psql("CREATE TABLE acct (id int PRIMARY KEY)")
    assert start(dsn=plain, password_env="PLAIN_PW").startswith(
        "dsn: user 'plain' may not replicate"
    )
    conn = psycopg2.connect(postgres.dsn)
    conn.autocommit = True
    conn.cursor().execute("SELECT pg_create_logical_replication_slot('busy', 'pgoutput')")
    repl = psycopg2.connect(
        postgres.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
    )
    postgres.psql("CREATE PUBLICATION busy_pub FOR TABLE acct")
    repl.cursor().start_replication(
        slot_name="busy",
        decode=False,
        options={"proto_version": "1", "publication_names": "busy_pub"},
    )
    time.sleep(0.5)
    assert start(slot="busy").startswith("slot: 'busy' is in use by another consumer")
    repl.close()
    _drop_slot_once_released(conn, "busy")
    with pytest.raises(ConfigError, match="transaction_boundary"):
        rc.SourcePipeline(
            "pg-checks",
            task=rc.PostgresSource(dsn=postgres.dsn, slot="x", tables=["acct"]),
            target=rc.KafkaTarget(bootstrap),
        )
    postgres.psql("ALTER SYSTEM SET wal_level = replica")
    postgres.restart()
    assert start().startswith("dsn: Postgres has wal_level=replica")


PIPELINE_FILE = """\
kind: source
name: pg-cli
task:
  type: postgres
  dsn: "host=127.0.0.1 port={port} user=postgres dbname=postgres"
  password_file: {password_file}
  slot: cli_slot
  tables: [public.acct]
target: {{bootstrap_servers: "{bootstrap}"}}
transaction_boundary: connector
exactly_once: required
"""


@pytest.mark.timeout(120)
def test_cli_run_and_stop_drop_slot(
    postgres: PostgresServer, kafka_broker, tmp_path, capsys
) -> None:
    from rayconnect.cli import EXIT_OK, EXIT_USAGE, main

    bootstrap = kafka_broker.bootstrap_servers
    postgres.psql("CREATE TABLE acct (id int PRIMARY KEY, balance bigint)")
    postgres.psql("INSERT INTO acct SELECT g, g * 10 FROM generate_series(1, 50) g")
    asyncio.run(create_topic(bootstrap, "pg.public.acct", 2))
    path = tmp_path / "pg.yaml"
    fields = {"password_file": postgres.password_file, "bootstrap": bootstrap}
    path.write_text(PIPELINE_FILE.format(port=1, **fields))
    assert main(["run", str(path), "--detach"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "$.task: dsn: cannot connect to Postgres" in err and "pg-test-secret" not in err
    path.write_text(PIPELINE_FILE.format(port=postgres.port, **fields))
    assert main(["run", str(path), "--detach"]) == EXIT_OK
    postgres.psql("UPDATE acct SET balance = -1 WHERE id = 7")
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline and len(read_events(bootstrap, "pg.public.acct").get(7, [])) < 2
    ):
        time.sleep(0.5)
    assert [(e["op"], e["after"]) for e in read_events(bootstrap, "pg.public.acct")[7]] == [
        ("r", {"id": 7, "balance": 70}),
        ("u", {"id": 7, "balance": -1}),
    ]
    assert (
        postgres.psql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cli_slot'")
        == "1"
    )
    assert main(["stop", "pg-cli", "--drop-slot"]) == EXIT_OK
    assert "released" in capsys.readouterr().out
    assert postgres.psql("SELECT count(*) FROM pg_replication_slots") == "0"


def _drop_slot_once_released(conn: Any, slot: str, timeout_s: float = 30.0) -> None:
    """The walsender of a closed replication connection exits a moment after the client:
    until it has, the slot is still active and cannot be dropped."""
    deadline = time.monotonic() + timeout_s
    cur = conn.cursor()
    while True:
        cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        (active,) = cur.fetchone()
        if not active:
            break
        assert time.monotonic() < deadline, f"slot {slot} still active after {timeout_s} s"
        time.sleep(0.1)
    cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


@pytest.mark.timeout(300)
def test_a_slot_gone_behind_the_pipelines_back_is_never_a_silent_gap(
    postgres: PostgresServer, kafka_broker
) -> None:
    """The committed offsets say where the stream was; the slot that held the changes since
    is dropped (by hand, or a database restored without it). ``fail`` refuses to start and
    creates no slot (the next start finds the same); ``snapshot`` starts over with a new
    snapshot; ``latest`` streams from the new slot on (the changes in between are lost, as
    that setting says)."""
    bootstrap = kafka_broker.bootstrap_servers
    postgres.psql(SCHEMA)
    postgres.psql("INSERT INTO acct (id, balance) SELECT g, g FROM generate_series(1, 20) g")
    name = "pg-gap"

    def acct_events() -> dict[Any, list[Row]]:
        return read_events(bootstrap, "pg.public.acct")

    def wait(predicate: Any, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, acct_events()
            time.sleep(0.5)

    handle = _pipeline(name, postgres, bootstrap).start()
    try:
        wait(lambda: len(acct_events()) == 20)
    finally:
        handle.stop(release=True)  # drops the slot: the committed offsets stay in Kafka
    assert postgres.psql("SELECT count(*) FROM pg_replication_slots") == "0"
    postgres.psql("UPDATE acct SET balance = -1 WHERE id = 1")  # in no slot's stream

    with pytest.raises(Exception, match="replication slot 'rc_slot' does not exist") as info:
        _pipeline(name, postgres, bootstrap).start(timeout_s=60)
    assert "offsets_out_of_range: fail" in str(info.value)
    assert postgres.psql("SELECT count(*) FROM pg_replication_slots") == "0"  # none made

    handle = _pipeline(name, postgres, bootstrap, offsets_out_of_range="snapshot").start()
    try:  # every row again, as the snapshot reads it now: id 1 with its new balance
        wait(lambda: [e["after"]["balance"] for e in acct_events()[1]] == [1, -1])
        assert all(len(acct_events()[i]) == 2 for i in range(2, 21))
        postgres.psql("UPDATE acct SET balance = -2 WHERE id = 2")
        wait(lambda: acct_events()[2][-1]["after"]["balance"] == -2)
    finally:
        handle.stop(release=True)
    postgres.psql("UPDATE acct SET balance = -3 WHERE id = 3")  # lost under 'latest'

    handle = _pipeline(name, postgres, bootstrap, offsets_out_of_range="latest").start()
    try:
        postgres.psql("UPDATE acct SET balance = -4 WHERE id = 4")
        wait(lambda: acct_events()[4][-1]["after"]["balance"] == -4)
        assert [e["after"]["balance"] for e in acct_events()[3]] == [3, 3]  # no -3
    finally:
        handle.stop(release=True)
