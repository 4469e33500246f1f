"""When the writer starts Spark: with the pipeline, or once its own process is too busy.

A pure machine (no Spark, no clock of its own): the writer tells it how long each write made
in its own process took, and asks whether Spark should start now.

Why there is a choice, measured on a 2-core machine (bench/results/spark-start): Spark's
JVMs take 26-30 CPU-seconds to start and warm up, while the writer's own process writes a
2M-record backlog of 8 or 1,024 partitions (Arrow's Parquet writer, the files a Spark task
writes) in 7-14 s without a single Spark job. Started with the pipeline, Spark took half of
the machine for the whole drain and gave nothing back (8 partitions: 121k rec/s with it,
213k without, same hour). On a cluster Spark's executors write in parallel on many nodes,
which one process cannot.

So ``when_needed``: writes are made in the writer's process until they keep it busy -
writing for at least ``busy_fraction`` of the last ``busy_window_s`` - and Spark starts
then (still writing here meanwhile, as at any start). A pipeline with a transform needs
Spark SQL from its first round and starts it with the pipeline either way. Spark never
stops again once started: a pipeline busy once is likely to be busy again, and a start
costs far more than an idle Spark.
"""

from __future__ import annotations

from collections import deque

import msgspec


class StartVerdict(msgspec.Struct, frozen=True):
    """Whether to start Spark now, and why (logged and shown in the writer's stats)."""

    start: bool
    reason: str = ""


class BusyWindow:
    """How much of the last ``window_s`` the writer's process spent writing.

    ``wrote(start, end)`` for each write made here (monotonic seconds, in any order of
    calls but not overlapping: the writer makes one at a time); ``verdict(now)`` says start
    once the busy share of ``[now - window_s, now]`` reaches ``fraction``. No verdict to
    start before a whole window has passed since the first write: a few slow first writes
    (imports, the store's first connection) are not a load."""

    def __init__(self, window_s: float, fraction: float) -> None:
        if window_s <= 0 or not 0 < fraction <= 1:
            raise ValueError("window_s must be > 0 and fraction in (0, 1]")
        self.window_s = window_s
        self.fraction = fraction
        self._writes: deque[tuple[float, float]] = deque()
        self._first: float | None = None

    def wrote(self, start: float, end: float) -> None:
        if end < start:
            raise ValueError(f"a write cannot end ({end}) before it starts ({start})")
        self._first = start if self._first is None else min(self._first, start)
        self._writes.append((start, end))

    def busy_s(self, now: float) -> float:
        """Seconds spent writing within ``[now - window_s, now]``."""
        since = now - self.window_s
        while self._writes and self._writes[0][1] <= since:
            self._writes.popleft()
        return sum(min(end, now) - max(start, since) for start, end in self._writes)

    def verdict(self, now: float) -> StartVerdict:
        if self._first is None or now - self._first < self.window_s:
            return StartVerdict(False)
        busy = self.busy_s(now)
        if busy < self.fraction * self.window_s:
            return StartVerdict(False)
        return StartVerdict(
            True,
            f"writes in the writer's process took {busy:.1f} s of the last "
            f"{self.window_s:g} s (start_when_busy {self.fraction:g})",
        )
