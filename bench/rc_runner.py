"""Run a rayconnect sink pipeline over a topic on the embedded broker and measure it.

Used by ``bench/run.py`` and ``bench/profile_pipeline.py``; needs a Ray session (see
``common.RaySession``).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import ray
from common import (
    MemorySampler,
    delta_visibility,
    ensure_session_latest,
    iceberg_commits,
    sustained_rate,
)

import rayconnect as rc
from rayconnect import ray_internals
from rayconnect.actors import names

#: Spark settings laid over every contender's (``run.py --spark-start``): the same scenarios,
#: baseline and ceiling again, with one setting changed
SPARK_OVERRIDES: dict[str, Any] = {}


def pipeline(
    name: str, bootstrap: str, topic: str, table: str | rc.IcebergSink, **settings: Any
) -> rc.SinkPipeline:
    source_opts = settings.pop("source", {})
    storage_options = settings.pop("storage_options", {})
    sink_opts = settings.pop("sink", {})  # e.g. write_mode="upsert"
    spark = settings.get("spark") or {}  # e.g. {"write_here_max_rows": 100000}
    if isinstance(spark, dict) and (spark or SPARK_OVERRIDES):
        settings["spark"] = rc.SparkSettings(**(spark | SPARK_OVERRIDES))
    ensure_session_latest(ray_internals.session_dir())
    meta = rc.StaticMetadataService(
        (rc.KafkaStream(topic, {"local": rc.ClusterMetadata(bootstrap, (topic,))}),)
    )
    return rc.SinkPipeline(
        name,
        rc.KafkaSource(meta, **source_opts),
        table
        if isinstance(table, rc.IcebergSink)
        else rc.DeltaSink(table, storage_options=storage_options, **sink_opts),
        **settings,
    )


def stop(name: str, handle: rc.PipelineHandle | None) -> None:
    try:
        writer = ray.get_actor(names.writer(name), namespace=names.NAMESPACE)
        ray.get(writer.close.remote(), timeout=60)  # JVMs end cleanly, not killed with the actor
    except Exception:
        pass
    if handle is not None:
        with contextlib.suppress(Exception):
            handle.stop(commit=False, timeout_s=30)


def idle_rounds(handle: rc.PipelineHandle, seconds: float, interval_s: float) -> dict[str, Any]:
    """Empty rounds (no data anywhere) for ``seconds``: their period, and END -> every
    WRITE-STATUS -> next START (``last_end_to_start_s``: the protocol's own cost of a round;
    the interval counts from END, so the period alone would hide it)."""
    coord = ray.get_actor(names.coordinator(handle.name), namespace=names.NAMESPACE)
    changes: list[float] = []
    turnarounds: list[float] = []
    last = ray.get(coord.status.remote()).rounds_since_start.empty
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = ray.get(coord.status.remote())
        if status.rounds_since_start.empty != last:
            changes.append(time.monotonic())
            turnarounds.append(status["last_end_to_start_s"])
            last = status.rounds_since_start.empty
        time.sleep(0.02)
    if len(changes) < 2:
        return {"rounds": len(changes), "period_s": None, "overhead_s": None}
    periods = [b - a for a, b in zip(changes, changes[1:], strict=False)]
    return {
        "rounds": len(changes) - 1,
        "period_s": statistics.median(periods),
        "overhead_s": statistics.median(turnarounds),
        "overhead_max_s": max(turnarounds),
    }


def run_backlog(
    name: str,
    bootstrap: str,
    topic: str,
    table: str | rc.IcebergSink,
    want: dict[int, int],
    settings: dict[str, Any],
    *,
    exclude_pids: tuple[int, ...] = (),
    idle_s: float = 0.0,
    timeout_s: float = 1800.0,
    during: Callable[[str], None] | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start a pipeline over a backlog already in ``topic``, wait until every record is
    committed; rate = records / (commit time of the last version - ``start()`` called).

    The clock starts when ``start()`` is called: readers read (and rounds commit, the
    writer writing them itself while Spark starts) before it returns, so any later moment
    would leave out reading already done. ``startup_s`` is how long ``start()`` took.
    ``table`` may be on object storage (``s3://...`` with ``storage_options``), or an
    ``rc.IcebergSink``."""
    want_keys = {f"local/{topic}/{p}": n for p, n in want.items() if n}
    total = sum(want.values())
    interval = settings.get("commit_interval_s", 10.0)
    handle = None
    sampler = MemorySampler(root=os.getpid(), exclude=exclude_pids)
    with sampler:
        try:
            t_start = time.monotonic()
            t0 = time.time()
            handle = pipeline(
                name, bootstrap, topic, table, storage_options=storage_options, **dict(settings)
            ).start(wait_for_spark=False)
            startup = time.monotonic() - t_start
            sampler.mark()
            if during is not None:
                during(name)
            status = handle.wait_for(
                lambda s: s["offsets"] == want_keys, timeout_s=timeout_s, poll_s=0.2
            )
            seen = time.time()
            writer = ray.get_actor(names.writer(name), namespace=names.NAMESPACE)
            wstats = ray.get(writer.stats.remote())
            idle = idle_rounds(handle, idle_s, interval) if idle_s else None
        finally:
            stop(name, handle)
    files_per_round: list[int] = []
    if isinstance(table, rc.IcebergSink):
        # expired snapshots are gone: the last two data snapshots give both rates
        commits = iceberg_commits(table)
        last_commit = commits[-1][0] if commits else seen
        sustained = (
            (total - commits[-1][1]) / max(commits[-2][0] - t0, 1e-3) if len(commits) >= 2 else None
        )
    else:
        versions = delta_visibility(table, storage_options=storage_options)
        last_commit = max(t for _, t, adds in versions if adds) if versions else seen
        files_per_round = sorted(len(adds) for _, _, adds in versions if adds)
        sustained = sustained_rate(table, t0, storage_options)
    elapsed = max(last_commit - t0, 1e-3)
    arrow_bytes = sum(r.bytes_read for r in status.readers.values())
    rounds = status.rounds_since_start.committed
    return {
        "records": total,
        "partitions": len(want_keys),
        "startup_s": startup,
        "startup_phases_s": getattr(handle, "startup", {}),
        "seconds": elapsed,
        "records_per_s": total / elapsed,
        "sustained_records_per_s": sustained,
        "arrow_mb_per_s": arrow_bytes / elapsed / 1e6,
        "rounds_committed": rounds,
        "rounds_drained": status.rounds_since_start.drained,
        "round_s_median": status.get("round_s_median"),
        "round_s_max": status.get("round_s_max"),
        "end_to_start_s_median": status.get("end_to_start_s_median"),
        "commit_s_median": status.get("commit_s_median"),
        "spark_jobs": wstats.spark_jobs,
        "spark_writes": wstats.spark_writes,
        "writer_calls": wstats.calls,
        "spark_jobs_per_round": wstats.spark_jobs / max(rounds, 1),
        # data files a version added (Delta): bounded by hosts x tasks, not partitions
        "files_per_round_max": files_per_round[-1] if files_per_round else None,
        "files_per_round_median": (
            files_per_round[len(files_per_round) // 2] if files_per_round else None
        ),
        "idle": idle,
        "memory": sampler.result(),
        "settings": {k: v for k, v in settings.items() if k not in ("source", "sink")}
        | settings.get("source", {}),
    }


def start_live(name: str, bootstrap: str, topic: str, table: str, settings: dict[str, Any]):
    return pipeline(name, bootstrap, topic, table, **dict(settings)).start()


def wait_committed(
    handle: rc.PipelineHandle, topic: str, counts: dict[int, int], timeout_s: float = 600
) -> dict:
    want_keys = {f"local/{topic}/{p}": n for p, n in counts.items() if n}
    return handle.wait_for(lambda s: s["offsets"] == want_keys, timeout_s=timeout_s, poll_s=0.2)
