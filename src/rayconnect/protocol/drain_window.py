"""``DrainWindow``: has the pipeline as a whole just drained a backlog? (the coordinator's pacing)

Why: ``commit_when_drained`` lets a backlog land at read speed instead of one version per
``commit_interval_s``. Judged per partition (a flush's worth read since it last caught up)
that works for a few large partitions, but a 2M-record backlog over 1,024 partitions is
~2,000 records each: no partition ever holds a flush's worth, so every round waited out the
interval. The backlog is a property of the pipeline, so the coordinator judges it: each
participant tells it (``Drained``, at most once per round and once while reading ahead)
how much it read between catching up with its high watermark twice; the backlog is drained
when those reports, over the last ``commit_interval_s``, add up to a flush's worth.

Rules
-----
- A report counts for ``window_s`` seconds (the commit interval): steady traffic reports a
  fetch's worth per partition per round, far below a flush's worth in a window, so it keeps
  the interval's pacing; a backlog's reports add up within seconds.
- Only a report that arrived since the round last ended can end a round (``ends_round``):
  once a round ended on a backlog, the next one ends as soon as it starts if more was
  drained while the last one was written (what was read meanwhile is its data), and
  otherwise waits for the next report - or the interval. So rounds follow each other at
  write-and-commit speed while a backlog drains, its last partitions' reports end the last
  round, and a pipeline that caught up falls back to the interval within ``window_s``.
- Time is an argument, never read here.
"""

from __future__ import annotations

from collections import deque


class DrainWindow:
    """Reports of drained records over the last ``window_s`` seconds, against a threshold."""

    def __init__(self, window_s: float, records: int, nbytes: int) -> None:
        self.window_s = window_s
        self.threshold_records = records
        self.threshold_bytes = nbytes
        self._reports: deque[tuple[float, int, int]] = deque()
        self._records = 0
        self._bytes = 0
        self._since_end = False

    def drained(self, records: int, nbytes: int, now: float) -> None:
        """A participant read ``records`` (``nbytes``) between two catch-ups."""
        self._prune(now)
        self._reports.append((now, records, nbytes))
        self._records += records
        self._bytes += nbytes
        self._since_end = True

    def round_ended(self) -> None:
        """A round ended: what is drained from now on is the next round's data."""
        self._since_end = False

    def ends_round(self, now: float) -> bool:
        """Whether a backlog drained since the last END: the window holds a flush's worth."""
        if not self._since_end:
            return False
        self._prune(now)
        return self._records >= self.threshold_records or self._bytes >= self.threshold_bytes

    def _prune(self, now: float) -> None:
        reports = self._reports
        while reports and reports[0][0] < now - self.window_s:
            _, records, nbytes = reports.popleft()
            self._records -= records
            self._bytes -= nbytes
