"""``rayconnect demo``: the product working, end to end, on real parts, in under two minutes.

An embedded broker (tansu), a producer writing demo records at a steady rate, and a real sink
pipeline (``rc.SinkPipeline(...).start()``: coordinator, a participant host with every
partition's participant, readers, the Spark-on-Ray writer) committing a round every
``interval_s`` seconds. A live view shows rounds, records committed vs produced, lag per
partition. Midway the demo kills the coordinator, the participant host and the writer (Ray
restarts each) and says so. At the end it stops the producer, waits until the committed offsets reach the high watermarks, stops the
pipeline, and checks exactly once from the table alone: every produced (partition, offset)
exactly once, and each partition's Delta txn version (the committed offset) equal to its
high watermark. The exit status says whether that held.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow.compute as pc

from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST
from rayconnect.demo.stage import DemoStage
from rayconnect.demo.view import LiveView
from rayconnect.errors import RayconnectError
from rayconnect.protocol.status import PipelineStatus

PIPELINE = "demo"
CLUSTER = "local"
TOPIC = "demo-events"
CHAOS_AT = (0.2, 0.4, 0.6)
"""When each kill happens, as a fraction of the producer's run (records / rate seconds)."""


class DemoError(RayconnectError, RuntimeError):
    """The demo cannot run with the arguments given."""


@dataclass
class DemoResult:
    rows: int
    distinct: int
    offsets: dict[str, int]
    """Committed offset per partition key: the table's Delta txn versions."""
    expected: dict[str, int]
    """High watermark per partition key, read from the broker after the producer stopped."""
    produced: dict[str, int]
    """Records the producer had acknowledged, per partition key."""
    exact: bool
    version: int
    elapsed_s: float
    table: str
    rounds: tuple[int, int] = (0, 0)
    kills: list[str] = field(default_factory=list)
    recoveries: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        n = sum(self.expected.values())
        return (
            self.exact
            and self.rows == n
            and self.distinct == n
            and self.offsets == self.expected
            and self.produced == self.expected
        )


def _victims(partitions: int) -> list[tuple[str, str, str]]:
    """(label, actor name, how) of each kill, in order: every role that holds round state."""
    from rayconnect.actors import names

    part = f"{CLUSTER}/{TOPIC}/{min(1, partitions - 1)}"
    host = names.participant_host(PIPELINE, part, DEFAULT_PARTITIONS_PER_HOST)
    return [
        ("coordinator", names.coordinator(PIPELINE), "ray.kill"),
        (f"participant host {host.split('/participants/')[1]}", host, "sigkill"),
        ("writer", names.writer(PIPELINE), "sigkill"),
    ]


def _pipeline(bootstrap: str, table: str, interval_s: float, spark_start: str | None) -> Any:
    import rayconnect as rc

    meta = rc.StaticMetadataService(
        (rc.KafkaStream(TOPIC, {CLUSTER: rc.ClusterMetadata(bootstrap, (TOPIC,))}),)
    )
    # A participant that died mid-round holds the others back at most write_timeout_s.
    return rc.SinkPipeline(
        PIPELINE,
        rc.KafkaSource(meta),
        rc.DeltaSink(table),
        commit_interval_s=interval_s,
        write_timeout_s=10,
        **({"spark": rc.SparkSettings(start=spark_start)} if spark_start else {}),
    )


class _Watch:
    """Status lines every second until a condition holds; kills at their times (or later)."""

    def __init__(self, handle, view: LiveView, producer, kills: list[tuple[float, tuple]]) -> None:
        self.handle, self.view, self.producer, self.kills = handle, view, producer, kills
        self.done_kills: list[str] = []
        self.status: PipelineStatus | None = None

    def chaos_done(self) -> bool:
        """Every kill made and recovered from."""
        return not self.kills and self.view.steady()

    def until(self, predicate, timeout_s: float) -> bool:
        import ray

        from rayconnect.demo.chaos import kill_actor

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            tick = time.monotonic()
            # One kill at a time, each on a pipeline that has committed since the last one.
            if self.kills and tick >= self.kills[0][0] and self.view.steady():
                _, (label, name, how) = self.kills.pop(0)
                pid = kill_actor(name, how)
                detail = f"pid {pid}" if pid else name
                self.view.killed(
                    label, "SIGKILL" if pid else "ray.kill", detail, self.producer.produced
                )
                self.done_kills.append(f"{label} ({how})")
            try:
                self.status = self.handle.status(timeout_s=3)
                self.view.status(self.status, self.producer.produced)
            except (ray.exceptions.RayError, TimeoutError) as e:
                self.view.unavailable(e)
            if predicate(self.status):
                return True
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        return False


def run_demo(
    records: int = 40_000,
    partitions: int = 4,
    table: str | None = None,
    *,
    rate: int = 2_000,
    interval_s: float = 2.0,
    chaos: bool = True,
    catch_up_timeout_s: float = 180.0,
    out: TextIO = sys.stdout,
    spark_start: str | None = None,
) -> DemoResult:
    from rayconnect.kafka.admin import high_watermarks
    from rayconnect.kafka.steady import SteadyProducer
    from rayconnect.spark_bridge.session import require_java

    if table is not None and Path(table, "_delta_log").exists():
        raise DemoError(
            f"{Path(table).resolve()} already holds a Delta table; the demo starts a fresh "
            "broker whose offsets restart at 0, so give it a new --table path (or none for a "
            "temp folder)"
        )
    require_java()  # before the temp folder: a refused Java left an empty one behind
    table_path = str(Path(table or tempfile.mkdtemp(prefix="rayconnect-demo-")).resolve())
    run_s = records / rate
    banner = (
        f"rayconnect demo: {records:,} records at {rate:,}/s ({run_s:.0f} s), {partitions} "
        f"partitions, a round every {interval_s:g} s, chaos {'on' if chaos else 'off'} "
        f"-> {table_path}"
    )
    stage = DemoStage(banner, out, cluster_id=CLUSTER, topic=TOPIC, partitions=partitions)
    view, step = stage.view, stage.step
    with stage:
        bootstrap = stage.bootstrap
        producer = None
        try:
            t = time.monotonic()
            view.event("pipeline starting: writer, participants, coordinator, readers...")
            # With spark_start="with_pipeline" this waits for Spark (records flow meanwhile):
            # the kills below should not land in Spark's start, which on 2 cores slows a
            # restarting actor. The default starts Spark only when writes need it.
            handle = _pipeline(bootstrap, table_path, interval_s, spark_start).start()
            step("start", t)
            view.event(f"pipeline {PIPELINE!r} running ({stage.timings['start_s']:.1f} s to start)")

            t = time.monotonic()
            producer = SteadyProducer(bootstrap, TOPIC, partitions, records, rate).start()
            view.event(f"producer {rate:,} records/s into {TOPIC!r}")
            kills = (
                [(t + f * run_s, v) for f, v in zip(CHAOS_AT, _victims(partitions), strict=True)]
                if chaos
                else []
            )
            watch = _Watch(handle, view, producer, kills)
            watch.until(lambda _: producer.finished.is_set(), run_s + 60)
            counts = producer.stop()
            step("produce", t)

            t = time.monotonic()
            hw = asyncio.run(high_watermarks(bootstrap, TOPIC))
            keys = {p: f"{CLUSTER}/{TOPIC}/{p}" for p in range(partitions)}
            expected = {keys[p]: hw.get(p, 0) for p in keys}
            want = {k: v for k, v in expected.items() if v}
            view.event(
                f"producer stopped at {sum(counts.values()):,} records; catching up to the "
                "high watermarks"
            )
            # Kills the producer did not outlast happen now: the pipeline still has a lag.
            caught_up = watch.until(
                lambda s: s is not None and s.offsets == want and watch.chaos_done(),
                catch_up_timeout_s,
            )
            step("catch_up", t)
            view.event(
                "caught up" if caught_up else f"NOT caught up after {catch_up_timeout_s:g} s"
            )

            t = time.monotonic()
            stopped = handle.stop(commit=True, timeout_s=60)
            if stopped.error:
                view.event(f"stop: {stopped.error}")
            step("stop", t)
        finally:
            if producer is not None and not producer.finished.is_set():
                with contextlib.suppress(Exception):  # the error in flight matters more
                    producer.stop()

    t = time.monotonic()
    result = _verify(table_path, keys, expected, counts)
    step("verify", t)
    result.elapsed_s = stage.elapsed_s
    result.rounds = view.rounds
    result.kills = watch.done_kills
    result.recoveries = view.recoveries
    result.timings = stage.timings
    _summary(result, out)
    stage.finish(result.ok)
    return result


def _verify(
    table_path: str, keys: dict[int, str], expected: dict[str, int], counts: dict[int, int]
) -> DemoResult:
    """From the table alone: rows, distinct (topic, partition, offset), each partition holding
    exactly the offsets 0..high watermark-1, and its Delta txn version (committed offset)."""
    from deltalake import DeltaTable

    from rayconnect.storage.delta_reads import delta_dataset
    from rayconnect.storage.location import TableLocation

    dt = DeltaTable(table_path)
    data = delta_dataset(dt, TableLocation.parse(table_path)).to_table(
        columns=["topic", "partition", "offset"]
    )
    distinct = data.group_by(["topic", "partition", "offset"]).aggregate([]).num_rows
    exact = True
    for p, key in keys.items():
        n = expected[key]
        offs = data.filter(pc.equal(data["partition"], p))["offset"].to_numpy()
        exact = exact and len(offs) == n and bool((np.sort(offs) == np.arange(n)).all())
    offsets = {key: dt.transaction_version(f"{PIPELINE}/{key}") or 0 for key in keys.values()}
    return DemoResult(
        rows=data.num_rows,
        distinct=distinct,
        exact=exact,
        offsets=offsets,
        expected=expected,
        produced={keys[p]: n for p, n in counts.items()},
        version=dt.version(),
        elapsed_s=0.0,
        table=table_path,
    )


def read_commands(table: str) -> tuple[str, str]:
    """Two shell lines that read the demo's table as printed, on the machine the demo ran on:
    this interpreter (a fresh install's ``.venv/bin/python`` is not on PATH), Polars, and
    DuckDB with its Delta extension from the ``duckdb-ext-delta`` wheel (``INSTALL delta``
    would download it). Both come with the install the README's first command makes."""
    python = sys.executable
    polars = f"{python} -c \"import polars as pl; print(pl.read_delta('{table}'))\""
    duck = (
        f'{python} -c "import duckdb, duckdb_ext; '
        "c = duckdb.connect(config={'extension_directory': duckdb_ext.__path__[0] + '/extensions'}); "
        f"c.sql('LOAD delta'); print(c.sql(\\\"SELECT count(*) FROM delta_scan('{table}')\\\"))\""
    )
    return polars, duck


def _summary(r: DemoResult, out: TextIO) -> None:
    n = sum(r.produced.values())
    line = lambda label, text: print(f"  {label:<18} {text}", file=out)  # noqa: E731
    print("", file=out)
    line("produced", f"{n:,} records (high watermarks {sum(r.expected.values()):,})")
    line("rows in table", f"{r.rows:,} ({r.distinct:,} distinct topic/partition/offset)")
    line("table version", f"{r.version} ({r.rounds[0]} rounds committed, {r.rounds[1]} discarded)")
    line("committed offsets", ", ".join(f"{k}={v}" for k, v in sorted(r.offsets.items())))
    line("high watermarks", ", ".join(f"{k}={v}" for k, v in sorted(r.expected.items())))
    if r.kills:
        line("killed", ", ".join(r.kills))
        line("recovery", ", ".join(f"{k} {v:.1f} s" for k, v in r.recoveries.items()) or "-")
    line("elapsed", f"{r.elapsed_s:.1f} s")
    line("steps", ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in r.timings.items()))
    line("table", r.table)
    for label, command in zip(("read it", ""), read_commands(r.table), strict=True):
        line(label, command)
    verdict = "OK: exactly once" if r.ok else "FAILED: table does not match what was produced"
    line("result", verdict)
