"""The 20-table database mirror (issue 27.6): changes/s of a backlog drained, and Postgres
commit -> visible in the lake table p50/p99 at a paced rate - with the sink's defaults and
with the documented latency values, in the same run.

A real Postgres 15 (``rayconnect.demo.local_postgres``), an embedded broker, a local Ray; 20
tables of ``rayconnect.demo.mirror_database`` (8 columns, keyed by ``id``, 400 keys each: ~55%
upserts, 30% updates, 15% deletes in transactions of 1-5 statements) -> the Postgres source
pipeline (a topic of 2 partitions per table, exactly once) -> ONE sink pipeline with a
topic-pattern route -> 20 Delta upsert tables. For each sink setting, one after the other,
each with its own slot, topics and lake:

1. **backlog**: the source starts (snapshot of the tables) and stops, its slot kept; the load
   writes ``--backlog`` changes as fast as one connection goes; the sink starts (Spark up,
   nothing to read yet) and the source starts again: changes/s = (backlog + snapshot rows) /
   seconds from the source's start until every lake table equals ``SELECT *``.
2. **freshness**: the load writes ``--rate`` changes/s for ``--seconds``; then every lake
   table must equal ``SELECT *`` again. For every row version written by the load (an
   insert or update; ``changed_ms`` = the writer's clock at the statement, a few ms before
   its commit), visible = the commit time of the first Delta version holding it.

Settings: ``defaults`` (``commit_interval_s`` 10) and ``latency`` (README's profile:
``commit_when_caught_up``, ``commit_interval_s=1``, ``spark.write_here_max_rows=100000``).

    .venv/bin/python bench/database_mirror.py [--backlog 60000] [--rate 2000] [--seconds 60]

Prints a markdown table (with ``uptime``'s load average before and after each part) and
writes it to ``bench/results/mirror/`` (``.md`` and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RaySession, cleanup_private_tmp, delta_visibility, percentiles  # noqa: E402

import rayconnect as rc  # noqa: E402
from rayconnect.demo.local_postgres import PostgresServer, postgres_server  # noqa: E402
from rayconnect.demo.mirror_database import (  # noqa: E402
    MirrorDatabase,
    mirror_sink,
    mirror_source,
)
from rayconnect.demo.mirror_database import wait_mirrored as wait_until_mirrored  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "latency": {
        "commit_when_caught_up": True,
        "commit_interval_s": 1,
        "spark": rc.SparkSettings(write_here_max_rows=100_000),
    },
}
OUT = Path(__file__).resolve().parent / "results" / "mirror"


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def wait_mirrored(db: MirrorDatabase, lake: Path, timeout_s: float) -> float:
    """Once every lake table equals its Postgres table (checked every second): the wall
    time of the last commit that added data to one of them (when the lake got there)."""
    problem = wait_until_mirrored(db, lake, timeout_s)
    if problem is not None:
        raise TimeoutError(f"not mirrored after {timeout_s:.0f} s: {problem}")
    return max(
        (
            committed
            for t in db.names
            for _, committed, adds in delta_visibility(str(lake / t))
            if adds
        ),
        default=time.time(),
    )


def source_committed(source: Any) -> int:
    try:
        return int(source.status(timeout_s=5)["records_committed"])
    except Exception:
        return 0


def freshness_ms(lake: Path, tables: list[str], since_ms: int) -> list[float]:
    """Per row version with ``changed_ms >= since_ms``: the commit time of the first version
    that holds it minus ``changed_ms``."""
    import pyarrow.parquet as pq

    out: list[float] = []
    for table in tables:
        path = lake / table
        seen: set[tuple[int, int]] = set()
        for _, committed, adds in delta_visibility(str(path)):
            for rel in adds:
                data = pq.read_table(path / unquote(rel), columns=["id", "changed_ms"])
                for key, ms in zip(
                    data["id"].to_pylist(), data["changed_ms"].to_pylist(), strict=True
                ):
                    if ms is None or ms < since_ms or (key, ms) in seen:
                        continue
                    seen.add((key, ms))
                    out.append(committed * 1000.0 - ms)
    return out


def start_sink(name: str, bootstrap: str, lake: Path, prefix: str) -> Any:
    """The sink, again if its Spark failed to start: on a shared machine another run's
    clean-up of new /tmp/ray/<n> folders can delete the one a starting Spark JVM unpacks
    Ray's native library into (tests/integration/ray_tmp.py) - start() then stops the
    pipeline and raises."""
    for attempt in (1, 2, 3):
        try:
            return mirror_sink(name, bootstrap, lake, prefix, **SETTINGS[name]).start()
        except Exception as e:
            if attempt == 3:
                raise
            print(f"[{name}] sink did not start ({type(e).__name__}); once more", flush=True)
    raise AssertionError("unreachable")


def one_setting(
    name: str,
    server: PostgresServer,
    bootstrap: str,
    db: MirrorDatabase,
    root: Path,
    backlog: int,
    rate: int,
    seconds: int,
) -> dict[str, Any]:
    lake = root / f"lake-{name}"
    src_name, prefix = f"{name}-src", f"b{name}"
    source = mirror_source(src_name, server, bootstrap, db.names, prefix).start()
    snapshot = sum(len(db.rows_of(t)) for t in db.names)
    deadline = time.monotonic() + 300
    while source_committed(source) < snapshot and time.monotonic() < deadline:
        time.sleep(0.5)
    source.stop()  # the slot stays: the backlog below waits in the WAL
    t, before = time.monotonic(), db.changes
    db.start(changes_per_s=1e9)
    while db.changes - before < backlog:
        time.sleep(0.2)
    db.stop()
    written = db.changes - before
    write_s = time.monotonic() - t
    print(f"[{name}] backlog of {written:,} changes written in {write_s:.1f} s", flush=True)
    sink = start_sink(name, bootstrap, lake, prefix)
    load_before = load_average()
    t = time.time()
    source = mirror_source(src_name, server, bootstrap, db.names, prefix).start()
    drain_s = wait_mirrored(db, lake, 900) - t
    load_drain = load_average()
    print(f"[{name}] drained in {drain_s:.1f} s (load {load_before} -> {load_drain})", flush=True)

    since_ms, before = int(time.time() * 1000), db.changes
    t = time.monotonic()
    db.start(changes_per_s=rate)
    time.sleep(seconds)
    db.stop()
    paced_s, stopped = time.monotonic() - t, time.time()
    paced = db.changes - before
    load_paced = load_average()
    catch_up_s = max(0.0, wait_mirrored(db, lake, 600) - stopped)
    sink.stop(commit=False)
    source.stop(release=True)
    fresh = percentiles(freshness_ms(lake, db.names, since_ms), (50, 99))
    print(f"[{name}] {paced:,} changes at {paced / paced_s:,.0f}/s: {fresh}", flush=True)
    return {
        "setting": name,
        "backlog_changes": written,
        "snapshot_rows": snapshot,
        "drain_s": round(drain_s, 1),
        "changes_per_s": round((written + snapshot) / drain_s),
        "load_before_drain": load_before,
        "load_after_drain": load_drain,
        "paced_changes": paced,
        "paced_rate": round(paced / paced_s),
        "load_after_paced": load_paced,
        "caught_up_after_s": round(catch_up_s, 1),
        "fresh_p50_ms": round(fresh["p50"]),
        "fresh_p99_ms": round(fresh["p99"]),
        "fresh_max_ms": round(fresh.get("max", float("nan"))),
        "fresh_rows": fresh.get("n", 0),
    }


def main(backlog: int, rate: int, seconds: int, only: list[str]) -> None:
    root = Path(tempfile.mkdtemp(prefix="rayconnect-bench-mirror-"))
    results = []
    try:
        with postgres_server() as server, EmbeddedBroker("bench-mirror") as broker, RaySession():
            db = MirrorDatabase(server, tables=20)
            db.create(rows_per_table=100)
            for name in only:
                results.append(one_setting(name, server, broker.bootstrap_servers, db, root,
                                           backlog, rate, seconds))  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
        cleanup_private_tmp()
    lines = [
        f"20-table database mirror: Postgres 15 -> source pipeline -> embedded broker (2 "
        f"partitions per table) -> one sink pipeline -> 20 Delta upsert tables; backlog "
        f"{backlog:,} changes, then {rate:,} changes/s for {seconds} s; 2-core machine, "
        f"load average (1/5/15 min) as printed",
        "",
        "| sink setting | backlog drained: changes/s | drain s | load avg | paced rate | "
        "commit -> visible p50 | p99 | max | rows | load avg |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['changes_per_s']:,} | {r['drain_s']} | "
            f"{r['load_after_drain']} | {r['paced_rate']:,}/s | {r['fresh_p50_ms']:,} ms | "
            f"{r['fresh_p99_ms']:,} ms | {r['fresh_max_ms']:,} ms | {r['fresh_rows']:,} | "
            f"{r['load_after_paced']} |"
        )
    text = "\n".join(lines)
    print("\n" + text)
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M")
    (OUT / f"mirror-{stamp}.md").write_text(text + "\n")
    (OUT / f"mirror-{stamp}.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog", type=int, default=60_000)
    ap.add_argument("--rate", type=int, default=2_000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--only", default="defaults,latency")
    args = ap.parse_args()
    main(args.backlog, args.rate, args.seconds, args.only.split(","))
