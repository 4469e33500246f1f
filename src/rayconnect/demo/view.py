"""The demo's live view: one plain line per status, so it reads the same on a terminal and
in a CI log (no cursor tricks), and events (kills, recoveries) on their own lines.

Counters are the pipeline's own (``PipelineHandle.status()``), with one correction: a
coordinator that Ray restarted starts counting rounds from zero under a new epoch, so the
view adds up the last count it saw of every epoch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TextIO

from rayconnect.protocol.status import PipelineStatus
from rayconnect.protocol.types import TopicPartition


@dataclass
class _Pending:
    """A kill waiting for the pipeline to commit everything produced before it."""

    label: str
    killed_at: float
    produced: int


@dataclass
class LiveView:
    out: TextIO
    started: float = field(default_factory=time.monotonic)
    committed: int = 0
    """Records committed, as of the last status seen (sum of the committed offsets)."""
    recoveries: dict[str, float] = field(default_factory=dict)
    """Kill label -> seconds from the kill until everything produced before it was committed."""
    _rounds: dict[int, tuple[int, int]] = field(default_factory=dict)
    _pending: list[_Pending] = field(default_factory=list)

    def _print(self, text: str) -> None:
        print(f"  [{time.monotonic() - self.started:5.1f} s] {text}", file=self.out, flush=True)

    def event(self, text: str) -> None:
        self._print(text)

    def killed(self, label: str, how: str, detail: str, produced: int) -> None:
        """Say what was killed and start timing its recovery."""
        self._print(f"CHAOS   {how} {label} ({detail}); Ray restarts it (and logs the dead worker)")
        self._pending.append(_Pending(label, time.monotonic(), produced))

    def steady(self) -> bool:
        """Records committed, and no kill waiting for its recovery: ready for the next kill."""
        return self.committed > 0 and not self._pending

    @property
    def rounds(self) -> tuple[int, int]:
        """(committed, discarded) rounds over every coordinator epoch seen."""
        return (sum(c for c, _ in self._rounds.values()), sum(d for _, d in self._rounds.values()))

    def unavailable(self, error: BaseException) -> None:
        self._print(f"status unavailable ({type(error).__name__}): an actor is restarting")

    def status(self, status: PipelineStatus, produced: int) -> None:
        """One line: rounds, records committed vs produced, lag per partition, table version.
        Rounds are counted per coordinator epoch (each incarnation counts from its start)."""
        rounds = status.rounds_since_start
        self._rounds[status.epoch] = (rounds.committed, rounds.discarded)
        self.committed = sum(status.offsets.values())
        committed_rounds, discarded = self.rounds
        lag = status.lag
        by_partition = sorted(
            ((TopicPartition.from_key(k).partition, v) for k, v in lag.items()),
            key=lambda pv: pv[0],
        )
        lags = " ".join(f"p{p}={'-' if v is None else f'{v:,}'}" for p, v in by_partition)
        self._print(
            f"rounds {committed_rounds} committed / {discarded} discarded | records "
            f"{self.committed:,} committed / {produced:,} produced | lag {lags or '-'} | "
            f"table v{status.table_version}"
        )
        self._recovered()

    def _recovered(self) -> None:
        now = time.monotonic()
        for p in [p for p in self._pending if self.committed >= p.produced]:
            self._pending.remove(p)
            self.recoveries[p.label] = now - p.killed_at
            self._print(
                f"RECOVERED from the {p.label} kill: the {p.produced:,} records produced "
                f"before it are committed, {now - p.killed_at:.1f} s after it"
            )
