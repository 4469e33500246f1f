"""The Postgres source's initial snapshot (issue 40.1): rows/s into Kafka from ``start()``,
with the raw ``COPY`` rate of the same tables beside it - same run.

A real Postgres 15 (rayconnect.demo.local_postgres) and an embedded broker (a fresh one per
pipeline run: tansu's memory store only grows). Rows of ~120 B: ``(id bigint primary key,
a int, b bigint, c double precision, t timestamptz, s text)``.

  big       one table of ``--rows`` (default 10M) with the defaults (``snapshot_parallelism``
            unset: the cluster's CPUs); the raw rate is ``COPY (SELECT * FROM t) TO STDOUT``
            read by psycopg2 into nothing, in the same run
  tables    ``--tables`` tables of ``--table-rows`` (default 20 x 500k) with
            ``snapshot_parallelism`` 1, 2, 4 (``--parallelism``)

Per run: rows/s from ``start()`` to every row committed (the task's ``records_committed``,
which counts the rows its snapshot workers committed), and the CPU seconds per row of each
process kind (Postgres, the broker, the task actor - it plans and tracks chunks -, the
snapshot workers - they read by COPY, encode and produce -, the rest) sampled every 0.5 s.

    .venv/bin/python bench/postgres_snapshot.py [--rows 10000000] [--tables 20]
        [--table-rows 500000] [--parallelism 1,2,4] [--only big,tables]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MemorySampler, RaySession  # noqa: E402

import rayconnect as rc  # noqa: E402
from rayconnect.demo.local_postgres import PostgresServer, postgres_server  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402

ROW = (
    "SELECT g, (g * 7) % 100000, g * 1000003, g / 3.0, "
    "timestamptz '2026-01-01' + g * interval '1 second', 'row ' || md5(g::text) "
    "FROM generate_series({lo}::bigint, {hi}::bigint) g"
)


def make_table(server: PostgresServer, name: str, rows: int) -> None:
    server.psql(
        f"CREATE TABLE {name} (id bigint PRIMARY KEY, a int, b bigint, c double precision, "
        f"t timestamptz, s text)"
    )
    step = 1_000_000
    for lo in range(1, rows + 1, step):
        server.psql(f"INSERT INTO {name} " + ROW.format(lo=lo, hi=min(rows, lo + step - 1)))
    server.psql(f"VACUUM ANALYZE {name}")


def raw_copy(server: PostgresServer, tables: list[str]) -> tuple[float, float]:
    """(rows/s, MiB/s) of ``COPY (SELECT *) TO STDOUT`` of ``tables``, read and dropped."""

    class Sink(io.RawIOBase):
        size = 0

        def write(self, b: Any) -> int:
            self.size += len(b)
            return len(b)

    conn = psycopg2.connect(server.password_dsn)
    sink, rows = Sink(), 0
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        for t in tables:
            cur.copy_expert(f"COPY (SELECT * FROM {t}) TO STDOUT", sink)
            rows += cur.rowcount
    elapsed = time.perf_counter() - t0
    conn.close()
    return rows / elapsed, sink.size / elapsed / 2**20


def _postmaster(server: PostgresServer) -> int:
    data = server.psql("SHOW data_directory")
    return int(Path(data, "postmaster.pid").read_text().split()[0])


def snapshot_run(server: PostgresServer, tables: list[str], rows: int, **task: Any) -> dict:
    """One pipeline from ``start()`` until every row is committed; then stopped, its slot
    dropped."""
    with EmbeddedBroker("bench-snap") as broker:
        source = rc.PostgresSource(
            dsn=server.dsn, slot="bench_snap", tables=tables, publication="bench_snap_pub",
            password_file=server.password_file, **task,
        )  # fmt: skip
        pipeline = rc.SourcePipeline(
            "bench-snap", task=source, target=rc.KafkaTarget(broker.bootstrap_servers),
            transaction_boundary="connector", exactly_once="required",
        )  # fmt: skip
        tansu = [p.pid for p in psutil.process_iter(["cmdline"])
                 if "tansu" in " ".join(p.info["cmdline"] or [])]  # fmt: skip
        sampler = MemorySampler(pids=[os.getpid(), _postmaster(server), *tansu])
        with sampler:
            sampler.mark()
            t0 = time.perf_counter()
            handle = pipeline.start()
            try:
                status = handle.wait_for(
                    lambda s: s["tasks"][0].get("records_committed", 0) >= rows
                    and s["tasks"][0].get("source", {}).get("phase") == "stream",
                    3600, 0.2,
                )  # fmt: skip
                elapsed = time.perf_counter() - t0
                committed = status["tasks"][0]["records_committed"]
            finally:
                handle.stop(release=True)
            server.psql("DROP PUBLICATION IF EXISTS bench_snap_pub")
    return {
        "rows": rows, "committed": committed, "seconds": round(elapsed, 1),
        "rows_per_s": round(rows / elapsed), "cpu": _cpu_kinds(sampler.cpu_by_process()),
        "peak_rss_mb": sampler.result()["peak_rss_mb"],
    }  # fmt: skip


def _cpu_kinds(by_process: dict[str, float]) -> dict[str, float]:
    kinds: dict[str, float] = {}
    for title, seconds in by_process.items():
        kind = (
            "postgres" if "postgres" in title
            else "broker" if "tansu" in title
            else "workers" if "SnapshotWorker" in title
            else "task" if "SourceTaskActor" in title
            else "rest"
        )  # fmt: skip
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    return kinds


def _line(label: str, r: dict, base: float | None = None) -> str:
    per_row = " ".join(f"{k} {v / r['rows'] * 1e6:.1f}" for k, v in sorted(r["cpu"].items()))
    ratio = f"{r['rows_per_s'] / base:5.2f}x" if base else "     "
    return (
        f"{label:<28} {r['rows']:>11,} {r['seconds']:>8.1f} {r['rows_per_s']:>10,} {ratio} "
        f"{r['peak_rss_mb']:>7,}  {per_row}"
    )


def main(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    header = (
        f"{'run':<28} {'rows':>11} {'seconds':>8} {'rows/s':>10} {'ratio':>6} {'RSS MB':>7}"
        "  CPU us/row by process"
    )
    out: list[str] = []
    with postgres_server() as server, RaySession():
        server.psql("ALTER SYSTEM SET max_wal_size = '4GB'")
        server.psql("SELECT pg_reload_conf()")
        if "big" in only:
            t0 = time.perf_counter()
            make_table(server, "big", args.rows)
            print(f"loaded {args.rows:,} rows in {time.perf_counter() - t0:.0f} s", flush=True)
            rate, mib = raw_copy(server, ["big"])
            r = snapshot_run(server, ["big"], args.rows)
            out.append(f"raw COPY of big: {rate:,.0f} rows/s ({mib:.0f} MiB/s)")
            out.append(_line("big, defaults", r, None))
            print(out[-1], flush=True)
            server.psql("DROP TABLE big")
        if "tables" in only:
            names = [f"t{i}" for i in range(args.tables)]
            for name in names:
                make_table(server, name, args.table_rows)
            rows = args.tables * args.table_rows
            rate, mib = raw_copy(server, names)
            out.append(f"raw COPY of {args.tables} tables: {rate:,.0f} rows/s ({mib:.0f} MiB/s)")
            base = None
            for n in [int(x) for x in args.parallelism.split(",")]:
                r = snapshot_run(server, names, rows, snapshot_parallelism=n)
                base = base or r["rows_per_s"]
                out.append(_line(f"{args.tables} tables, parallelism {n}", r, base))
                print(out[-1], flush=True)
    print(f"\nload average at the end: {os.getloadavg()}")
    print(header)
    print("\n".join(out))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--table-rows", type=int, default=500_000)
    ap.add_argument("--parallelism", default="1,2,4")
    ap.add_argument("--only", default="big,tables")
    main(ap.parse_args())
