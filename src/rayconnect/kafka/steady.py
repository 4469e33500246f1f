"""A producer that writes demo records at a steady rate from a background thread.

The demo needs a live stream while the pipeline runs (rounds commit what arrived since the
last one, lag stays small, a kill happens while records keep coming), and its driver thread
must stay free to print the live view and to kill actors. So the producer runs its own
asyncio loop in a daemon thread, paced in 0.1 s ticks, and counts only acknowledged records:
after ``stop()`` its counts per partition are what the broker holds, which is what the
exactly-once check compares the table with.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

from rayconnect.kafka import compat
from rayconnect.kafka.admin import demo_value

__all__ = ["SteadyProducer"]

_TICK_S = 0.1


class SteadyProducer:
    """``total`` records, keys ``key-<i>``, round-robin over ``partitions``, ``rate`` per second."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, total: int, rate: float
    ) -> None:
        if total <= 0 or rate <= 0 or partitions <= 0:
            raise ValueError("total, rate and partitions must be positive")
        self.bootstrap, self.topic = bootstrap, topic
        self.partitions, self.total, self.rate = partitions, total, rate
        self._acked: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.finished = threading.Event()
        """Set when the thread ends: every record sent and acknowledged, stopped, or failed."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name="rayconnect-demo-producer", daemon=True
        )

    @property
    def produced(self) -> int:
        """Records acknowledged by the broker so far."""
        with self._lock:
            return sum(self._acked.values())

    def counts(self) -> dict[int, int]:
        """``{partition: records acknowledged}`` (every partition, zeros included)."""
        with self._lock:
            return {p: self._acked[p] for p in range(self.partitions)}

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> dict[int, int]:
        """Stop sending (what was sent is still acknowledged), wait for the thread; the counts.

        Raises what the producer failed with: counts of a failed producer cannot be trusted
        as "what the broker holds"."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the demo producer did not stop within {timeout_s} s")
        if self.error is not None:
            raise RuntimeError(f"the demo producer failed: {self.error!r}") from self.error
        return self.counts()

    def _run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as e:  # reported by stop(); the thread must not die silently
            self.error = e
        finally:
            self.finished.set()

    async def _produce(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer = compat.own(
            AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, acks="all")
        )
        await producer.start()
        try:
            started, sent = time.monotonic(), 0
            while sent < self.total and not self._stop.is_set():
                due = min(self.total, int(self.rate * (time.monotonic() - started)) + 1)
                sends = []
                for i in range(sent, due):
                    key = f"key-{i}"
                    part = i % self.partitions
                    fut = await producer.send(
                        self.topic, demo_value(i, key), key=key.encode(), partition=part
                    )
                    sends.append((part, fut))
                sent = due
                for part, fut in sends:
                    await fut
                    with self._lock:
                        self._acked[part] += 1
                if sent < self.total:
                    await asyncio.sleep(_TICK_S)
        finally:
            await producer.stop()
