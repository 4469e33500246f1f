"""How a foreground command (``run``, ``mirror``) takes Ctrl-C and SIGTERM: the first asks
for a clean stop (the last round committed), a second one stops at once."""

from __future__ import annotations

import contextlib
import signal
import time

__all__ = ["SAME_STOP_WITHIN_S", "stop_signals"]


#: A second stop signal this soon after the first is the same stop, not a second Ctrl-C:
#: ``timeout(1)`` sends its one SIGTERM to the command and then to its process group, so the
#: command gets it twice within milliseconds; a person pressing Ctrl-C again takes longer.
SAME_STOP_WITHIN_S = 1.0


@contextlib.contextmanager
def stop_signals():
    """While inside: the first Ctrl-C/SIGTERM is recorded in the yielded list (the loop then
    stops cleanly); a second one, ``SAME_STOP_WITHIN_S`` or more later, raises
    KeyboardInterrupt (stop at once)."""
    stop_requested: list[str] = []
    first_at: list[float] = []

    def on_signal(signum, _frame) -> None:
        now = time.monotonic()
        if stop_requested:
            if now - first_at[0] < SAME_STOP_WITHIN_S:
                return  # the same stop delivered twice
            raise KeyboardInterrupt  # a second signal: stop without the last round
        stop_requested.append(signal.Signals(signum).name)
        first_at.append(now)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop_requested
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
