"""Chaos soak of the database mirror (issue 40.4): a Postgres-fed mirror into Delta (or
Iceberg) tables under the mirror workload's write load, a random fault every 10-30 s, and
after each one every lake table compared to ``SELECT *`` (exact row sets, values and types).
Run on purpose, as root (network namespaces); a 4-minute version is in the ``slow`` pytest
group (tests/integration/netns/test_mirror_chaos_soak.py).

    .venv/bin/python bench/mirror_chaos_soak.py --minutes 30   # writes bench/results/chaos/mirror-*

Postgres runs in a network namespace of its own (tests/fixtures/netns.py: a host ``pg`` on a
bridge), so the source reaches it over a veth the soak can take down; the write load and the
checker reach it over its Unix socket (a filesystem path, not cut by the network faults: the
database keeps changing while the source is cut off). The broker (tansu, its log on an
embedded S3: a restart loses nothing it acknowledged), Ray (one local node) and Spark run in
the root namespace. Tables: six of ``rayconnect.demo.mirror_database`` (TOASTed text and
int[], numeric, timestamptz, jsonb, NULL flips; 400 keys each under upserts, updates and
deletes) and ``big`` (``--big-rows`` rows, the load writing to its first 400 keys too), the
table the interrupted snapshots read.

Faults (``--gap`` seconds apart, 10-30; ``--each-kind-first``: one of each kind in order
before the random draw, past ``--minutes`` if need be), a kind at random: ``kill`` (ray.kill
or SIGKILL of the source task, the sink's coordinator, a participant host, the writer or a
reader), ``pg-crash`` (every Postgres process SIGKILLed - the postmaster and its backends,
as a machine crash - then started: crash recovery), ``network`` (the Postgres host's link
down, or a one-way cut: what Postgres sends to the source dropped, 5-30 s), ``broker``
(tansu SIGKILLed, started 2-10 s later), ``snapshot``
(``SourcePipelineHandle.snapshot(["big"])``, then the source task killed 0-2 s after the
snapshot's first rows reached the topic, ray.kill or SIGKILL; the offsets ``big``'s topic
grew by until the kill say the snapshot was still running, and the fault waits until the
topic holds, after the request, a snapshot read of every key of ``big`` the load does not
touch: the interrupted snapshot was redone to its end) and ``truncate`` (a table truncated,
then rows inserted in the same transaction). ``tc netem`` and iptables are not in this
kernel (shared notes/network.md): no loss or delay faults.

After each fault: faults healed, the load running 5 s more, then paused (no transaction
open), and the time from the heal until every lake table equals ``SELECT *`` (checked every
2 s) is the fault's recovery time; the load resumes. A table still different after
``--recovery-limit`` seconds is a violation (the soak goes on: a later check may show it
stuck or late). The report (``results.json``, ``results.md``, ``run.log``) is written after
every fault and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2
import ray

BENCH = Path(__file__).resolve().parent
TESTS = BENCH.parent / "tests"
sys.path[:0] = [str(BENCH), str(TESTS)]

from common import RaySession, cleanup_private_tmp  # noqa: E402
from fixtures.netns import Host, TestNetwork, why_no_namespaces  # noqa: E402

from rayconnect.actors import names  # noqa: E402
from rayconnect.demo import chaos  # noqa: E402
from rayconnect.demo.local_postgres import BIN, USER, PostgresServer, require_installed  # noqa: E402
from rayconnect.demo.mirror_database import (  # noqa: E402
    KEYS,
    MirrorDatabase,
    difference,
    mirror_sink,
    mirror_source,
)
from rayconnect.kafka.admin import high_watermarks  # noqa: E402
from rayconnect.kafka.broker_storage import on_s3  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402
from rayconnect.storage.embedded_s3 import EmbeddedS3  # noqa: E402

OUT = BENCH / "results" / "chaos"
SOURCE, SINK, PREFIX = "msoak-src", "msoak", "msoak"
TABLES = [f"t{i:02d}" for i in range(6)]
BIG = "big"
KINDS = ("kill", "pg-crash", "network", "broker", "snapshot", "truncate")
#: the load runs this long after a fault is healed before the check: what the check then
#: compares holds changes the recovered pipelines carried, not only what came before it
AFTER_FAULT_S = 5.0
#: offsets ``big``'s topic grows by once a snapshot is underway (a chunk is ~5,000 rows)
SNAPSHOT_UNDERWAY = 2_000
ROLES = ("source-task", "coordinator", "participant", "writer", "reader")


async def snapshot_reads_after(
    bootstrap: str, topic: str, start: dict[int, int], keys: range, timeout_s: float
) -> int:
    """The distinct ``keys`` read by snapshot reads (op r) committed in ``topic`` from
    offsets ``start`` on, read until every one of them is there (an interrupted snapshot
    redone to its end) or ``timeout_s`` ran out: how many."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from rayconnect.kafka import compat

    consumer = compat.own(  # read_committed on tansu: rayconnect's fixes
        AIOKafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
    )
    await consumer.start()
    found: set[int] = set()
    try:
        tps = [TopicPartition(topic, p) for p in start]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start[tp.partition])
        deadline = time.monotonic() + timeout_s
        while len(found) < len(keys) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    if r.key and r.value and b'"op":"r"' in r.value:
                        key = json.loads(r.key)["id"]
                        if key in keys:
                            found.add(key)
    finally:
        await consumer.stop()
    return len(found)


class NamespacedPostgres(PostgresServer):
    """A Postgres server started inside test host ``host``'s network namespace, listening
    on the host's address; this process (the load, the checker) uses its Unix socket,
    which no network fault cuts."""

    def __init__(self, root: Path, host: Host) -> None:
        super().__init__(root)
        self.host = host

    @property
    def dsn(self) -> str:
        return f"host={self.host.ip} port={self.port} user={USER} dbname=postgres"

    @property
    def password_dsn(self) -> str:
        return f"host={self.root} port={self.port} user={USER} dbname=postgres"

    def init(self, wal_level: str = "logical") -> None:
        super().init(wal_level)
        with (self.data / "postgresql.conf").open("a") as conf:  # the last setting wins
            conf.write(f"listen_addresses = '{self.host.ip}'\n")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.host.network.subnet} scram-sha-256\n")

    def start(self) -> None:
        pg_ctl = [str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start"]
        done = subprocess.run(
            self.host.command("runuser", "-u", USER, "--", *pg_ctl),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start in {self.host.ns}: {done.stderr.strip()}")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                psycopg2.connect(self.password_dsn).close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def crash(self) -> None:
        """Every process of the server SIGKILLed at once (the host's namespace holds only
        them): the next start runs crash recovery."""
        self.host.kill_all()
        # what a machine's restart clears: the postmaster's PID file and its socket's lock
        # file (the dead postmaster's PID may belong to another process by now, and Postgres
        # refuses to start over a lock file whose PID lives)
        for stale in (self.data / "postmaster.pid", *self.root.glob(".s.PGSQL.*")):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


class MirrorSoak:
    def __init__(self, args: argparse.Namespace, net: TestNetwork, root: Path) -> None:
        self.args, self.net, self.root = args, net, root
        self.rng = random.Random(args.seed)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "run.log").write_text("")
        self.faults: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.t0 = time.monotonic()
        self.final: dict[str, Any] = {}

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {text}"
        print(line, flush=True)
        with (self.out / "run.log").open("a") as f:
            f.write(line + "\n")

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        pg_root = self.root / "pg"
        pg_root.mkdir()
        shutil.chown(pg_root, USER)
        self.pg = NamespacedPostgres(pg_root, self.net["pg"])
        self.pg.init()
        self.pg.start()
        self.pg.wait_ready()
        self.db = MirrorDatabase(self.pg, names=[*TABLES, BIG], seed=self.args.seed)
        self.db.create(rows_per_table=100)
        self.pg.psql(
            f"INSERT INTO {BIG} (id, name, qty, total, changed_ms, note) SELECT g, 'n' || g, "
            f"g % 1000, g, 0, repeat('x', 60) FROM generate_series({KEYS}, "
            f"{KEYS + self.args.big_rows - 1}) g"
        )
        self.s3 = EmbeddedS3().start()
        self.broker = EmbeddedBroker(
            "msoak", log_dir=self.root / "kafka", storage=on_s3(self.s3)
        ).start()
        bootstrap = self.broker.bootstrap_servers
        self.lake = self.root / "lake"
        self.src_pipeline = mirror_source(SOURCE, self.pg, bootstrap, self.db.names, PREFIX)
        self.source = self.src_pipeline.start()
        iceberg = self.args.format == "iceberg"
        self.sink_pipeline = mirror_sink(
            SINK, bootstrap, self.lake, PREFIX, iceberg, commit_interval_s=2
        )
        self.sink = self.sink_pipeline.start(timeout_s=300)
        self.lake_of = self.sink_pipeline.config.sink if iceberg else self.lake
        self.db.start(changes_per_s=self.args.rate)
        self.started = {"kind": "start"}
        self.wait_recovered(self.started)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.db.stop()
        for name, stop in (("sink", lambda: self.sink.stop(commit=False)),
                           ("source", lambda: self.source.stop(release=True))):  # fmt: skip
            if hasattr(self, name):
                try:
                    stop()
                except Exception as e:
                    self.say(f"stopping {name}: {type(e).__name__}: {e}")
        for name in ("broker", "s3"):
            if hasattr(self, name):
                getattr(self, name).stop()
        if hasattr(self, "pg"):
            self.pg.stop("immediate")

    # -- faults ---------------------------------------------------------------------------

    def victim(self, role: str) -> str:
        if role == "source-task":
            return names.task(SOURCE, 0)
        if role == "coordinator":
            return names.coordinator(SINK)
        if role == "writer":
            return names.writer(SINK)
        prefix = f"{SINK}/participants/" if role == "participant" else f"{SINK}/reader/"
        found = sorted(
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)
        )
        return self.rng.choice(found)

    def inject(self, kind: str) -> dict[str, Any]:
        """Inject one fault of ``kind``, heal it; what was done."""
        rng, host = self.rng, self.net["pg"]
        how = rng.choice(chaos.HOW)
        if kind == "kill":
            role = rng.choice(ROLES)
            chaos.kill_actor(self.victim(role), how)
            return {"role": role, "how": how}
        if kind == "pg-crash":
            self.db.pause()
            self.pg.crash()
            time.sleep(rng.uniform(1, 5))
            self.pg.start()
            self.pg.wait_ready()
            self.db.resume()
            return {}
        if kind == "network":
            cut, seconds = rng.choice(("link-down", "one-way")), rng.uniform(5, 30)
            if cut == "link-down":
                host.link_down()
            else:
                host.drop_to(self.net.root_ip)
            time.sleep(seconds)
            host.heal()
            return {"cut": cut, "seconds": round(seconds, 1)}
        if kind == "broker":
            os.kill(self.broker.pid or 0, signal.SIGKILL)
            down = rng.uniform(2, 10)
            time.sleep(down)
            self.broker.start()
            return {"down_s": round(down, 1)}
        if kind == "snapshot":
            topic = f"{PREFIX}.public.{BIG}"
            before = self.topic_ends(topic)
            asked = time.monotonic()
            self.source.snapshot([BIG])
            # killed mid-snapshot: once its first chunk is in the topic (the load's own
            # changes to the table add a few dozen records a second)
            deadline = asked + 120
            while sum(self.topic_ends(topic).values()) - sum(before.values()) < SNAPSHOT_UNDERWAY:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            time.sleep(rng.uniform(0.0, 2.0))
            delay = time.monotonic() - asked
            at_kill = self.topic_ends(topic)
            chaos.kill_actor(names.task(SOURCE, 0), how)
            # the load changes keys below KEYS only: every key above must be read again
            keys = range(KEYS, KEYS + self.args.big_rows)
            reads = asyncio.run(snapshot_reads_after(
                self.broker.bootstrap_servers, topic, before, keys, self.args.recovery_limit
            ))  # fmt: skip
            return {
                "how": how,
                "after_s": round(delay, 1),
                "offsets_at_kill": sum(at_kill.values()) - sum(before.values()),
                "keys_to_read": len(keys),
                "keys_read": reads,
                "snapshot_done_s": round(time.monotonic() - asked, 1),
            }
        if kind == "truncate":
            table = rng.choice(TABLES)
            self.db.truncate(table, then_insert=rng.choice((0, 5)))
            return {"table": table}
        raise ValueError(kind)

    def topic_ends(self, topic: str) -> dict[int, int]:
        """The topic's high watermarks (records and transaction markers)."""
        return asyncio.run(high_watermarks(self.broker.bootstrap_servers, topic))

    def until_mirrored(self) -> str | None:
        """Check every 2 s until every lake table equals ``SELECT *``: None, or the last
        difference seen when ``--recovery-limit`` ran out."""
        deadline = time.monotonic() + self.args.recovery_limit
        problem: str | None = "never checked"
        while time.monotonic() < deadline:
            try:
                problem = difference(self.db, self.lake_of)
            except Exception as e:  # a lake table being committed, Postgres restarting
                problem = f"{type(e).__name__}: {e}"
            if problem is None:
                return None
            time.sleep(2.0)
        return problem

    def wait_recovered(self, fault: dict[str, Any]) -> None:
        """Pause the load, time until every lake table equals ``SELECT *``, resume."""
        t = time.monotonic()
        self.db.pause()
        problem = self.until_mirrored()
        took = time.monotonic() - t + (0.0 if fault["kind"] == "start" else AFTER_FAULT_S)
        fault["recovery_s"] = round(took, 1) if problem is None else None
        if problem is not None:
            self.violations.append(f"after {fault['kind']} at {fault.get('at_s')}: {problem}")
            self.say(f"NOT mirrored after {self.args.recovery_limit:.0f} s: {problem[:400]}")
        self.db.resume()

    def run(self) -> dict[str, Any]:
        self.start()
        self.say(
            f"started; every table mirrored {self.started['recovery_s']} s after the load began"
        )
        end = self.t0 + self.args.minutes * 60
        kinds = self.args.kinds.split(",")
        first = list(kinds) if self.args.each_kind_first else []
        low, high = (float(x) for x in self.args.gap.split(","))
        while time.monotonic() < end or first:
            time.sleep(self.rng.uniform(low, high))
            kind = first.pop(0) if first else self.rng.choice(kinds)
            fault: dict[str, Any] = {"kind": kind, "at_s": round(time.monotonic() - self.t0)}
            try:
                fault.update(self.inject(kind))
            except Exception as e:
                fault["error"] = f"{type(e).__name__}: {e}"[:300]
                self.net.heal()
                with contextlib.suppress(Exception):  # running already: pg_ctl refuses
                    self.pg.start()
                with contextlib.suppress(Exception):
                    self.db.resume()
            self.say(f"fault {fault}")
            time.sleep(AFTER_FAULT_S)  # changes made after the fault must come through too
            self.wait_recovered(fault)
            self.say(f"  recovered in {fault['recovery_s']} s")
            self.faults.append(fault)
            self.save()
            if self.db.error is not None:
                self.violations.append(f"the write load failed: {self.db.error!r}")
                break
        self.db.stop()
        self.final = self.check_final()
        return self.save(complete=True)

    def check_final(self) -> dict[str, Any]:
        """The load stopped: every table equal to ``SELECT *`` within the recovery limit;
        row counts per table."""
        began = time.monotonic()
        problem = self.until_mirrored()
        if problem is not None:
            self.violations.append(f"final: {problem}")
        rows = {t: len(self.db.rows_of(t)) for t in self.db.names}
        task = self.source.status(timeout_s=30).tasks.get(0)
        return {"mirrored": problem is None, "caught_up_s": round(time.monotonic() - began, 1),
                "rows": rows, "changes": self.db.changes,
                "transactions": self.db.transactions,
                "source_task_restarts": task.restarts if task else None}  # fmt: skip

    def save(self, complete: bool = False) -> dict[str, Any]:
        report = {
            "complete": complete,
            "minutes": self.args.minutes,
            "format": self.args.format,
            "rate": self.args.rate,
            "seed": self.args.seed,
            "elapsed_s": round(time.monotonic() - self.t0),
            "faults": self.faults,
            "faults_by_kind": dict(Counter(f["kind"] for f in self.faults)),
            "violations": self.violations,
            "final": self.final,
            "changes": self.db.changes,
        }
        (self.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
        (self.out / "results.md").write_text(markdown(report))
        return report


def markdown(report: dict[str, Any]) -> str:
    recoveries = [f["recovery_s"] for f in report["faults"] if f.get("recovery_s") is not None]
    lines = [
        f"# Mirror chaos soak: {report['minutes']} min, {report['format']}, "
        f"{report['rate']} changes/s, seed {report['seed']}"
        f"{'' if report['complete'] else ' (incomplete)'}",
        "",
        f"- faults by kind: {report['faults_by_kind']}",
        f"- recovery (until every table equals SELECT *): max "
        f"{max(recoveries, default=0)} s, median "
        f"{sorted(recoveries)[len(recoveries) // 2] if recoveries else 0} s",
        f"- changes written by the load: {report['changes']:,}",
        f"- final: {report['final']}",
        f"- violations: {report['violations'] or 'none'}",
        "",
        "| at s | fault | detail | recovered in s |",
        "|---:|---|---|---:|",
    ]
    for f in report["faults"]:
        detail = {k: v for k, v in f.items() if k not in ("kind", "at_s", "recovery_s")}
        lines.append(f"| {f['at_s']} | {f['kind']} | {detail} | {f.get('recovery_s')} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--format", choices=("delta", "iceberg"), default="delta")
    ap.add_argument("--rate", type=float, default=200.0, help="the load's changes/s")
    ap.add_argument("--big-rows", type=int, default=100_000)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument(
        "--each-kind-first",
        action="store_true",
        help="one fault of each kind, in order, first (past --minutes if need be)",
    )
    ap.add_argument("--gap", default="10,30", help="seconds between faults: low,high")
    ap.add_argument("--recovery-limit", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(OUT / f"mirror-{time.strftime('%Y%m%d-%H%M')}")
    return args


def soak(args: argparse.Namespace) -> dict[str, Any]:
    reason = why_no_namespaces()
    if reason is not None:
        raise SystemExit(f"the mirror soak needs network namespaces: {reason}")
    require_installed()
    root = Path(tempfile.mkdtemp(prefix="rayconnect-msoak-"))
    os.chmod(root, 0o755)  # the postgres user reaches its folder below
    run: MirrorSoak | None = None
    try:
        with TestNetwork(["pg"]) as net, RaySession():
            run = MirrorSoak(args, net, root)
            try:
                return run.run()
            finally:
                run.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        cleanup_private_tmp()


if __name__ == "__main__":
    report = soak(parse())
    print(markdown(report))
    sys.exit(1 if report["violations"] else 0)
