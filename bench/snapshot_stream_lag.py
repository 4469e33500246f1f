"""Streaming while a snapshot runs (issue 40's benchmark row "lag of streamed changes p99 <=
5 s"): the lag of changes streamed by the Postgres source while an on-demand snapshot of a
large table runs, p50/p99, beside the same stream without a snapshot, in the same run.

A real Postgres 15 (``rayconnect.demo.local_postgres``), an embedded broker, a local Ray; a
table ``hot`` (100 rows) updated at ``--rate`` single-statement transactions a second, and a
table ``big`` of ``--rows`` rows of ~120 bytes (id, name, qty, total, a 60-character note).
The source pipeline (the mirror's: ``mirror_source``, the source's defaults) captures both;
its initial snapshot reads ``big`` once before anything is measured.

Lag of a change = the moment a ``read_committed`` consumer of ``hot``'s topic in this process
receives its event (``fetch_max_wait_ms`` 50) minus the event's ``source.ts_ms``, the commit
timestamp Postgres gave the transaction (same machine, same clock): commit in Postgres ->
readable in Kafka, exactly.

1. **baseline**: ``--seconds`` of the load, no snapshot;
2. **snapshot**: ``SourcePipelineHandle.snapshot(["big"])`` (DBLog watermarked chunks while
   the stream flows) with the load running, measured from the request until the source has
   committed the snapshot's rows (its ``records_committed`` grew by the table's rows plus
   the streamed changes), then ``--seconds`` more (the tail after it).

    .venv/bin/python bench/snapshot_stream_lag.py [--rows 2000000] [--rate 100] [--seconds 60]

Prints a markdown table and writes it to ``bench/results/snapshot_lag/`` (``.md``, ``.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RaySession, cleanup_private_tmp, percentiles  # noqa: E402

from rayconnect.demo.local_postgres import PostgresServer, postgres_server  # noqa: E402
from rayconnect.demo.mirror_database import mirror_source  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "snapshot_lag"
PREFIX, NAME = "lag", "lag-src"


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def make_tables(server: PostgresServer, rows: int) -> None:
    server.psql(
        "CREATE TABLE hot (id int PRIMARY KEY, v bigint NOT NULL);"
        "INSERT INTO hot SELECT g, 0 FROM generate_series(0, 99) g;"
        "CREATE TABLE big (id bigint PRIMARY KEY, name text, qty int, total bigint, note text);"
        f"INSERT INTO big SELECT g, 'name-' || g, g % 1000, g * 7, repeat('x', 60) "
        f"FROM generate_series(1, {rows}) g;"
        "ANALYZE big;"
    )


class Load(threading.Thread):
    """``rate`` single-statement update transactions a second on ``hot``."""

    def __init__(self, server: PostgresServer, rate: float) -> None:
        super().__init__(daemon=True)
        self.server, self.rate = server, rate
        self.committed = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        conn = psycopg2.connect(self.server.password_dsn)
        conn.autocommit = True
        next_at = time.monotonic()
        with conn.cursor() as cur:
            while not self.stop_event.is_set():
                cur.execute("UPDATE hot SET v = v + 1 WHERE id = %s", (self.committed % 100,))
                self.committed += 1
                next_at += 1 / self.rate
                time.sleep(max(0.0, next_at - time.monotonic()))
        conn.close()


class LagReader(threading.Thread):
    """Tails ``hot``'s topic (read_committed, from its end at start): per event, the
    wall time it arrived and its lag in ms (arrival - ``source.ts_ms``)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: list[tuple[float, float]] = []
        self.ready = threading.Event()
        self.stop_event = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer

        from rayconnect.kafka import compat

        consumer = compat.own(  # read_committed on tansu: rayconnect's fixes
            AIOKafkaConsumer(
                self.topic,
                bootstrap_servers=self.bootstrap,
                isolation_level="read_committed",
                auto_offset_reset="latest",
                enable_auto_commit=False,
                fetch_max_wait_ms=50,
            )
        )
        await consumer.start()
        try:
            while not self.stop_event.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                self.ready.set()
                now = time.time()
                for records in batches.values():
                    for r in records:
                        event = json.loads(r.value)
                        if event["op"] == "u":
                            self.seen.append((now, now * 1000 - event["source"]["ts_ms"]))
        finally:
            await consumer.stop()

    def lags_between(self, start: float, end: float) -> list[float]:
        return [lag for at, lag in self.seen if start <= at < end]


def committed(source: Any) -> int:
    try:
        return int(source.status(timeout_s=5).records_committed)
    except Exception:
        return -1


def wait_committed(source: Any, at_least: int, timeout_s: float) -> None:
    """Until the source has committed ``at_least`` records (polled every 0.2 s)."""
    deadline = time.monotonic() + timeout_s
    while committed(source) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the source did not commit {at_least:,} records")
        time.sleep(0.2)


def row(phase: str, lags: list[float], seconds: float, load: str, **extra: Any) -> dict[str, Any]:
    p = percentiles(lags, (50, 99))
    return {
        "phase": phase,
        "seconds": round(seconds, 1),
        "changes": len(lags),
        "p50_ms": round(p["p50"]),
        "p99_ms": round(p["p99"]),
        "max_ms": round(max(lags, default=float("nan"))),
        "load_avg": load,
        **extra,
    }


def main(rows: int, rate: float, seconds: float) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    try:
        with postgres_server() as server, EmbeddedBroker("bench-lag") as broker, RaySession():
            t = time.monotonic()
            make_tables(server, rows)
            print(f"{rows:,} rows made in {time.monotonic() - t:.1f} s", flush=True)
            bootstrap = broker.bootstrap_servers
            source = mirror_source(NAME, server, bootstrap, ["hot", "big"], PREFIX).start()
            t = time.monotonic()
            wait_committed(source, rows + 100, 1800)
            print(f"initial snapshot committed in {time.monotonic() - t:.1f} s", flush=True)
            reader = LagReader(bootstrap, f"{PREFIX}.public.hot")
            reader.start()
            reader.ready.wait(60)
            load = Load(server, rate)
            load.start()
            time.sleep(5)  # the load's first changes: the consumer's fetches are warm
            start = time.time()
            time.sleep(seconds)
            end = time.time()
            results.append(row("no snapshot", reader.lags_between(start, end), end - start,
                               load_average()))  # fmt: skip
            print(results[-1], flush=True)

            base, before = committed(source), load.committed
            start = time.time()
            source.snapshot(["big"])
            # the snapshot's rows and the changes streamed meanwhile (~2 s of them may be
            # in flight), all committed
            deadline = time.monotonic() + 3600
            while committed(source) < base + rows + (load.committed - before) - 2 * rate:
                if time.monotonic() > deadline:
                    raise TimeoutError("the snapshot did not end in an hour")
                time.sleep(0.2)
            done = time.time()
            snap_s = done - start
            results.append(row("snapshot running", reader.lags_between(start, done), snap_s,
                               load_average(), snapshot_rows_per_s=round(rows / snap_s)))  # fmt: skip
            print(results[-1], flush=True)
            time.sleep(seconds)
            after = time.time()
            results.append(row("after the snapshot", reader.lags_between(done, after),
                               after - done, load_average()))  # fmt: skip
            print(results[-1], flush=True)
            load.stop_event.set()
            reader.stop_event.set()
            load.join(10)
            reader.join(10)
            source.stop(release=True)
    finally:
        cleanup_private_tmp()
    return results


def table(results: list[dict[str, Any]], rows: int, rate: float) -> str:
    lines = [
        f"Streaming while an on-demand snapshot runs: Postgres 15 -> the Postgres source "
        f"(defaults) -> embedded broker; `hot` updated at {rate:.0f} transactions/s, "
        f"snapshot of `big` ({rows:,} rows of ~120 B) requested mid-stream; lag = commit in "
        f"Postgres (source.ts_ms) -> readable by a read_committed consumer. 2-core machine "
        f"shared with other engineers' runs, load average (1/5/15 min) as printed.",
        "",
        "| phase | seconds | changes | lag p50 | p99 | max | snapshot rows/s | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['phase']} | {r['seconds']} | {r['changes']:,} | {r['p50_ms']:,} ms | "
            f"{r['p99_ms']:,} ms | {r['max_ms']:,} ms | "
            f"{r.get('snapshot_rows_per_s', '') and format(r['snapshot_rows_per_s'], ',')} | "
            f"{r['load_avg']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    found = main(args.rows, args.rate, args.seconds)
    text = table(found, args.rows, args.rate)
    print("\n" + text)
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M")
    (OUT / f"lag-{stamp}.md").write_text(text + "\n")
    (OUT / f"lag-{stamp}.json").write_text(json.dumps(found, indent=1) + "\n")
