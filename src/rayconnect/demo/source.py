"""``rayconnect demo --source``: a source pipeline (any source -> Kafka, KIP-618) on real parts.

A GeneratorSource (numbered records on P source partitions) runs in two task actors that send
records and their source offsets to the embedded broker in Kafka transactions (one a second).
A line per second shows transactions and records committed; midway the demo SIGKILLs one task
and ``ray.kill``s the other (Ray restarts them; a killed task's open transaction is aborted
when its successor fences it). At the end it checks what a ``read_committed`` consumer sees:
every source partition's records exactly once and in order (seq 0..n-1), and the committed
source offsets (the pipeline's offsets topic) at each partition's last record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from rayconnect.demo.stage import DemoRun, DemoStage
from rayconnect.demo.view import LiveView

PIPELINE = "demo-source"
TOPIC = "numbers"
TASKS = 2
POLL_S = 0.1
"""Seconds between a task's polls, each of rate * POLL_S / TASKS records."""


@dataclass
class SourceDemoResult(DemoRun):
    partitions: int
    per_partition: int
    seqs: dict[int, list[int]]
    """Source partition -> seq numbers read back with read_committed, in offset order."""
    offsets: dict[str, Any]
    """Committed source offsets, from the pipeline's offsets topic."""
    written: int
    """Records in the topic, committed or not (read_uncommitted)."""

    @property
    def visible(self) -> int:
        return sum(len(s) for s in self.seqs.values())

    @property
    def ok(self) -> bool:
        from rayconnect.source_tasks.base import encode_partition

        want = list(range(self.per_partition))
        return all(self.seqs.get(p) == want for p in range(self.partitions)) and (
            set(self.seqs) == set(range(self.partitions))
            and self.offsets
            == {
                encode_partition({"generator": p}): {"seq": self.per_partition - 1}
                for p in range(self.partitions)
            }
        )


class _Tasks:
    """Counters summed over task incarnations (a restarted task counts from zero again), and
    the kills waiting for the killed task's successor to commit a transaction."""

    def __init__(self, view: LiveView) -> None:
        self.view = view
        self._seen: dict[tuple[int, int], tuple[int, int, int]] = {}  # (task, pid) -> counts
        self.pending: dict[int, tuple[str, int | None, float]] = {}  # task -> (label, pid, at)

    def total(self, i: int) -> int:
        return sum(v[i] for v in self._seen.values())

    def show(self, status: dict[str, Any], goal: int) -> None:
        tasks = status.get("tasks") or {}
        for index, t in tasks.items():
            if "records_committed" in t:
                key = (int(index), int(t.get("pid") or 0))
                self._seen[key] = (
                    t["transactions_committed"],
                    t["transactions_aborted"],
                    t["records_committed"],
                )
        states = "/".join(str((tasks.get(i) or {}).get("state", "-")) for i in range(TASKS))
        self.view.event(
            f"tasks {states} | transactions {self.total(0):,} committed / {self.total(1):,} "
            f"aborted | records {self.total(2):,} committed of {goal:,}"
        )
        now = time.monotonic()
        for index, (label, pid, at) in list(self.pending.items()):
            t = tasks.get(index) or {}
            if t.get("pid") not in (None, pid) and t.get("transactions_committed", 0) > 0:
                del self.pending[index]
                self.view.recoveries[label] = now - at
                self.view.event(
                    f"RECOVERED from the {label} kill: its successor committed a transaction "
                    f"{now - at:.1f} s after it"
                )


def _committed_offsets(bootstrap: str) -> dict[str, Any]:
    from rayconnect.config.source import default_offsets_topic
    from rayconnect.kafka.offsets_store import read_offsets

    snapshot = asyncio.run(read_offsets(bootstrap, default_offsets_topic(PIPELINE), PIPELINE))
    return dict(snapshot.offsets)


def run_source_demo(
    records: int = 40_000,
    partitions: int = 4,
    *,
    rate: int = 2_000,
    chaos: bool = True,
    timeout_s: float = 180.0,
    out: TextIO = sys.stdout,
) -> SourceDemoResult:
    import rayconnect as rc
    from rayconnect.demo.chaos import kill_actor
    from rayconnect.kafka.read_back import read_topic
    from rayconnect.source_tasks.base import encode_partition
    from rayconnect.source_tasks.generator import sequences

    per = -(-records // partitions)
    goal = per * partitions
    batch = max(1, round(rate * POLL_S / TASKS))
    task = rc.GeneratorSource(
        TOPIC,
        partitions=partitions,
        records_per_partition=per,
        batch_size=batch,
        poll_delay_s=POLL_S,
    )
    run_s = goal / rate
    banner = (
        f"rayconnect demo --source: {goal:,} records ({per:,} on each of {partitions} source "
        f"partitions) at ~{rate:,}/s ({run_s:.0f} s), {TASKS} tasks, a transaction a second, "
        f"chaos {'on' if chaos else 'off'} -> topic {TOPIC!r}"
    )
    stage = DemoStage(banner, out, cluster_id="target", topic=TOPIC, partitions=partitions)
    view, timings = stage.view, stage.timings
    tasks = _Tasks(view)
    done_kills: list[str] = []
    want = {encode_partition({"generator": p}): {"seq": per - 1} for p in range(partitions)}
    with stage:
        bootstrap = stage.bootstrap
        try:
            t = time.monotonic()
            handle = rc.SourcePipeline(
                PIPELINE,
                task=task,
                target=rc.KafkaTarget(bootstrap),
                tasks=TASKS,
                # A transaction stays open for a second: a kill cuts one, and the successor's
                # fencing must abort it for read_committed to stay exactly once.
                transaction_boundary="interval",
                transaction_boundary_interval_s=1.0,
                exactly_once="required",
            ).start()
            timings["start_s"] = time.monotonic() - t
            view.event(f"pipeline {PIPELINE!r} running ({timings['start_s']:.1f} s to start)")
            t = time.monotonic()
            kills = [(t + 0.3 * run_s, 0, "sigkill"), (t + 0.6 * run_s, 1, "ray.kill")]
            kills = kills if chaos else []
            caught_up, deadline = False, t + run_s + timeout_s
            while not caught_up and time.monotonic() < deadline:
                tick = time.monotonic()
                if kills and tick >= kills[0][0] and not tasks.pending:
                    _, index, how = kills.pop(0)
                    name = _task_name(index)
                    before = _pid(handle, index)
                    pid = kill_actor(name, how)
                    label = f"task {index}"
                    view.event(
                        f"CHAOS   {'SIGKILL' if pid else 'ray.kill'} {label} "
                        f"({f'pid {pid}' if pid else name}); Ray restarts it"
                    )
                    tasks.pending[index] = (label, before, time.monotonic())
                    done_kills.append(f"{label} ({how})")
                try:
                    tasks.show(handle.status(timeout_s=3), goal)
                except Exception as e:  # a task restarting
                    view.unavailable(e)
                if not kills and tick >= t + run_s:
                    caught_up = _committed_offsets(bootstrap) == want
                time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
            timings["run_s"] = time.monotonic() - t
            if tasks.pending:  # the last commit may have come after the last status
                with contextlib.suppress(Exception):
                    tasks.show(handle.status(timeout_s=3), goal)
            for label, _, _ in tasks.pending.values():
                view.event(f"{label} restarted with nothing left to write: no commit to time")
            view.event(
                "every record committed" if caught_up else f"NOT finished after {timeout_s:g} s"
            )
            t = time.monotonic()
            handle.stop()
            timings["stop_s"] = time.monotonic() - t
        finally:
            stage.stop_ray()
        t = time.monotonic()
        values = [json.loads(v) for _, v in asyncio.run(read_topic(bootstrap, TOPIC))]
        written = len(asyncio.run(read_topic(bootstrap, TOPIC, "read_uncommitted")))
        result = SourceDemoResult(
            partitions=partitions,
            per_partition=per,
            seqs=sequences(values),
            offsets=_committed_offsets(bootstrap),
            written=written,
        )
        timings["verify_s"] = time.monotonic() - t
    result.elapsed_s = stage.elapsed_s
    result.kills, result.recoveries, result.timings = done_kills, view.recoveries, timings
    _summary(result, out)
    stage.finish(result.ok)
    return result


def _task_name(index: int) -> str:
    from rayconnect.actors import names

    return names.task(PIPELINE, index)


def _pid(handle: Any, index: int) -> int | None:
    """The task's process: a successor has another one (restart counts can lag behind)."""
    try:
        return handle.status(timeout_s=3)["tasks"][index].get("pid")
    except Exception:
        return None


def _summary(r: SourceDemoResult, out: TextIO) -> None:
    def line(label: str, text: str) -> None:
        print(f"  {label:<18} {text}", file=out)

    print("", file=out)
    line(
        "generated",
        f"{r.per_partition * r.partitions:,} records, seq 0..{r.per_partition - 1:,} per source partition",
    )
    line(
        "read_committed",
        f"{r.visible:,} records; in the topic {r.written:,} (aborted by kills: {r.written - r.visible:,})",
    )
    in_order = all(s == list(range(r.per_partition)) for s in r.seqs.values())
    line(
        "per partition",
        ", ".join(f"p{p}={len(s):,}" for p, s in sorted(r.seqs.items()))
        + (" each 0..n-1 in order" if in_order else " NOT 0..n-1 in order"),
    )
    line(
        "source offsets",
        ", ".join(
            f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(r.offsets.items())
        )
        or "-",
    )
    for label, text in r.summary_lines():
        line(label, text)
    verdict = (
        "OK: exactly once" if r.ok else "FAILED: the topic does not hold each record exactly once"
    )
    line("result", verdict)
