"""Is the broker reachable? What a reader shows while its cluster is down or cut off.

aiokafka hides an outage from its user: ``getmany`` keeps returning nothing while its
fetcher retries in the background, so a reader cannot tell "no new records" from "no
broker". A light, periodic metadata request through the consumer's own client (same
addresses, same security settings) tells them apart: it fails at once when connections are
refused or reset, and times out when the network black-holes them.

Each observation is also handed to ``report`` (the reader tells its coordinator, which
decides when a pipeline gives up: ``protocol.outages``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["Reachability", "watch"]

PROBE_PERIOD_S = 2.0
PROBE_TIMEOUT_S = 5.0


@dataclass
class Reachability:
    """Since when (wall clock) the broker has not answered, and the last reason; None = fine."""

    unreachable_since: float | None = None
    reason: str | None = None
    outages: int = 0

    def observe(self, error: BaseException | None, now: float) -> None:
        if error is None:
            self.unreachable_since = self.reason = None
            return
        if self.unreachable_since is None:
            self.unreachable_since = now
            self.outages += 1
        name, text = type(error).__name__, str(error)
        self.reason = text if text.startswith(name) else f"{name}: {text}" if text else name

    def describe(self) -> str | None:
        """``"broker unreachable since 2026-...Z (12 s): <reason>"`` while it lasts."""
        if self.unreachable_since is None:
            return None
        since = datetime.fromtimestamp(self.unreachable_since, UTC).isoformat(timespec="seconds")
        lasted = time.time() - self.unreachable_since
        return f"broker unreachable since {since} ({lasted:.0f} s): {self.reason}"


async def watch(
    consumer: Any,
    state: Reachability,
    period_s: float = PROBE_PERIOD_S,
    timeout_s: float = PROBE_TIMEOUT_S,
    report: Callable[[Reachability], Awaitable[None]] | None = None,
) -> None:
    """Probe ``consumer``'s cluster every ``period_s`` until cancelled, recording in
    ``state`` and, after each probe, calling ``report(state)``."""
    while True:
        try:
            await asyncio.wait_for(consumer.topics(), timeout_s)
            error: BaseException | None = None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # refused, reset, timed out: all mean "not reachable now"
            error = (
                e
                if not isinstance(e, TimeoutError)
                else TimeoutError(f"no answer in {timeout_s:g} s")
            )
        state.observe(error, time.time())
        if report is not None:
            await report(state)
        await asyncio.sleep(period_s)
