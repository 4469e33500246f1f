"""Progress lines for long work: rewritten in place on a terminal, one line per step in logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Shows ``label: done/total (rate/s)`` at most every ``interval_s`` seconds.

    On a terminal the line is redrawn in place; otherwise (CI logs, ``ray job`` logs) a new
    line is printed each time, so progress stays readable in a file.
    """

    def __init__(
        self, label: str, total: int, *, stream: TextIO | None = None, interval_s: float = 0.5
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.started = time.monotonic()
        self._last = 0.0
        self._tty = self.stream.isatty()

    def update(self, done: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        pct = 100.0 * done / self.total if self.total else 100.0
        line = f"{self.label}: {done:,}/{self.total:,} ({pct:5.1f}%, {done / elapsed:,.0f}/s)"
        if self._tty:
            self.stream.write("\r" + line.ljust(78))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self, done: int) -> float:
        """Print the final line and return the elapsed seconds."""
        self.update(done, force=True)
        if self._tty:
            self.stream.write("\n")
        return time.monotonic() - self.started
