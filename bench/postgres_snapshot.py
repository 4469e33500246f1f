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
  lake      one table of ``--lake-rows`` (default 1M) into a Delta table by the database
            mirror (``rc.Mirror``, what ``rayconnect mirror`` runs: the source's snapshot and
            the routed upsert sink, their defaults) in a /tmp/bench-lake-* folder: seconds
            from ``start()`` until the table's newest version holds every row (its log's row
            count, polled every 0.5 s), the snapshot-into-Kafka part beside it (the source's
            ``records_committed`` reaching the rows); then the table is compared with Postgres
            (every id once, every column equal), a range of ids at a time

Per run: rows/s from ``start()`` to every row committed (the task's ``records_committed``,
which counts the rows its snapshot workers committed), and the CPU seconds per row of each
process kind (Postgres, the broker, the task actor - it plans and tracks chunks -, the
snapshot workers - they read by COPY, encode and produce -, with ``lake`` the sink's actors
and Spark's JVMs, the rest) sampled every 0.5 s.

    .venv/bin/python bench/postgres_snapshot.py [--rows 10000000] [--tables 20]
        [--table-rows 500000] [--parallelism 1,2,4] [--lake-rows 1000000]
        [--only big,tables,lake]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    PRIVATE_TMP,
    RAY_TMP,
    MemorySampler,
    RaySession,
    cleanup_private_tmp,
)

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
        sampler = _sampler(server)
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


def _sampler(server: PostgresServer) -> MemorySampler:
    """Samples this process's tree - Ray's processes, Spark's JVMs, the embedded broker (a
    child of this process; other sessions' brokers on the machine are not ours to count) -
    and Postgres."""
    return MemorySampler(pids=[os.getpid(), _postmaster(server)])


#: the sink pipeline's actors (the ``lake`` part's "sink" CPU)
SINK_ACTORS = ("CoordinatorActor", "EnumeratorActor", "ReaderActor", "WriterActor",
               "ParticipantHostActor")  # fmt: skip


def lake_run(server: PostgresServer, table: str, rows: int) -> dict:
    """``table`` mirrored into a Delta table by ``rc.Mirror`` with its defaults, from
    ``start()`` until the table holds ``rows`` rows; then stopped (slot and publication
    dropped) and the table compared with Postgres. Its lake folder is removed at the end."""
    lake = Path(tempfile.mkdtemp(prefix="bench-lake-", dir="/tmp"))
    kafka: list[float] = []
    done = threading.Event()
    try:
        with EmbeddedBroker("bench-lake") as broker:
            sampler = _sampler(server)
            with sampler:
                sampler.mark()
                wall0, t0 = time.time(), time.perf_counter()
                # start() returns once both pipelines run: the snapshot may be done by then
                watch = threading.Thread(
                    target=_watch_source, args=("bench-lake-source", rows, wall0, done, kafka),
                    daemon=True,
                )  # fmt: skip
                watch.start()
                handle = rc.Mirror(
                    "bench-lake", server.url, to=str(lake), tables=[table],
                    password_file=server.password_file, kafka=broker.bootstrap_servers,
                ).start()  # fmt: skip
                try:
                    started_s = time.perf_counter() - t0
                    lake_s = _wait_lake(lake / table, rows, wall0)
                    watch.join(10)  # it polls every 0.5 s: a poll behind the lake at most
                finally:
                    done.set()
                    handle.stop(commit=False, drop_slot=True, drain_timeout_s=0)
        t1 = time.perf_counter()
        problem = lake_difference(server, table, lake / table)
        compare_s = time.perf_counter() - t1
    finally:
        done.set()
        shutil.rmtree(lake, ignore_errors=True)
    kafka_s = min(kafka[0], lake_s) if kafka else float("nan")  # (polled: a poll late)
    return {
        "rows": rows, "seconds": round(lake_s, 1), "rows_per_s": round(rows / lake_s),
        "started_s": round(started_s, 1), "kafka_s": round(kafka_s, 1),
        "kafka_rows_per_s": round(rows / kafka_s) if kafka else 0, "difference": problem,
        "compare_s": round(compare_s, 1),
        "cpu": _cpu_kinds(sampler.cpu_by_process()),
        "peak_rss_mb": sampler.result()["peak_rss_mb"],
    }  # fmt: skip


def _watch_source(
    name: str, rows: int, wall0: float, done: threading.Event, out: list[float]
) -> None:
    """Polls source pipeline ``name`` every 0.5 s (from before it exists) until its task
    committed ``rows`` rows into Kafka and streams - its snapshot done: then the seconds
    since ``wall0`` into ``out``."""
    from rayconnect.pipelines.source import SourcePipelineHandle

    source = SourcePipelineHandle(name)
    while not done.is_set():
        with contextlib.suppress(Exception):  # not started yet, or a task restarting
            task = source.status(timeout_s=5).tasks[0]
            if (task.records_committed or 0) >= rows and (task.source or {}).get(
                "phase"
            ) == "stream":
                out.append(time.time() - wall0)
                return
        done.wait(0.5)


def _wait_lake(path: Path, rows: int, wall0: float, timeout_s: float = 3600) -> float:
    """Seconds from ``wall0`` until the commit of the Delta table's first version holding
    ``rows`` rows. Polls the table's log every 0.5 s (loaded incrementally; the row count
    is its files' statistics), never the table's data."""
    from deltalake import DeltaTable

    table: Any = None
    seen = -1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if table is None:
            with contextlib.suppress(Exception):  # no version yet
                table = DeltaTable(str(path))
        else:
            table.update_incremental()
        if table is not None and table.count() >= rows:
            # the first version that held them all, if this poll loaded several
            first = next(
                v for v in range(seen + 1, table.version() + 1)
                if DeltaTable(str(path), version=v).count() >= rows
            )  # fmt: skip
            when = {h["version"]: h["timestamp"] for h in table.history()}
            return when[first] / 1000.0 - wall0
        if table is not None:
            seen = table.version()
        time.sleep(0.5)
    raise TimeoutError(f"{path} does not hold {rows:,} rows after {timeout_s:.0f} s")


def lake_difference(
    server: PostgresServer, table: str, path: Path, step: int = 1_000_000
) -> str | None:
    """None if the Delta table at ``path`` holds exactly the rows of Postgres's ``table``:
    every id once, every column equal (the timestamp to the microsecond); else the first
    difference. Compared ``step`` ids at a time (each side's rows of the range in DuckDB):
    memory bounded at any size."""
    import duckdb
    import pyarrow.csv as pcsv
    from deltalake import DeltaTable

    from rayconnect.storage.delta_reads import delta_dataset
    from rayconnect.storage.location import TableLocation

    lake = delta_dataset(DeltaTable(str(path)), TableLocation.parse(str(path)))
    db = duckdb.connect()
    db.register("lake", lake)
    n_lake, lake_lo, lake_hi, no_id = db.execute(
        "SELECT count(*), min(id), max(id), count(*) FILTER (WHERE id IS NULL) FROM lake"
    ).fetchone()
    conn = psycopg2.connect(server.password_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*), min(id), max(id) FROM {table}")
            n_pg, pg_lo, pg_hi = cur.fetchone()
        if no_id or n_lake != n_pg or (lake_lo, lake_hi) != (pg_lo, pg_hi):
            return (
                f"{n_lake:,} rows in the lake ({no_id} without an id), ids {lake_lo} to "
                f"{lake_hi}; {n_pg:,} in Postgres, ids {pg_lo} to {pg_hi}"
            )
        cols = "id bigint, a bigint, b bigint, c double, t_us bigint, s varchar"
        names = [c.split()[0] for c in cols.split(", ")]
        types = {"id": "int64", "a": "int64", "b": "int64", "c": "float64", "t_us": "int64",
                 "s": "string"}  # fmt: skip
        for lo in range(pg_lo or 0, (pg_hi or -1) + 1, step):
            buf = io.BytesIO()
            with conn.cursor() as cur:
                cur.copy_expert(
                    f"COPY (SELECT id, a, b, c, (extract(epoch FROM t) * 1000000)::bigint, s "
                    f"FROM {table} WHERE id >= {lo} AND id < {lo + step}) TO STDOUT (FORMAT csv)",
                    buf,
                )  # fmt: skip
            buf.seek(0)
            pg = pcsv.read_csv(  # noqa: F841 - DuckDB reads it by its name
                buf,
                read_options=pcsv.ReadOptions(column_names=names),
                convert_options=pcsv.ConvertOptions(column_types=types),
            )
            db.execute(
                "CREATE OR REPLACE TEMP TABLE l AS SELECT id, a, b, c, epoch_us(t) AS t_us, s "
                f"FROM lake WHERE id >= {lo} AND id < {lo + step}"
            )
            n_l, distinct, n_p = db.execute(
                "SELECT (SELECT count(*) FROM l), (SELECT count(DISTINCT id) FROM l), "
                "(SELECT count(*) FROM pg)"
            ).fetchone()
            differ = db.execute(
                "SELECT coalesce(pg.id, l.id) FROM pg FULL JOIN l ON pg.id = l.id WHERE "
                + " OR ".join(f"pg.{c} IS DISTINCT FROM l.{c}" for c in names)
                + " ORDER BY 1 LIMIT 5"
            ).fetchall()
            if n_l != distinct or n_l != n_p or differ:
                return (
                    f"ids {lo:,} to {lo + step - 1:,}: {n_l:,} rows in the lake "
                    f"({n_l - distinct:,} ids twice), {n_p:,} in Postgres; ids that differ "
                    f"(missing, extra or changed): {[i for (i,) in differ]}"
                )
    finally:
        conn.close()
        db.close()
    return None


def _cpu_kinds(by_process: dict[str, float]) -> dict[str, float]:
    kinds: dict[str, float] = {}
    for title, seconds in by_process.items():
        kind = (
            "postgres" if "postgres" in title
            else "broker" if "tansu" in title
            else "workers" if "SnapshotWorker" in title
            else "task" if "SourceTaskActor" in title
            else "sink" if any(actor in title for actor in SINK_ACTORS)
            else "spark" if title.startswith("jvm:")
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


def _exit_on_sigterm(*_: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")  # Ray's calls in progress end as on Ctrl-C


def _kill_leftovers() -> None:
    """Kill, by pid, the processes this run started that outlived their stop (Ray's, when a
    signal came in the middle of ``ray.init``; a Postgres): those whose environment names
    this run's private temp folder. Only when this process made that folder - a runner's
    folder is shared by the runs it started."""
    if PRIVATE_TMP.name != f"rcb{os.getpid()}":
        return
    mine = f"RAYCONNECT_BENCH_TMP={PRIVATE_TMP}".encode()
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.Error):
            if pid != os.getpid() and mine in Path(f"/proc/{pid}/environ").read_bytes().split(
                b"\0"
            ):
                psutil.Process(pid).kill()


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def main(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    header = (
        f"{'run':<28} {'rows':>11} {'seconds':>8} {'rows/s':>10} {'ratio':>6} {'RSS MB':>7}"
        "  CPU us/row by process"
    )
    out: list[str] = []
    different = False
    # a kill of the run (SIGTERM) unwinds as Ctrl-C does: Postgres, the broker, Ray, Spark
    # and the temp folders are stopped and removed on the way out (set again once Ray is up:
    # ray.init puts its own handler in, which aborts the process)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with contextlib.ExitStack() as stack:
        stack.callback(cleanup_private_tmp)
        stack.callback(_kill_leftovers)
        if not RAY_TMP.exists():  # RaySession makes it (its session_latest link): ours to go
            stack.callback(_remove_if_empty, RAY_TMP)
        server = stack.enter_context(postgres_server())
        stack.enter_context(RaySession())
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
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
        if "lake" in only:
            make_table(server, "big", args.lake_rows)
            print(f"load average before the lake run: {os.getloadavg()}", flush=True)
            r = lake_run(server, "big", args.lake_rows)
            server.psql("DROP TABLE big")
            out.append(_line("lake (mirror), defaults", r, None))
            out.append(
                f"  start() returned after {r['started_s']} s; the snapshot into Kafka was done "
                f"at {r['kafka_s']} s ({r['kafka_rows_per_s']:,} rows/s from start()); the lake "
                f"table held every row at {r['seconds']} s ({r['rows_per_s']:,} rows/s from "
                f"start()), {r['seconds'] - r['kafka_s']:.1f} s after Kafka; the lake table is "
                + (
                    f"EQUAL to Postgres (every id once, every column; compared in "
                    f"{r['compare_s']} s)"
                    if r["difference"] is None
                    else f"DIFFERENT from Postgres: {r['difference']}"
                )
            )
            different = r["difference"] is not None
            print("\n".join(out[-2:]), flush=True)
    print(f"\nload average at the end: {os.getloadavg()}")
    print(header)
    print("\n".join(out))
    if different:
        sys.exit(1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--table-rows", type=int, default=500_000)
    ap.add_argument("--parallelism", default="1,2,4")
    ap.add_argument("--lake-rows", type=int, default=1_000_000)
    ap.add_argument("--only", default="big,tables", help="any of big, tables, lake")
    main(ap.parse_args())
