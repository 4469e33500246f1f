"""Many tables in one sink pipeline (issue 27, point 4): N topics x 4 partitions routed by a
``topic_pattern`` into N Delta tables made on the fly, against the same records into ONE
table with the same pipeline (no routes), in the same run.

    .venv/bin/python bench/many_tables.py [--tables 200] [--per-table 10000] [--only routed]

Per run: start-up (``start()`` returning, and its steps), records/s (records / time from
``start()`` returning until every partition's offset is committed), the round cost (median
START->ACK with data, commit median, END->next START of idle rounds over ``--idle-s``), peak
PSS of every pipeline process (the broker excluded; ``common.MemorySampler``), and the
per-table status of the routed run (``status().tables``). Prints a table with the load
average; writes ``bench/results/many-tables/<tables>.{json,md}``.

A run is skipped while less than ``--min-available-gb`` (6) is available: the machine is
shared and has no swap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MemorySampler, RaySession, cleanup_private_tmp  # noqa: E402
from rc_runner import idle_rounds, stop  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "many-tables"
CLUSTER = "local"
TOPIC_PREFIX = "shop.public.t"
SETTINGS: dict[str, Any] = dict(commit_interval_s=10.0, commit_when_caught_up=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024 / 1024
    return 0.0


def topics_of(tables: int) -> list[str]:
    return [f"{TOPIC_PREFIX}{i:03d}" for i in range(tables)]


def _produce_some(bootstrap: str, topics: list[str], per_table: int, partitions: int) -> None:
    from rayconnect.kafka.admin import produce_demo_records

    async def go() -> None:
        for topic in topics:
            await produce_demo_records(bootstrap, topic, per_table, partitions)

    asyncio.run(go())


def produce(bootstrap: str, topics: list[str], per_table: int, partitions: int) -> None:
    """Create the topics and fill each with ``per_table`` demo records (~200 B JSON),
    round-robin over its partitions; two producer processes."""
    from rayconnect.kafka.admin import create_topic

    async def create() -> None:
        for topic in topics:
            await create_topic(bootstrap, topic, partitions)

    asyncio.run(create())
    halves = [topics[0::2], topics[1::2]]
    with mp.get_context("spawn").Pool(2) as pool:
        pool.starmap(_produce_some, [(bootstrap, h, per_table, partitions) for h in halves])


def pipeline(name: str, bootstrap: str, topics: list[str], path: str, routed: bool) -> Any:
    import rayconnect as rc

    meta = rc.StaticMetadataService(
        (rc.KafkaStream("shop", {CLUSTER: rc.ClusterMetadata(bootstrap, tuple(topics))}),)
    )
    routes = None
    if routed:
        routes = rc.Routes((rc.Route("t_{1}", topic_pattern=r"shop\.public\.t(.*)"),))
    sink = rc.DeltaSink(path, routes=routes)
    return rc.SinkPipeline(name, rc.KafkaSource(meta, value_format="json"), sink, **dict(SETTINGS))


def run(
    name: str,
    bootstrap: str,
    topics: list[str],
    path: str,
    routed: bool,
    want: dict[str, int],
    broker_pid: int,
    idle_s: float,
    timeout_s: float,
) -> dict[str, Any]:
    import ray

    from rayconnect.actors import names

    total = sum(want.values())
    sampler = MemorySampler(root=os.getpid(), exclude=(broker_pid,))
    handle = None
    out: dict[str, Any] = {"routed": routed, "records": total, "partitions": len(want)}
    with sampler:
        try:
            t0 = time.monotonic()
            handle = pipeline(name, bootstrap, topics, path, routed).start(timeout_s=timeout_s)
            out["startup_s"] = round(time.monotonic() - t0, 1)
            out["startup_phases_s"] = handle.startup
            sampler.mark()
            # from start() called: readers read and rounds commit before start() returns
            status = handle.wait_for(
                lambda s: s["offsets"] == want, timeout_s=timeout_s, poll_s=0.5
            )
            seconds = time.monotonic() - t0
            out["seconds"] = round(seconds, 1)
            out["records_per_s"] = round(total / seconds)
            for k in ("round_s_median", "round_s_max", "commit_s_median", "end_to_start_s_median"):
                out[k] = status.get(k)
            out["rounds_committed"] = status.rounds_since_start.committed
            writer = ray.get_actor(names.writer(name), namespace=names.NAMESPACE)
            wstats = ray.get(writer.stats.remote())
            out["writer"] = {
                k: getattr(wstats, k)
                for k in (
                    "spark_jobs",
                    "spark_writes",
                    "writes_here",
                    "last_prepare_s",
                    "last_spark_s",
                    "last_write_s",
                )
            }
            out["idle"] = idle_rounds(handle, idle_s, SETTINGS["commit_interval_s"])
            t = time.monotonic()
            final = handle.status()
            out["status_s"] = round(time.monotonic() - t, 3)
            tables = getattr(final, "tables", None) or {}
            out["tables_in_status"] = len(tables)
            if tables:
                first = sorted(tables)[0]
                out["table_status_example"] = {first: _builtins(tables[first])}
                out["table_rows_total"] = sum(t.rows_since_start for t in tables.values())
                out["tables_lag_total"] = sum(t.lag or 0 for t in tables.values())
        finally:
            stop(name, handle)
    out["memory"] = sampler.result()
    return out


def _builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)


def _ray_session(attempts: int = 3) -> RaySession:
    """A started ``RaySession``; on a loaded machine Ray's node may time out while it
    starts: tried again after a pause (the broker and its records are kept)."""
    for attempt in range(1, attempts + 1):
        session = RaySession()
        try:
            session.__enter__()
            return _Entered(session)
        except Exception as e:
            import ray

            ray.shutdown()
            if attempt == attempts:
                raise
            log(f"Ray did not start ({type(e).__name__}: {e}); again in 30 s")
            time.sleep(30)
    raise AssertionError("unreachable")


class _Entered(RaySession):
    """A RaySession entered already: ``with`` only leaves it."""

    def __init__(self, session: RaySession) -> None:
        self.__dict__.update(session.__dict__)

    def __enter__(self) -> RaySession:
        return self


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    cols = [k for k in ("routed", "one_table") if k in runs]
    head = {"routed": f"{result['tables']} tables (routes)", "one_table": "1 table (same pipeline)"}

    def cell(r: dict[str, Any], key: str) -> str:
        v: Any = r
        for part in key.split("."):
            v = (v or {}).get(part) if isinstance(v, dict) else None
        if v is None:
            return "-"
        return (
            f"{v:,.0f}"
            if isinstance(v, int | float) and v >= 100
            else f"{v:.3g}"
            if isinstance(v, float)
            else str(v)
        )

    lines = [
        f"{result['tables']} topics x {result['partitions']} partitions, "
        f"{result['per_table']:,} records a table ({result['records']:,} in all), "
        f"{result['when']}; load average before {result['load_before']}, after {result['load_after']}",
        "",
        "| | " + " | ".join(head[c] for c in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    rows = [
        ("start-up s", "startup_s"),
        ("records/s", "records_per_s"),
        ("seconds (ready -> all committed)", "seconds"),
        ("rounds committed", "rounds_committed"),
        ("round START->ACK median s", "round_s_median"),
        ("commit median s", "commit_s_median"),
        ("idle round END->START median s", "idle.overhead_s"),
        ("idle round END->START max s", "idle.overhead_max_s"),
        ("peak PSS MB", "memory.peak_pss_mb"),
        ("processes at peak", "memory.processes"),
        ("status() s", "status_s"),
        ("tables in status", "tables_in_status"),
        ("rows in the tables' status", "table_rows_total"),
    ]
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(cell(runs[c], key) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--per-table", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--idle-s", type=float, default=25.0)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--only", choices=("routed", "one_table"), default=None)
    ap.add_argument("--min-available-gb", type=float, default=6.0)
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args()

    import tempfile

    from rayconnect.kafka.embedded import EmbeddedBroker

    topics = topics_of(a.tables)
    result: dict[str, Any] = {
        "tables": a.tables,
        "partitions": a.partitions,
        "per_table": a.per_table,
        "records": a.tables * a.per_table,
        "settings": SETTINGS,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "runs": {},
    }
    broker = EmbeddedBroker("bench").start()
    workdir = tempfile.mkdtemp(prefix="many-tables-")
    try:
        t = time.monotonic()
        produce(broker.bootstrap_servers, topics, a.per_table, a.partitions)
        log(
            f"produced {result['records']:,} records into {len(topics)} topics in "
            f"{time.monotonic() - t:.0f} s"
        )
        per_partition = a.per_table // a.partitions
        want = {
            f"{CLUSTER}/{topic}/{p}": per_partition + (1 if p < a.per_table % a.partitions else 0)
            for topic in topics
            for p in range(a.partitions)
        }
        for kind in ("routed", "one_table"):
            if a.only and a.only != kind:
                continue
            if available_gb() < a.min_available_gb:
                log(f"{kind}: skipped, {available_gb():.1f} GB available")
                result["runs"][kind] = {"skipped": f"{available_gb():.1f} GB available"}
                continue
            log(f"{kind}: starting ({available_gb():.1f} GB available, load {os.getloadavg()})")
            with _ray_session():
                result["runs"][kind] = run(
                    f"many-{kind.replace('_', '-')}",
                    broker.bootstrap_servers,
                    topics,
                    os.path.join(workdir, kind),
                    kind == "routed",
                    want,
                    broker.pid,
                    a.idle_s,
                    a.timeout_s,
                )
            r = result["runs"][kind]
            _save(result, Path(a.out))  # what ran so far, should a later run fail
            log(
                f"{kind}: start-up {r['startup_s']} s, {r['records_per_s']:,} rec/s, "
                f"peak PSS {r['memory']['peak_pss_mb']} MB, idle {r['idle']}"
            )
    finally:
        broker.stop()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
        cleanup_private_tmp()
    print(_save(result, Path(a.out)))


def _save(result: dict[str, Any], out: Path) -> str:
    """Write ``<tables>.json`` and ``<tables>.md`` under ``out``; the table's text."""
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{result['tables']}.json").write_text(json.dumps(result, indent=1, default=str))
    table = markdown(result)
    (out / f"{result['tables']}.md").write_text(table)
    return table


if __name__ == "__main__":
    main()
