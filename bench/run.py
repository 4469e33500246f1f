"""rayconnect benchmarks: ceiling vs baseline vs rayconnect, on the embedded broker.

    .venv/bin/python bench/run.py [--quick] [--only a,b,c,d,e,s,i]

Scenarios (each runs the ceiling, the baseline and rayconnect back to back, same records):
  a  throughput: 2M records of ~200 B, 8 partitions, backlog already in the broker
  b  latency: a steady 10k records/s offered for 60 s, commit_interval_s=2: produce-to-visible
  c  scaling: 8, 32, 64 partitions: records/s, round time with data and idle
  d  memory: peak memory of every pipeline process during (a) and with a 10M backlog
  e  source: exactly-once vs plain produce records/s (GeneratorSource)
  h  participant hosts: 8, 64, 256 partitions (1,024 with >= 14 GB available), default
     partitions_per_host against one process per partition (partitions_per_host=1, up to
     64): start-up s, peak PSS, records/s, idle round END->next START
  s  object storage: (a)'s backlog through rayconnect into a table on local disk, then into
     one on the embedded S3 (SeaweedFS), same run: S3/local ratio, commit latency on S3
  v  record sizes: 1 KiB and 16 KiB values, 8 partitions, ~1 GB backlog each: MB/s of
     rayconnect (defaults and bench settings) against the raw fetch, MiB per CPU second

Prints a table and writes bench/results/results.{md,json} and PNG plots. ``--quick`` runs
small sizes (a few minutes) as a smoke test and writes to bench/results/quick/ instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from extras import require_bench_extras  # noqa: E402

require_bench_extras()  # before the helpers import them, and before any scenario runs

from baseline import STORAGE_ENV  # noqa: E402
from common import (  # noqa: E402
    Helper,
    RaySession,
    cleanup_private_tmp,
    percentiles,
    produce_backlog,
    produce_to_visible_ms,
    run_helper,
    sustained_rate,
)

RESULTS = Path(__file__).resolve().parent / "results"

FULL = {
    "a_records": 2_000_000,
    "a_partitions": 8,
    "b_rate": 10_000,
    "b_seconds": 60,
    "c_records": 1_000_000,
    "c_partitions": [8, 32, 64],
    "c_idle_s": 10,
    "d_records": 10_000_000,
    "e_records": 100_000,
    "e_batches": [1000, 5000],
    # issue 13's workload: a 2M-record backlog spread over all partitions, defaults
    "h_records": 2_000_000,
    "h_partitions": [8, 64, 256],
    # one process per partition costs ~7.5 GB at 64 (scenario c): same-run comparison at 8
    "h_one_per_partition_max": 8,
    # idle rounds after the backlog: two of them take two default intervals (10 s each)
    "h_idle_s": 25,
    # issue 28.5: bigger records; the backlog is sized in bytes (the broker keeps it in memory)
    "v_sizes": [1024, 16384],
    "v_bytes": 1_000_000_000,
    "v_partitions": 8,
}
QUICK = {
    "quick": True,
    "a_records": 200_000,
    "a_partitions": 8,
    "b_rate": 10_000,
    "b_seconds": 15,
    "c_records": 100_000,
    "c_partitions": [8, 32],
    "c_idle_s": 8,
    "d_records": 1_000_000,
    "e_records": 20_000,
    "e_batches": [1000],
    "h_records": 100_000,
    "h_partitions": [8, 64],
    "h_one_per_partition_max": 8,
    "h_idle_s": 25,
    "v_sizes": [1024, 16384],
    "v_bytes": 40_000_000,
    "v_partitions": 8,
}

# rayconnect settings per scenario (what a user would pick for the job)
# Throughput: the default flush settings (200k records a partition: with read-ahead the
# reader never waits for a write, and fewer, larger Spark jobs win - 25k: 135k rec/s, 100k:
# 144k, 200k: 165k, 1M: 159k on (a); two readers instead of one: no gain, 136k). The last
# round ends when every record is read (commit_when_caught_up), not when the 10 s interval
# runs out.
RC_THROUGHPUT = dict(commit_interval_s=10.0, commit_when_caught_up=True)
RC_LATENCY = dict(commit_interval_s=2.0)
# The README's ``latency`` profile (docs/guides/sink.md, "Freshness"): a round ends as soon
# as what was there is read, and its write (~3k rows at 10k/s) is made by the writer process
# itself, not as a 0.3-0.7 s Spark job.
RC_LATENCY_PROFILE = dict(
    commit_interval_s=1.0, commit_when_caught_up=True, spark={"write_here_max_rows": 100_000}
)
RC_SCALING = dict(commit_interval_s=2.0, flush_max_records=25_000, request_commit_after_flushes=100)
#: records per Delta version of the baseline in the backlog scenarios: with getmany's 20k
#: records, the strongest plain loop measured here (issue 13)
BASELINE_FLUSH = 50_000


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Broker:
    """An embedded broker for one scenario (fresh: the memory engine only grows)."""

    def __enter__(self):
        from rayconnect.kafka.embedded import EmbeddedBroker

        self.b = EmbeddedBroker("bench").start()
        return self.b

    def __exit__(self, *exc):
        self.b.stop()


def backlog_trio(
    broker,
    topic: str,
    n: int,
    partitions: int,
    rc_name: str,
    rc_settings: dict,
    idle_s: float = 0.0,
    baseline: bool = True,
    workdir: str = "",
    value_bytes: int = 0,
) -> dict[str, Any]:
    """Produce a backlog, then ceiling, baseline, rayconnect over it."""
    bs = broker.bootstrap_servers
    t = time.monotonic()
    counts = produce_backlog(bs, topic, n, partitions, value_bytes=value_bytes)
    log(
        f"  produced {n:,} records into {topic} ({partitions} partitions) in {time.monotonic() - t:.0f} s"
    )
    out: dict[str, Any] = {"records": n, "partitions": partitions, "want": counts}
    out["ceiling"] = run_helper("ceiling.py", bs, topic, n)
    log(f"  ceiling   {out['ceiling']['records_per_s']:>10,.0f} rec/s")
    if baseline:
        out["baseline"] = run_helper(
            "baseline.py",
            bs,
            topic,
            os.path.join(workdir, f"{topic}-baseline"),
            n,
            "--flush-records",
            BASELINE_FLUSH,
        )
        out["baseline"]["sustained_records_per_s"] = sustained_rate(
            os.path.join(workdir, f"{topic}-baseline"), out["baseline"]["t0_wall"]
        )
        log(f"  baseline  {out['baseline']['records_per_s']:>10,.0f} rec/s")
    from rc_runner import run_backlog

    with RaySession():
        out["rayconnect"] = run_backlog(
            rc_name,
            bs,
            topic,
            os.path.join(workdir, f"{topic}-rc"),
            counts,
            rc_settings,
            exclude_pids=(broker.pid,),
            idle_s=idle_s,
        )
    r = out["rayconnect"]
    log(
        f"  rayconnect {r['records_per_s']:>9,.0f} rec/s (start-up {r['startup_s']:.0f} s, "
        f"{r['rounds_committed']} rounds, {r['spark_jobs']} Spark jobs, peak PSS {r['memory']['peak_pss_mb']} MB)"
    )
    bpr = out["ceiling"]["bytes_per_record"]
    for k in ("ceiling", "baseline", "rayconnect"):
        if k in out:
            out[k]["mb_per_s"] = out[k]["records_per_s"] * bpr / 1e6
    return out


# --------------------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------------------


def scenario_a(cfg: dict, workdir: str) -> dict:
    """The backlog trio with the bench's throughput settings, then rayconnect again over the
    same records with its defaults (what a new user runs) into a table of its own."""
    from rc_runner import run_backlog

    with Broker() as broker:
        out = backlog_trio(
            broker,
            "tput",
            cfg["a_records"],
            cfg["a_partitions"],
            "bench-a",
            RC_THROUGHPUT,
            workdir=workdir,
        )
        with RaySession():
            out["rayconnect_default"] = r = run_backlog(
                "bench-a-defaults",
                broker.bootstrap_servers,
                "tput",
                os.path.join(workdir, "tput-rc-defaults"),
                out["want"],
                RC_DEFAULTS,
                exclude_pids=(broker.pid,),
            )
        log(f"  rayconnect defaults {r['records_per_s']:>9,.0f} rec/s")
        return out


#: rayconnect's own defaults (``rc.SinkPipeline(name, source, sink)``, nothing tuned), beside
#: the bench's throughput settings in scenario s.
RC_DEFAULTS: dict[str, Any] = {}


def scenario_s(cfg: dict, workdir: str) -> dict:
    """(a)'s backlog into a table on local disk, then into one on the embedded S3, the same
    records and machine, back to back: for each store the baseline (one process writing with
    delta-rs) and rayconnect with its defaults and with the bench's throughput settings;
    the ceiling (raw fetch) once, as it does not depend on the store."""
    from rc_runner import run_backlog

    from rayconnect.storage.embedded_s3 import EmbeddedS3

    out: dict[str, Any] = {"records": cfg["a_records"], "partitions": cfg["a_partitions"]}
    n = cfg["a_records"]
    with Broker() as broker:
        bs = broker.bootstrap_servers
        counts = produce_backlog(bs, "objs", n, cfg["a_partitions"])
        out["ceiling"] = run_helper("ceiling.py", bs, "objs", n)
        log(f"  ceiling    {out['ceiling']['records_per_s']:>9,.0f} rec/s")

        def store(tag: str, table: str, storage: dict[str, str], exclude: tuple[int, ...]) -> None:
            os.environ[STORAGE_ENV] = json.dumps(storage)
            try:
                out[f"baseline_{tag}"] = base = run_helper(
                    "baseline.py",
                    bs,
                    "objs",
                    f"{table}-baseline",
                    n,
                    "--flush-records",
                    BASELINE_FLUSH,
                )
            finally:
                os.environ.pop(STORAGE_ENV, None)
            log(f"  {tag:<5} baseline   {base['records_per_s']:>9,.0f} rec/s")
            for key, settings in ((f"{tag}_default", RC_DEFAULTS), (tag, RC_THROUGHPUT)):
                with RaySession():
                    out[key] = run_backlog(
                        f"bench-s-{key.replace('_', '-')}",
                        bs,
                        "objs",
                        f"{table}-{key.replace('_', '-')}",
                        counts,
                        settings,
                        exclude_pids=exclude,
                        storage_options=storage or None,
                    )
                log(f"  {key:<16} {out[key]['records_per_s']:>9,.0f} rec/s")

        store("local", os.path.join(workdir, "objs"), {}, (broker.pid,))
        with EmbeddedS3(buckets=["bench"]) as s3:
            out["s3_start_s"] = s3.start_seconds
            log(f"  SeaweedFS ready in {out['s3_start_s']:.1f} s")
            store("s3", "s3://bench/objs", s3.storage_options, (broker.pid, s3.pid))
    out["s3_over_local"] = out["s3"]["records_per_s"] / out["local"]["records_per_s"]
    return out


def scenario_i(cfg: dict, workdir: str) -> dict:
    """(a)'s backlog, rayconnect only, into Delta tables and Iceberg tables (embedded SQL
    catalog on sqlite, local warehouse), each with rayconnect's defaults and with the
    bench's throughput settings: same records, machine and run; a fresh table each time."""
    from rc_runner import run_backlog

    import rayconnect as rc

    out: dict[str, Any] = {"records": cfg["a_records"], "partitions": cfg["a_partitions"]}
    with Broker() as broker:
        bs = broker.bootstrap_servers
        counts = produce_backlog(bs, "kinds", cfg["a_records"], cfg["a_partitions"])
        for suffix, settings in (("_default", RC_DEFAULTS), ("", RC_THROUGHPUT)):
            tag = suffix.strip("_") or "bench"
            tables = {
                "delta": os.path.join(workdir, f"kinds-delta-{tag}"),
                "iceberg": rc.IcebergSink(
                    f"bench.kinds_{tag}", warehouse=os.path.join(workdir, "wh")
                ),
            }
            for kind, table in tables.items():
                with RaySession():
                    out[kind + suffix] = run_backlog(
                        f"bench-i-{kind}-{tag}",
                        bs,
                        "kinds",
                        table,
                        counts,
                        settings,
                        exclude_pids=(broker.pid,),
                    )
                r = out[kind + suffix]
                log(
                    f"  {kind:<8} {tag:<8} {r['records_per_s']:>9,.0f} rec/s, commit median "
                    f"{(r['commit_s_median'] or 0) * 1000:.0f} ms"
                )
    out["iceberg_over_delta"] = out["iceberg"]["records_per_s"] / out["delta"]["records_per_s"]
    return out


def scenario_b(cfg: dict, workdir: str) -> dict:
    from rc_runner import start_live, stop, wait_committed

    from rayconnect.kafka.admin import create_topic

    rate, seconds = cfg["b_rate"], cfg["b_seconds"]
    partitions = cfg.get("b_partitions", 8)
    n = int(rate * seconds)
    out: dict[str, Any] = {
        "rate": rate,
        "seconds": seconds,
        "partitions": partitions,
        "commit_interval_s": RC_LATENCY["commit_interval_s"],
    }
    only = set(cfg.get("b_only") or ()) or None

    def wanted(contender: str) -> bool:
        return only is None or contender in only

    with Broker() as broker:
        bs = broker.bootstrap_servers

        def offer(topic: str, consumer: Helper | None = None) -> dict:
            producer = Helper("paced_producer.py", bs, topic, rate, seconds)
            producer.wait_ready()
            res = producer.result(seconds + 120)
            log(f"  offered {res['records']:,} records at {res['rate']:,.0f}/s to {topic}")
            return res

        # ceiling: a consumer receives the records; latency = receive time - produce time
        if wanted("ceiling"):
            asyncio.run(create_topic(bs, "lat-ceiling", partitions))
            c = Helper("ceiling.py", bs, "lat-ceiling", n, "--latency")
            c.wait_ready()
            out["offered_ceiling"] = offer("lat-ceiling")
            out["ceiling"] = c.result(300)
            log(
                f"  ceiling   p50 {out['ceiling']['latency_ms']['p50']:.0f} ms, p99 {out['ceiling']['latency_ms']['p99']:.0f} ms"
            )
        # baseline: a Delta version every 2 s (the same visibility budget as rayconnect)
        if wanted("baseline"):
            _latency_baseline(bs, n, partitions, workdir, offer, out)
        for key, settings in (
            ("rayconnect", RC_LATENCY),
            ("rayconnect_caught_up", {**RC_LATENCY, "commit_when_caught_up": True}),
            ("rayconnect_latency_profile", RC_LATENCY_PROFILE),
        ):
            if not wanted(key):
                continue
            topic = f"lat-{key.replace('_', '-')}"
            asyncio.run(create_topic(bs, topic, partitions))
            table_r = os.path.join(workdir, topic)
            with RaySession():
                handle = None
                try:
                    handle = start_live(f"bench-{topic}", bs, topic, table_r, settings)
                    res = offer(topic)
                    out[f"offered_{key}"] = res
                    status = wait_committed(
                        handle, topic, {int(k): v for k, v in res["counts"].items()}, 300
                    )
                    out[key] = {
                        "rounds_committed": status.rounds_since_start.committed,
                        "round_s_median": status["round_s_median"],
                        "round_s_max": status["round_s_max"],
                        "commit_s_median": status["commit_s_median"],
                    }
                finally:
                    stop(f"bench-{topic}", handle)
            out[key]["latency_ms"] = lat = percentiles(produce_to_visible_ms(table_r))
            log(f"  {key} p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms")
    return out


def _latency_baseline(
    bs: str, n: int, partitions: int, workdir: str, offer: Callable, out: dict
) -> None:
    """The plain loop under the paced load: a Delta version every commit interval (the same
    visibility budget as rayconnect's)."""
    from rayconnect.kafka.admin import create_topic

    asyncio.run(create_topic(bs, "lat-baseline", partitions))
    table_b = os.path.join(workdir, "lat-baseline")
    b = Helper(
        "baseline.py",
        bs,
        "lat-baseline",
        table_b,
        n,
        "--flush-records",
        10**9,
        "--flush-age",
        RC_LATENCY["commit_interval_s"],
    )
    b.wait_ready()
    out["offered_baseline"] = offer("lat-baseline")
    out["baseline"] = b.result(300)
    out["baseline"]["latency_ms"] = lat = percentiles(produce_to_visible_ms(table_b))
    log(f"  baseline  p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms")


def scenario_c(cfg: dict, workdir: str) -> dict:
    out: dict[str, Any] = {
        "records": cfg["c_records"],
        "commit_interval_s": RC_SCALING["commit_interval_s"],
        "points": {},
    }
    for p in cfg["c_partitions"]:
        log(f" scaling: {p} partitions")
        with Broker() as broker:
            out["points"][str(p)] = backlog_trio(
                broker,
                f"scale{p}",
                cfg["c_records"],
                p,
                f"bench-c{p}",
                RC_SCALING,
                idle_s=cfg["c_idle_s"],
                workdir=workdir,
            )
    return out


def scenario_v(cfg: dict, workdir: str) -> dict:
    """Bigger records (issue 28.5): for each value size the trio with the bench's throughput
    settings, then rayconnect's defaults over the same records. MB/s is the measure; CPU
    seconds of every process but the broker give MiB per CPU second (what a core carries)."""
    from rc_runner import run_backlog

    out: dict[str, Any] = {"partitions": cfg["v_partitions"], "sizes": {}}
    for size in cfg["v_sizes"]:
        n = cfg["v_bytes"] // size
        log(f" record size {size} B: {n:,} records")
        with Broker() as broker:
            point = backlog_trio(
                broker,
                f"size{size}",
                n,
                cfg["v_partitions"],
                f"bench-v{size}",
                RC_THROUGHPUT,
                workdir=workdir,
                value_bytes=size,
            )
            with RaySession():
                point["rayconnect_default"] = r = run_backlog(
                    f"bench-v{size}-defaults",
                    broker.bootstrap_servers,
                    f"size{size}",
                    os.path.join(workdir, f"size{size}-rc-defaults"),
                    point["want"],
                    RC_DEFAULTS,
                    exclude_pids=(broker.pid,),
                )
            r["mb_per_s"] = r["records_per_s"] * point["ceiling"]["bytes_per_record"] / 1e6
            log(f"  rayconnect defaults {r['records_per_s']:>9,.0f} rec/s")
        out["sizes"][str(size)] = point
    return out


def _mib_per_cpu_s(x: dict, records: int, bytes_per_record: float) -> float | None:
    cpu = (x.get("memory") or {}).get("cpu_s")
    return records * bytes_per_record / 2**20 / cpu if cpu else None


def _size_rows(v: dict | None) -> list:
    """Scenario v: MB/s against the raw fetch per value size (target >= 0.8x)."""
    R: list[list[str]] = []
    if not v:
        return R
    for size, pt in v["sizes"].items():
        c, b = pt["ceiling"], pt["baseline"]
        what = f"{pt['records']:,} x {c['bytes_per_record']:.0f} B, {v['partitions']} partitions"
        for key, settings in (("rayconnect_default", "defaults"), ("rayconnect", "bench settings")):
            r = pt[key]
            R.append(
                _row(
                    "v record sizes",
                    f"MB/s, {size} B values, rayconnect {settings} ({what}; "
                    f"{r['records_per_s']:,.0f} rec/s)",
                    c["mb_per_s"],
                    b["mb_per_s"],
                    r["mb_per_s"],
                    fmt=".1f",
                    target=">= 0.8x raw fetch",
                    met="yes" if r["mb_per_s"] >= 0.8 * c["mb_per_s"] else "NO",
                )
            )
        R.append(
            _row(
                "v record sizes",
                f"MiB per CPU second, {size} B values (every process but the broker)",
                _mib_per_cpu_s(c, pt["records"], c["bytes_per_record"]),
                _mib_per_cpu_s(b, pt["records"], c["bytes_per_record"]),
                _mib_per_cpu_s(pt["rayconnect"], pt["records"], c["bytes_per_record"]),
                fmt=".1f",
            )
        )
    return R


def _available_gb() -> float:
    """MemAvailable now (the machine is shared: 1,024 partitions only with room to spare)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024 / 1024
    return 0.0


def scenario_h(cfg: dict, workdir: str) -> dict:
    """Participant hosts: the default grouping (``partitions_per_host`` 64) against one
    process per partition (1), same backlog, same broker; ceiling and baseline beside."""
    from rc_runner import run_backlog

    partitions = list(cfg["h_partitions"])
    if _available_gb() >= 14 and 1024 not in partitions and not cfg.get("quick"):
        partitions.append(1024)
    partitions = [p for p in partitions if p in cfg.get("h_only", partitions)]
    settings = cfg.get("h_settings", {})
    label = ", ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"
    out: dict[str, Any] = {"records": cfg["h_records"], "settings": label, "points": {}}
    for p in partitions:
        log(f" hosts: {p} partitions ({_available_gb():.1f} GB available)")
        with Broker() as broker:
            # rayconnect's defaults: what a user with this many partitions runs
            point = backlog_trio(
                broker,
                f"hosts{p}",
                cfg["h_records"],
                p,
                f"bench-h{p}",
                settings,
                idle_s=cfg["h_idle_s"],
                workdir=workdir,
            )
            if p <= cfg["h_one_per_partition_max"]:
                with RaySession():
                    point["one_per_partition"] = run_backlog(
                        f"bench-h{p}-1",
                        broker.bootstrap_servers,
                        f"hosts{p}",
                        os.path.join(workdir, f"hosts{p}-rc1"),
                        point["want"],
                        {"partitions_per_host": 1},
                        exclude_pids=(broker.pid,),
                        idle_s=cfg["h_idle_s"],
                    )
        out["points"][str(p)] = point
        for k in ("rayconnect", "one_per_partition"):
            r = point.get(k)
            if r:
                log(
                    f"  {k:<18} {r['records_per_s']:>9,.0f} rec/s, start-up {r['startup_s']:.1f} s, "
                    f"peak PSS {r['memory']['peak_pss_mb']} MB, idle END->START "
                    f"{(r.get('idle') or {}).get('overhead_s')}"
                )
    out["uptime"] = os.getloadavg()
    return out


def scenario_d(cfg: dict, workdir: str, a_result: dict | None) -> dict:
    out: dict[str, Any] = {}
    if a_result is not None:
        out["small"] = {
            "records": a_result["records"],
            **{
                k: a_result[k]["memory"]
                for k in ("ceiling", "baseline", "rayconnect")
                if k in a_result
            },
        }
    else:
        with Broker() as broker:
            r = backlog_trio(
                broker,
                "mem-small",
                cfg["a_records"],
                8,
                "bench-d1",
                RC_THROUGHPUT,
                baseline=True,
                workdir=workdir,
            )
        out["small"] = {
            "records": r["records"],
            **{k: r[k]["memory"] for k in ("ceiling", "baseline", "rayconnect")},
        }
    with Broker() as broker:
        r = backlog_trio(
            broker,
            "mem-large",
            cfg["d_records"],
            8,
            "bench-d2",
            RC_THROUGHPUT,
            baseline=False,
            workdir=workdir,
        )
    out["large"] = {
        "records": r["records"],
        "rayconnect_records_per_s": r["rayconnect"]["records_per_s"],
        **{k: r[k]["memory"] for k in ("ceiling", "rayconnect")},
    }
    out["settings"] = RC_THROUGHPUT
    return out


def scenario_e(cfg: dict, workdir: str) -> dict:
    from source_eo_vs_plain import PARTITIONS, raw, via_task

    from rayconnect.kafka.admin import create_topic
    from rayconnect.kafka.embedded import EmbeddedBroker

    out: dict[str, Any] = {"records": cfg["e_records"], "partitions": PARTITIONS, "batches": {}}
    n = cfg["e_records"]
    for batch in cfg["e_batches"]:
        with EmbeddedBroker(f"bench-e{batch}") as broker:
            bs = broker.bootstrap_servers

            async def go(bs=bs, batch=batch):
                await create_topic(bs, "bench", PARTITIONS)
                eo = await via_task(bs, f"eo-{batch}", n, batch, True)
                plain = await via_task(bs, f"plain-{batch}", n, batch, False)
                ceiling = await raw(bs, n, batch)
                return eo, plain, ceiling

            eo, plain, ceiling = asyncio.run(go())
        out["batches"][str(batch)] = {"ceiling": ceiling, "baseline": plain, "rayconnect": eo}
        log(
            f"  batch {batch}: exactly-once {eo:,.0f}/s, plain {plain:,.0f}/s, raw {ceiling:,.0f}/s"
        )
    return out


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = ",.0f") -> str:
    if x is None:
        return "-"
    try:
        return format(x, fmt)
    except (TypeError, ValueError):
        return str(x)


def _ratio(a: Any, b: Any) -> str:
    try:
        return f"{a / b:.2f}"
    except (TypeError, ZeroDivisionError):
        return "-"


_ABSENT: Any = object()  # a column this row has nothing in ("", where None shows "-")


def _row(
    scenario: str,
    metric: str,
    ceiling: Any = _ABSENT,
    baseline: Any = _ABSENT,
    rayconnect: Any = _ABSENT,
    *,
    fmt: str = ",.0f",
    ratios: bool = True,
    target: str = "",
    met: str = "",
) -> list[str]:
    """One table row: the three figures, rayconnect's ratio to each one given (``ratios``)."""

    def cell(x: Any) -> str:
        return "" if x is _ABSENT else _f(x, fmt)

    def ratio(x: Any) -> str:
        return "" if x is _ABSENT or rayconnect is _ABSENT or not ratios else _ratio(rayconnect, x)

    return [
        scenario,
        metric,
        cell(ceiling),
        cell(baseline),
        cell(rayconnect),
        ratio(ceiling),
        ratio(baseline),
        target,
        met,
    ]


def rows(results: dict) -> list[list[str]]:
    """Markdown rows: scenario, metric, ceiling, baseline, rayconnect, rc/ceiling, rc/baseline, target, met."""
    R: list[list[str]] = []
    a = results.get("a")
    if a:
        c, b, r = a["ceiling"], a["baseline"], a["rayconnect"]
        ok = r["records_per_s"] >= 100_000 and r["records_per_s"] >= b["records_per_s"]
        R.append(
            _row(
                "a throughput",
                f"records/s ({a['records']:,} x ~{c['bytes_per_record']:.0f} B, {a['partitions']} partitions)",
                c["records_per_s"],
                b["records_per_s"],
                r["records_per_s"],
                target=">= 100k/s and >= baseline",
                met="yes" if ok else "NO",
            )
        )
        d = a.get("rayconnect_default")
        if d:
            R.append(
                _row(
                    "a throughput",
                    "records/s, rayconnect's defaults (same records)",
                    c["records_per_s"],
                    b["records_per_s"],
                    d["records_per_s"],
                    target=">= baseline",
                    met="yes" if d["records_per_s"] >= b["records_per_s"] else "NO",
                )
            )
        R.append(
            _row(
                "a throughput",
                "records/s sustained (until the second-to-last version)",
                baseline=b.get("sustained_records_per_s"),
                rayconnect=r.get("sustained_records_per_s"),
            )
        )
        R.append(
            _row(
                "a throughput",
                "MB/s (key + value)",
                c["mb_per_s"],
                b["mb_per_s"],
                r["mb_per_s"],
                fmt=".1f",
            )
        )
        if "cpu_s" in r["memory"]:
            R.append(
                _row(
                    "a throughput",
                    "CPU seconds, every process but the broker (rayconnect: from pipeline ready)",
                    c["memory"]["cpu_s"],
                    b["memory"]["cpu_s"],
                    r["memory"]["cpu_s"],
                    fmt=".1f",
                )
            )
    bb = results.get("b")
    if bb:
        c = (bb.get("ceiling") or {}).get("latency_ms", {})
        b = (bb.get("baseline") or {}).get("latency_ms", {})
        parts = bb.get("partitions", 8)
        labels = {
            "rayconnect": "",
            "rayconnect_caught_up": ", commit_when_caught_up",
            "rayconnect_latency_profile": ", the latency profile",
        }
        variants = [(label, bb[key]["latency_ms"]) for key, label in labels.items() if key in bb]
        for label, r in variants:
            if "profile" in label:
                limit = 1000 if parts <= 8 else 2000  # issue 28: 1 s at 8, 2 s at 1,024
            else:
                limit = (bb["commit_interval_s"] + 1) * 1000
            for p in ("p50", "p99"):
                R.append(
                    _row(
                        "b latency",
                        f"produce-to-visible {p}, ms ({bb['rate']:,}/s for {bb['seconds']} s, "
                        f"{parts} partitions{label})",
                        c.get(p),
                        b.get(p),
                        r[p],
                        target=f"< {limit:.0f} ms" if p == "p99" else "",
                        met=("yes" if r[p] < limit else "NO") if p == "p99" else "",
                    )
                )
    R.extend(_host_rows(results.get("h")))
    R.extend(_size_rows(results.get("v")))
    cc = results.get("c")
    if cc:
        points = cc["points"]
        for p, pt in points.items():
            R.append(
                _row(
                    "c scaling",
                    f"records/s, {p} partitions ({cc['records']:,})",
                    pt["ceiling"]["records_per_s"],
                    pt["baseline"]["records_per_s"],
                    pt["rayconnect"]["records_per_s"],
                )
            )
        for p, pt in points.items():
            R.append(
                _row(
                    "c scaling",
                    f"round START->ACK with data, median, {p} partitions, s (interval {cc['commit_interval_s']:g} s)",
                    rayconnect=pt["rayconnect"]["round_s_median"],
                    fmt=".2f",
                )
            )
        for p, pt in points.items():
            R.append(
                _row(
                    "c scaling",
                    f"round END->next START with data (write + commit), median, {p} partitions, s",
                    rayconnect=pt["rayconnect"].get("end_to_start_s_median"),
                    fmt=".2f",
                )
            )
        for p, pt in points.items():
            ov = (pt["rayconnect"].get("idle") or {}).get("overhead_s")
            target = p == "64"
            R.append(
                _row(
                    "c scaling",
                    f"idle round END->next START, {p} partitions, ms",
                    rayconnect=None if ov is None else ov * 1000,
                    target="< 250 ms" if target else "",
                    met=("yes" if ov is not None and ov < 0.25 else "NO") if target else "",
                )
            )
    d = results.get("d")
    if d:
        for size in ("small", "large"):
            s = d[size]
            R.append(
                _row(
                    "d memory",
                    f"peak PSS, {s['records']:,}-record backlog, MB",
                    s["ceiling"]["peak_pss_mb"],
                    s.get("baseline", {}).get("peak_pss_mb"),
                    s["rayconnect"]["peak_pss_mb"],
                    ratios=False,
                    target="bounded by flush settings" if size == "large" else "",
                )
            )
        grow = d["large"]["rayconnect"]["peak_pss_mb"] / max(
            d["small"]["rayconnect"]["peak_pss_mb"], 1
        )
        R[-1][-1] = "yes" if grow < 1.25 else "NO"
        R[-1][5] = f"x{grow:.2f} vs small"
    e = results.get("e")
    if e:
        for batch, x in e["batches"].items():
            R.append(
                _row(
                    "e source",
                    f"produce records/s, batch {batch} (raw / plain / exactly-once)",
                    x["ceiling"],
                    x["baseline"],
                    x["rayconnect"],
                    target=">= 0.80 of plain",
                    met="yes" if x["rayconnect"] >= 0.8 * x["baseline"] else "NO",
                )
            )
    s = results.get("s")
    if s and "ceiling" in s:
        label = "s object storage"
        size = f"{s['records']:,} records, {s['partitions']} partitions"
        for store, name in (("local", "local disk"), ("s3", "embedded S3")):
            for key, settings in ((store, "bench settings"), (f"{store}_default", "defaults")):
                R.append(
                    _row(
                        label,
                        f"records/s, table on {name}, rayconnect {settings} ({size})",
                        s["ceiling"]["records_per_s"],
                        s[f"baseline_{store}"]["records_per_s"],
                        s[key]["records_per_s"],
                    )
                )
        for key, what in (("", "bench settings"), ("_default", "defaults")):
            R.append(
                _row(
                    label,
                    f"records/s S3 / local disk, rayconnect {what} (baseline: its own S3/local)",
                    baseline=s["baseline_s3"]["records_per_s"]
                    / s["baseline_local"]["records_per_s"],
                    rayconnect=s[f"s3{key}"]["records_per_s"] / s[f"local{key}"]["records_per_s"],
                    fmt=".2f",
                    ratios=False,
                )
            )
        R += _latency_rows(
            label,
            s["local"],
            s["s3"],
            ", bench settings: local disk (baseline column) vs S3 (rayconnect)",
        )
        R.append(
            _row(label, "embedded S3 (weed mini) ready, s", rayconnect=s["s3_start_s"], fmt=".1f")
        )
    i = results.get("i")
    if i:
        label = "i table kinds"
        for key, what in (("_default", "defaults"), ("", "bench settings")):
            if "delta" + key not in i:  # results of a run before defaults were measured
                continue
            delta, iceberg = i["delta" + key], i["iceberg" + key]
            R.append(
                _row(
                    label,
                    f"rayconnect records/s, {what} ({i['records']:,}, {i['partitions']} "
                    "partitions): Delta (baseline column) vs Iceberg (rayconnect column)",
                    baseline=delta["records_per_s"],
                    rayconnect=iceberg["records_per_s"],
                )
            )
            R += _latency_rows(label, delta, iceberg, f", {what}: Delta vs Iceberg")
    return R


#: issue 13's targets for scenario (h), by partition count: (metric, target text, check)
_HOST_TARGETS: dict[int, dict[str, tuple[str, Callable[[dict, dict], bool]]]] = {
    8: {"records/s": (">= 287k/s (a) before hosts", lambda r, pt: r["records_per_s"] >= 287_000)},
    64: {
        "records/s": (
            ">= 1.5x baseline",
            lambda r, pt: r["records_per_s"] >= 1.5 * pt["baseline"]["records_per_s"],
        )
    },
    1024: {
        "records/s": (">= 150k/s", lambda r, pt: r["records_per_s"] >= 150_000),
        "start-up": ("<= 60 s", lambda r, pt: r["startup_s"] <= 60),
        "peak PSS": ("<= 6,144 MB", lambda r, pt: r["memory"]["peak_pss_mb"] <= 6144),
        "idle round": (
            "<= 500 ms",
            lambda r, pt: (
                (r.get("idle") or {}).get("overhead_s") is not None
                and r["idle"]["overhead_s"] <= 0.5
            ),
        ),
    },
}


def _host_rows(h: dict | None) -> list:
    """Scenario (h): per partition count, participant hosts (default) and one process per
    partition: records/s (ceiling and baseline beside), start-up, peak PSS, idle round,
    each with issue 13's target where it sets one."""
    if not h:
        return []
    R = []
    settings = h.get("settings", "RC_SCALING")
    for p, pt in h["points"].items():
        for k, label in (("rayconnect", "hosts"), ("one_per_partition", "1 per partition")):
            r = pt.get(k)
            if not r:
                continue
            targets = _HOST_TARGETS.get(int(p), {}) if k == "rayconnect" else {}

            def goal(metric: str, r: dict = r, pt: dict = pt, targets: dict = targets) -> dict:
                if metric not in targets:
                    return {}
                text, check = targets[metric]
                return {"target": text, "met": "yes" if check(r, pt) else "no"}

            idle = (r.get("idle") or {}).get("overhead_s")
            what = f"{p} partitions, {label}, {settings}"
            R.append(
                _row(
                    "h hosts",
                    f"records/s, {what} ({h['records']:,})",
                    pt["ceiling"]["records_per_s"],
                    pt["baseline"]["records_per_s"],
                    r["records_per_s"],
                    **goal("records/s"),
                )
            )
            R.append(
                _row(
                    "h hosts",
                    f"start-up, {what}, s",
                    rayconnect=r["startup_s"],
                    fmt=".1f",
                    **goal("start-up"),
                )
            )
            R.append(
                _row(
                    "h hosts",
                    f"peak PSS, {what}, MB",
                    rayconnect=r["memory"]["peak_pss_mb"],
                    **goal("peak PSS"),
                )
            )
            R.append(
                _row(
                    "h hosts",
                    f"idle round END->next START, {what}, ms",
                    rayconnect=None if idle is None else idle * 1000,
                    **goal("idle round"),
                )
            )
            if r.get("files_per_round_max") is not None:
                R.append(
                    _row(
                        "h hosts",
                        f"data files a version (median / max), {what}",
                        rayconnect=f"{r['files_per_round_median']} / {r['files_per_round_max']}",
                        fmt="",
                    )
                )
    return R


def _latency_rows(label: str, left: dict, right: dict, compared: str) -> list:
    """Commit and round latency medians (seconds in the results, ms in the table) of two
    runs side by side: ``left`` in the baseline column, ``right`` in rayconnect's."""

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1000

    return [
        _row(label, f"{what}{compared}", baseline=ms(left.get(key)), rayconnect=ms(right.get(key)))
        for key, what in (
            ("commit_s_median", "commit latency median, ms"),
            ("round_s_median", "round START->ACK median, ms"),
        )
    ]


HEADER = [
    "scenario",
    "metric",
    "ceiling",
    "baseline",
    "rayconnect",
    "rc/ceiling",
    "rc/baseline",
    "target",
    "met",
]


def markdown(results: dict) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(results)]
    return "\n".join(lines)


def text_table(results: dict) -> str:
    R = [HEADER] + rows(results)
    widths = [max(len(r[i]) for r in R) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in R)


def machine() -> dict:
    import importlib.metadata as md

    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    versions = {}
    for pkg in ("ray", "raydp", "pyspark", "aiokafka", "deltalake", "pyarrow"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[pkg] = md.version(pkg)
    cpu = ""
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    return {
        "nproc": os.cpu_count(),
        "ram_gb": round(mem_gb, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "broker": "tansu 0.6.0 (embedded, memory engine)",
        **versions,
    }


README = Path(__file__).resolve().parent / "README.md"
START, END = "<!-- results:start (written by run.py) -->", "<!-- results:end -->"


def update_readme(doc: dict, pngs: list[Path]) -> None:
    """Replace the results block of bench/README.md with this run's machine, table and plots."""
    if not README.exists():
        return
    text = README.read_text()
    if START not in text or END not in text:
        return
    m = doc["machine"]
    targets = [r for r in rows(doc["scenarios"]) if r[7]]
    block = [
        START,
        "Scenarios run at: "
        + ", ".join(
            f"{k} {v.get('ran_at', doc['when'])} ({v.get('wall_s', 0) / 60:.0f} min)"
            for k, v in sorted(doc["scenarios"].items())
        )
        + f". Machine: {m['nproc']} cores "
        f"({m['cpu']}), {m['ram_gb']} GB RAM, Linux {m['kernel']}, Python {m['python']}; "
        + ", ".join(
            f"{k} {m[k]}"
            for k in ("ray", "raydp", "pyspark", "aiokafka", "deltalake", "pyarrow")
            if k in m
        )
        + f"; broker {m['broker']}.",
        "",
        markdown(doc["scenarios"]),
        "",
        "Targets (issue 7), this run:",
        "",
        *[
            f"- {r[0]}: {r[1]} -> **{r[4]}** (target {r[7]}: {'met' if r[8] == 'yes' else 'NOT met'}; "
            f"ceiling {r[2]}, baseline {r[3]}, rc/ceiling {r[5]}, rc/baseline {r[6]})"
            for r in targets
        ],
        "",
        *[f"![{p.stem}](results/{p.name})" for p in pngs],
        END,
    ]
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + "\n".join(block) + tail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke test of a few minutes"
    )
    ap.add_argument("--only", default="a,b,c,d,e,s,i", help="scenarios to run, e.g. a,c")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: re-render the table, plots and README from results.json",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="results folder (default bench/results, --quick: bench/results/quick)",
    )
    ap.add_argument(
        "--h-partitions", default=None, help="scenario h: only these partition counts, e.g. 1024"
    )
    ap.add_argument(
        "--b-partitions",
        type=int,
        default=None,
        help="scenario b: partitions of each topic (default 8; issue 28's freshness at 1,024)",
    )
    ap.add_argument(
        "--b-only",
        default=None,
        help="scenario b: only these contenders, e.g. ceiling,rayconnect_latency_profile",
    )
    ap.add_argument(
        "--h-partitions-per-host",
        type=int,
        default=None,
        help="scenario h: partitions_per_host for rayconnect (default: rayconnect's default)",
    )
    ap.add_argument(
        "--spark-start",
        choices=("with_pipeline", "when_needed"),
        default=None,
        help="spark.start for every rayconnect contender (default: rayconnect's default)",
    )
    args = ap.parse_args()
    if args.spark_start:
        import rc_runner

        rc_runner.SPARK_OVERRIDES["start"] = args.spark_start
    cfg = QUICK if args.quick else FULL
    if args.h_partitions:
        cfg = cfg | {"h_only": [int(p) for p in args.h_partitions.split(",")]}
    if args.b_partitions:
        cfg = cfg | {"b_partitions": args.b_partitions}
    if args.b_only:
        cfg = cfg | {"b_only": args.b_only.split(",")}
    if args.h_partitions_per_host:
        cfg = cfg | {"h_settings": {"partitions_per_host": args.h_partitions_per_host}}
    out_dir = Path(args.out) if args.out else (RESULTS / "quick" if args.quick else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    only = [s.strip() for s in args.only.split(",") if s.strip()] if not args.report_only else []
    results: dict[str, Any] = {}
    # keep the results of scenarios not re-run (so --only refreshes part of the table)
    previous = out_dir / "results.json"
    if previous.exists():
        try:
            results = json.loads(previous.read_text()).get("scenarios", {})
        except json.JSONDecodeError:
            results = {}
    workdir = tempfile.mkdtemp(prefix="rc-bench-")
    started = time.time()
    errors = {}
    try:
        for s in only:
            log(f"scenario {s}")
            t = time.monotonic()
            try:
                if s == "a":
                    results["a"] = scenario_a(cfg, workdir)
                elif s == "b":
                    results["b"] = scenario_b(cfg, workdir)
                elif s == "c":
                    results["c"] = scenario_c(cfg, workdir)
                elif s == "d":
                    results["d"] = scenario_d(
                        cfg, workdir, results.get("a")
                    )  # (a) of this run, or the last one kept
                elif s == "e":
                    results["e"] = scenario_e(cfg, workdir)
                elif s == "h":
                    results["h"] = scenario_h(cfg, workdir)
                elif s == "s":
                    results["s"] = scenario_s(cfg, workdir)
                elif s == "i":
                    results["i"] = scenario_i(cfg, workdir)
                elif s == "v":
                    results["v"] = scenario_v(cfg, workdir)
                else:
                    raise SystemExit(f"unknown scenario {s!r}")
                results[s]["wall_s"] = round(time.monotonic() - t, 1)
                results[s]["ran_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            except Exception as exc:
                traceback.print_exc()
                errors[s] = f"{type(exc).__name__}: {exc}"
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
                os.makedirs(workdir, exist_ok=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        cleanup_private_tmp()
    doc = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "quick": args.quick,
        "wall_s": round(time.time() - started, 1),
        "machine": machine(),
        "sizes": cfg,
        "errors": errors,
        "scenarios": results,
    }
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    from plots import plot_all

    pngs = plot_all(doc, out_dir)
    md = [
        f"# rayconnect benchmark results ({'quick' if args.quick else 'full'} run)",
        "",
        f"Run {doc['when']}, {doc['wall_s'] / 60:.1f} min. Machine: {doc['machine']}",
        "",
        markdown(results),
        "",
    ]
    if errors:
        md += ["Errors:", ""] + [f"- {k}: {v}" for k, v in errors.items()] + [""]
    md += [f"![{p.stem}]({p.name})" for p in pngs]
    (out_dir / "results.md").write_text("\n".join(md) + "\n")
    if out_dir == RESULTS and not args.quick:
        update_readme(doc, pngs)
    print()
    print(text_table(results))
    if errors:
        print("\nerrors:", errors)
    print(f"\nwrote {out_dir}/results.md, results.json and {len(pngs)} plots")


if __name__ == "__main__":
    main()
