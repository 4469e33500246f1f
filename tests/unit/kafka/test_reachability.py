"""The reader's broker-reachability record: an outage starts once, shows, and clears."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rayconnect.kafka.reachability import Reachability, watch


def test_outage_since_its_first_failure_and_cleared_by_an_answer() -> None:
    state = Reachability()
    assert state.describe() is None
    state.observe(ConnectionRefusedError("refused"), now=1000.0)
    state.observe(TimeoutError("no answer in 5 s"), now=1002.0)
    assert state.unreachable_since == 1000.0 and state.outages == 1
    text = state.describe()
    assert text is not None
    assert text.startswith("broker unreachable since 1970-01-01T00:16:40+00:00")
    assert text.endswith("TimeoutError: no answer in 5 s")
    state.observe(None, now=1003.0)
    assert state.unreachable_since is None and state.describe() is None
    state.observe(OSError(), now=1010.0)
    assert state.outages == 2 and state.reason == "OSError"
    state.observe(_Named("_Named: said twice"), now=1011.0)
    assert state.reason == "_Named: said twice"  # aiokafka's errors name themselves


class _Named(Exception):
    pass


class _Consumer:
    """Answers metadata requests as told: ok, raise, or hang (a black-holed network)."""

    def __init__(self) -> None:
        self.mode = "ok"

    async def topics(self) -> set[str]:
        if self.mode == "raise":
            raise ConnectionResetError("reset by peer")
        if self.mode == "hang":
            await asyncio.sleep(3600)
        return {"t"}


async def _until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


async def test_watch_sees_refusals_and_stalls_and_the_recovery() -> None:
    consumer, state = _Consumer(), Reachability()
    task = asyncio.create_task(watch(consumer, state, period_s=0.01, timeout_s=0.05))
    try:
        consumer.mode = "raise"
        await _until(lambda: state.unreachable_since is not None)
        assert "ConnectionResetError" in (state.reason or "")
        consumer.mode = "ok"
        await _until(lambda: state.unreachable_since is None)
        consumer.mode = "hang"
        await _until(lambda: state.unreachable_since is not None)
        assert state.reason == "TimeoutError: no answer in 0.05 s" and state.outages == 2
    finally:
        task.cancel()
