"""The Postgres change source: changes/s into Kafka exactly once vs a plain at-least-once
loop vs the raw stream, and commit -> visible latency under a steady load - same run.

A real Postgres 15 (started like the tests do, rayconnect.demo.local_postgres) and an embedded
broker; 10 tables ``t0..t9 (id int primary key, v int, s text)``. One slot per way is
created before pgbench writes the backlog (``--txns`` transactions of one upsert per table:
10 changes each), so the three ways read the same WAL:

  raw stream     psycopg2 pgoutput stream, messages read and counted (the ceiling)
  plain loop     the same stream decoded into the same Debezium JSON events (this package's
                 decoder), produced with aiokafka without transactions, flushed and the
                 slot confirmed after each Postgres commit batch: at-least-once
  exactly-once   rc.PostgresSource in a TaskRunner (the task actor's loop, without Ray):
                 records + LSN offset in one Kafka transaction per poll of whole Postgres
                 transactions, the slot confirmed after each commit; with the defaults,
                 then tuned (``TUNED_TASK``) from a slot of its own

Column types (issue 38.1): the exactly-once task once more without its
``rayconnect.value_schema`` header (``column_types: none``), and the plain loop once more
with each value wrapped as Debezium's JSON converter with schemas writes it (``{"schema":
..., "payload": ...}``, the schema of the table's event built once per table): what each
way of carrying the column types costs.

The exactly-once ways run in this process with its start-up objects frozen out of the
collector's way, as the task actor does (``freeze_start_up``). ``--before REV``: the
exactly-once task of rayconnect at git revision REV (its ``src`` extracted to a temporary
folder), defaults and tuned, each in a process of its own, beside the current tree's in a
process of its own - before and after in the same run, on the same WAL.

Latency: the exactly-once task runs in a child process while pgbench writes ``--rate``
changes/s for ``--seconds``; a read_committed consumer here takes, per change, the time it
is received minus its Postgres commit time (``source.ts_ms``).

    .venv/bin/python bench/postgres_source.py [--txns 20000] [--rate 5000] [--seconds 20]
        [--before REV]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from source_eo_vs_plain import committed_rate  # noqa: E402

from rayconnect.actors.source_task import TaskRunner  # noqa: E402
from rayconnect.config.source import KafkaTarget, SourceSettings  # noqa: E402
from rayconnect.demo.local_postgres import BIN, PASSWORD, PostgresServer, postgres_server  # noqa: E402
from rayconnect.kafka.admin import create_topic  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402
from rayconnect.kafka.transactions import producer, stop_quietly  # noqa: E402
from rayconnect.pipelines.source import prepare_generation  # noqa: E402
from rayconnect.source_tasks.postgres import PostgresSettings, PostgresSource  # noqa: E402
from rayconnect.source_tasks.postgres.events import EventBuilder, RowCodec, TableShape  # noqa: E402
from rayconnect.source_tasks.postgres.pgoutput import (  # noqa: E402
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    Update,
    decode,
    ms_of,
)
from rayconnect.source_tasks.postgres.stream import WalStream  # noqa: E402

TABLES = [f"t{i}" for i in range(10)]
PUB = "bench_pub"


def pgbench(server: PostgresServer, *args: str) -> None:
    script = Path(server.root) / "upsert.sql"
    lines = ["\\set id random(1, 200000)", "BEGIN;"]
    lines += [
        f"INSERT INTO {t} VALUES (:id, 1, 'some text of a row') "
        f"ON CONFLICT (id) DO UPDATE SET v = {t}.v + 1;"
        for t in TABLES
    ]
    script.write_text("\n".join([*lines, "END;"]) + "\n")
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    subprocess.run(
        [str(BIN / "pgbench"), "-n", "-f", str(script), "-h", "127.0.0.1",
         "-p", str(server.port), "-U", "postgres", *args, "postgres"],
        check=True, capture_output=True, env=env,
    )  # fmt: skip


def settings(server: PostgresServer, slot: str, **kw: Any) -> PostgresSettings:
    return PostgresSettings(
        dsn=server.dsn, slot=slot, tables=TABLES, publication=PUB,
        password_file=server.password_file, snapshot=False, **kw,
    )  # fmt: skip


async def raw_stream(server: PostgresServer, changes: int) -> float:
    stream = WalStream(settings(server, "raw"), PUB)
    seen, t0 = 0, time.perf_counter()
    while seen < changes:
        payload = stream.read()
        if payload is None:
            await stream.wait(0.1)
        elif payload[:1] in (b"I", b"U", b"D"):
            seen += 1
    elapsed = time.perf_counter() - t0
    stream.close()
    return seen / elapsed


_DEBEZIUM_TYPES = {"int": "int32", "long": "int64", "string": "string", "boolean": "boolean"}


def debezium_schema(shape: TableShape) -> bytes:
    """The ``schema`` Debezium's JSON converter puts beside each event of ``shape`` (its
    connect types; this bench's tables have ints and text only)."""
    from rayconnect.source_tasks.postgres.column_types import lake_type

    row = [
        {"type": _DEBEZIUM_TYPES.get(lake_type(c.type_oid, c.type_modifier), "string"),
         "optional": not c.key, "field": c.name}
        for c in shape.columns
    ]  # fmt: skip
    name = f"plain.{shape.schema}.{shape.table}"
    source = [
        {"type": t, "optional": o, "field": f}
        for t, o, f in [
            ("string", False, "version"), ("string", False, "connector"),
            ("string", False, "name"), ("int64", False, "ts_ms"), ("string", True, "snapshot"),
            ("string", False, "db"), ("string", False, "schema"), ("string", False, "table"),
            ("int64", True, "txId"), ("int64", True, "lsn"),
        ]
    ]  # fmt: skip
    schema = {
        "type": "struct", "optional": False, "name": f"{name}.Envelope",
        "fields": [
            {"type": "struct", "fields": row, "optional": True, "name": f"{name}.Value",
             "field": "before"},
            {"type": "struct", "fields": row, "optional": True, "name": f"{name}.Value",
             "field": "after"},
            {"type": "struct", "fields": source, "optional": False,
             "name": "io.debezium.connector.postgresql.Source", "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }  # fmt: skip
    return msgspec.json.encode(schema)


async def plain_loop(
    server: PostgresServer, bootstrap: str, changes: int, slot: str = "plain",
    envelope: bool = False,
) -> float:
    """What one would write without rayconnect: same events, aiokafka, no transactions;
    ``envelope``: each value in Debezium's ``{"schema", "payload"}`` wrapper."""
    stream = WalStream(settings(server, slot), PUB)
    events = EventBuilder("plain", lambda s, t: f"plain.{s}.{t}", False, "postgres")
    wrappers: dict[int, bytes] = {}
    p = producer(bootstrap, None)
    await p.start()
    relations: dict[int, RowCodec] = {}
    seen, futures, txn, last_commit = 0, [], None, 0
    t0 = time.perf_counter()
    while seen < changes:
        payload = stream.read()
        if payload is None:
            if futures:
                await asyncio.gather(*futures)
                futures = []
                stream.confirm(last_commit)
            await stream.wait(0.1)
            continue
        m = decode(payload)
        if isinstance(m, Begin):
            txn = m
        elif isinstance(m, Commit):
            last_commit = m.commit_lsn
            if len(futures) >= 5000:
                await asyncio.gather(*futures)
                futures = []
                stream.confirm(last_commit)
        elif isinstance(m, Relation):
            shape = TableShape(m.schema, m.table, m.columns, ("id",))
            relations[m.relation_id] = RowCodec(shape, types=False)
            wrappers[m.relation_id] = b'{"schema":' + debezium_schema(shape) + b',"payload":'

        elif isinstance(m, Insert | Update | Delete):
            assert txn is not None and not isinstance(m, Delete)
            codec = relations[m.relation_id]
            source = events.source(
                codec.shape, lsn=txn.final_lsn, txid=txn.xid,
                commit_ms=ms_of(txn.commit_ts_us), snapshot=False,
            )  # fmt: skip
            (record,) = events.records(
                codec.shape, "c" if isinstance(m, Insert) else "u", None, codec.row(m.new),
                codec.key(m.new), source=source, now_ms=int(time.time() * 1000), offset=None,
                source_partition=None,
            )  # fmt: skip
            value = record.value
            if envelope:
                value = wrappers[m.relation_id] + value + b"}"
            futures.append(await p.send(record.topic, value, key=record.key))
            seen += 1
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - t0
    await stop_quietly(p)
    stream.close()
    return seen / elapsed


#: the tuned run: polls of up to 20,000 changes (whole Postgres transactions, default
#: 5,000), so a Kafka transaction carries 4x the records for one commit
TUNED_TASK = {"batch_size": 20_000}


async def exactly_once(
    server: PostgresServer, bootstrap: str, changes: int, name: str, tuned: bool = False,
    types: bool = True,
) -> float:
    s = SourceSettings(name=name, target=KafkaTarget(bootstrap), transaction_boundary="connector")
    await prepare_generation(s)
    fields = settings(
        server, name, topic_prefix=name, **(TUNED_TASK if tuned else {}),
        column_types="header" if types else "none",
    )  # fmt: skip
    task = PostgresSource(**msgspec.structs.asdict(fields))
    return await committed_rate(TaskRunner(s, 0, task), changes)


def _latency_task(dsn_port: int, root: str, bootstrap: str, stop_at: float) -> None:
    server = PostgresServer(Path(root), dsn_port)

    async def run() -> None:
        s = SourceSettings(
            name="lat", target=KafkaTarget(bootstrap), transaction_boundary="connector"
        )
        await prepare_generation(s)
        fields = msgspec.structs.asdict(settings(server, "lat", topic_prefix="lat"))
        runner = TaskRunner(s, 0, PostgresSource(**fields))
        main = asyncio.create_task(runner.run())
        while time.time() < stop_at:
            if main.done():
                main.result()
            await asyncio.sleep(0.2)
        runner.stop()
        await main

    asyncio.run(run())


async def latency(
    server: PostgresServer, bootstrap: str, rate: int, seconds: int
) -> dict[str, float]:
    from aiokafka import AIOKafkaConsumer

    from rayconnect.kafka import compat

    for t in TABLES:
        await create_topic(bootstrap, f"lat.public.{t}", 2, exist_ok=True)
    stop_at = time.time() + seconds + 25
    child = multiprocessing.get_context("spawn").Process(
        target=_latency_task, args=(server.port, str(server.root), bootstrap, stop_at)
    )
    child.start()
    consumer = compat.own(AIOKafkaConsumer(  # read_committed on tansu: rayconnect's fixes
        *[f"lat.public.{t}" for t in TABLES], bootstrap_servers=bootstrap,
        isolation_level="read_committed", auto_offset_reset="earliest", enable_auto_commit=False,
        fetch_max_wait_ms=50,  # the reader's own wait (aiokafka: 500 ms) is not the pipeline's
    ))  # fmt: skip
    await consumer.start()
    deadline = time.monotonic() + 60  # the task's slot, then the load
    while "lat" not in server.psql("SELECT string_agg(slot_name, ',') FROM pg_replication_slots"):
        if time.monotonic() > deadline:
            raise TimeoutError("the latency task did not create its slot")
        await asyncio.sleep(0.2)
    load = asyncio.create_task(
        asyncio.to_thread(
            pgbench, server, "-R", str(rate // 10), "-T", str(seconds), "-c", "2", "-j", "1"
        )
    )
    delays: list[float] = []
    quiet_since = time.monotonic()
    while not load.done() or time.monotonic() - quiet_since < 3.0:  # 3 s without any: all in
        batch = await consumer.getmany(timeout_ms=200)
        now = time.time() * 1000
        for records in batch.values():
            for r in records:
                delays.append(now - msgspec.json.decode(r.value)["source"]["ts_ms"])
        if batch:
            quiet_since = time.monotonic()
    await load
    await consumer.stop()
    child.join(60)
    delays.sort()
    pick = lambda q: delays[min(len(delays) - 1, int(q * len(delays)))]  # noqa: E731
    return {"changes": len(delays), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": delays[-1]}


def _freeze_start_up() -> None:
    """What the task actor does at its start (a rayconnect without it: nothing)."""
    try:
        from rayconnect.actors.source_task import freeze_start_up
    except ImportError:
        return
    freeze_start_up()


def _child(spec: dict[str, Any]) -> None:
    """One exactly-once way in this process (``--child``): prints its rate and CPU."""
    _freeze_start_up()
    server = PostgresServer(Path(spec["root"]), spec["port"])
    start = time.process_time()
    rate = asyncio.run(
        exactly_once(server, spec["bootstrap"], spec["changes"], spec["slot"], spec["tuned"])
    )
    print(json.dumps({"rate": rate, "cpu": time.process_time() - start}))


async def in_child(
    server: PostgresServer, bootstrap: str, changes: int, slot: str, tuned: bool, src: str | None
) -> tuple[float, float]:
    """``exactly_once`` in a process of its own, importing rayconnect from ``src`` (None:
    this tree): (changes/s, CPU seconds of that process)."""
    spec = {"root": str(server.root), "port": server.port, "bootstrap": bootstrap,
            "changes": changes, "slot": slot, "tuned": tuned}  # fmt: skip
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["rate"], result["cpu"]


def extract_src(rev: str, into: str) -> str:
    """rayconnect's ``src`` at git revision ``rev``, written below ``into``."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return str(Path(into) / "src")


async def _cpu(run: Any, cpu: list[float]) -> Any:
    """``await run``, appending the CPU seconds this process spent on it to ``cpu``."""
    start = time.process_time()
    result = await run
    cpu.append(time.process_time() - start)
    return result


#: the ways of ``--before``: (slot, tuned, the revision's tree or this one)
BEFORE_AFTER = [("eobefore", False, True), ("eobeforetuned", True, True), ("eoafter", False, False),
                ("eoaftertuned", True, False)]  # fmt: skip


async def main(txns: int, rate: int, seconds: int, before: str | None) -> None:
    _freeze_start_up()
    with postgres_server() as server, EmbeddedBroker("bench-pg") as broker, \
            tempfile.TemporaryDirectory(prefix="rc-pgsrc-before-") as tree:  # fmt: skip
        bootstrap = broker.bootstrap_servers
        old_src = extract_src(before, tree) if before else None
        server.psql(
            ";".join(f"CREATE TABLE {t} (id int PRIMARY KEY, v int, s text)" for t in TABLES)
        )
        server.psql(f"CREATE PUBLICATION {PUB} FOR TABLE {', '.join(TABLES)}")
        children = [slot for slot, _, _ in BEFORE_AFTER] if before else []
        for slot in ("raw", "plain", "plainenv", "eo", "eonotypes", "eotuned", *children):
            server.psql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        for prefix in ("plain", "eo", "eonotypes", "eotuned", *children):
            for t in TABLES:
                await create_topic(bootstrap, f"{prefix}.public.{t}", 2)
        t0 = time.perf_counter()
        pgbench(server, "-t", str(txns // 4), "-c", "4", "-j", "2")
        changes = (txns // 4) * 4 * len(TABLES)
        write_s = time.perf_counter() - t0
        cpu: list[float] = []  # CPU seconds of this process per way: load-independent
        ceiling = await _cpu(raw_stream(server, changes), cpu)
        plain = await _cpu(plain_loop(server, bootstrap, changes), cpu)
        plain_env = await _cpu(
            plain_loop(server, bootstrap, changes, "plainenv", envelope=True), cpu
        )
        eo = await _cpu(exactly_once(server, bootstrap, changes, "eo"), cpu)
        no_types = await _cpu(
            exactly_once(server, bootstrap, changes, "eonotypes", types=False), cpu
        )
        tuned = await _cpu(exactly_once(server, bootstrap, changes, "eotuned", tuned=True), cpu)
        compared = []  # (way, changes/s, CPU s of its process)
        for slot, tuned_child, old in BEFORE_AFTER if before else []:
            way = f"{'@' + before[:10] if old else 'this tree'}{' tuned' if tuned_child else ''}"
            got = await in_child(
                server, bootstrap, changes, slot, tuned_child, old_src if old else None
            )
            compared.append((way, *got))
        # the slots read are dropped: max_replication_slots (10) leaves none for the latency task
        server.psql(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active"
        )
        lat = await latency(server, bootstrap, rate, seconds)
    print(
        f"{changes:,} changes ({txns:,} Postgres transactions of 10 upserts, 10 tables; "
        f"pgbench wrote them in {write_s:.1f} s), embedded broker, one task, 2-core machine\n"
    )
    print(f"{'way':<14} {'changes/s':>10} {'x plain':>8} {'CPU us/change':>14}")
    ways = [("raw stream", ceiling), ("plain loop", plain), ("plain+schemas", plain_env)]
    ways += [("exactly-once", eo), ("eo no header", no_types), ("eo tuned", tuned)]
    for (way, v), cpu_s in zip(ways, cpu, strict=True):
        print(f"{way:<14} {v:>10,.0f} {v / plain:>8.2f} {cpu_s / changes * 1e6:>14.1f}")
    if compared:
        print(f"\nexactly once, each in a process of its own (--before {before}):")
        print(f"{'rayconnect':<22} {'changes/s':>10} {'x raw':>6} {'CPU us/change':>14}")
        for way, v, cpu_s in compared:
            print(f"{way:<22} {v:>10,.0f} {v / ceiling:>6.2f} {cpu_s / changes * 1e6:>14.1f}")
    print(
        f"(plain+schemas: the plain loop, values in Debezium's schema-ful JSON; eo: the "
        f"rayconnect.value_schema header on every record, eo no header: column_types none; "
        f"eo tuned: {TUNED_TASK}, defaults otherwise)"
    )
    print(
        f"\ncommit -> visible (read_committed) at {rate:,} changes/s for {seconds} s: "
        f"{lat['changes']:,} changes, p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms, "
        f"max {lat['max_ms']:.0f} ms"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--txns", type=int, default=20_000)
    ap.add_argument("--rate", type=int, default=5_000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--before", default=None, help="a git revision to compare with")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(json.loads(args.child))
    else:
        asyncio.run(main(args.txns, args.rate, args.seconds, args.before))
