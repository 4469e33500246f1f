"""The coordinator's housekeeping beside its rounds, pure: store probes, upkeep, give-up.

Three decisions beside the rounds, as inputs and effects, so tests and the simulation drive
them without a table or a clock:

- **Probes.** Writes that hang on a store that is gone say nothing by themselves, so the
  table's store is probed (``ProbeStore``) every ``probe_every_s``, one probe at a time. A
  probe that has not answered after ``probe_timeout_s`` counts as failing ("no answer")
  until it returns; the next one goes out ``probe_every_s`` after the last answer.
- **Upkeep.** ``protocol.upkeep.UpkeepSchedule`` says which job is due; this machine asks it
  on every tick once the coordinator has recovered (an idle pipeline's table still gets
  tidied) and emits ``RunUpkeep`` for each. Committed rounds count their files. A sink with
  routes has a ``RouteUpkeep`` too: its tables' jobs, one at a time, ``RunUpkeep`` naming
  the table; each round's commits count each table's files (``tables_committed``).
- **Give-up.** ``protocol.outages.OutageWatch`` keeps the outages reported - the store
  failing (probes, the actor's claim/commit/reload errors), rounds discarded one after the
  other, a reader's broker - and decides when one has lasted ``give_up_after_s``. Then
  ``StopRounds`` (once): the actor stops the rounds for good. A table another writer broke
  (``table_broken``) stops them at once.

Time is an input: one clock for all of it, the wall clock in practice (readers in other
processes report since when their broker is unreachable). ``next_deadline`` says when the
next tick has something to do. The transitions are a table (``TRANSITIONS``): an input the
table has no cell for (a commit reported before recovery, a second recovery) is a bug in
the actor and raises ``ProtocolError``; results that arrive after the give-up are ignored.
"""

from __future__ import annotations

import enum
from typing import Final, TypeAlias

import msgspec

from rayconnect.protocol.machine import IGNORED, MoveTable, TableMachine
from rayconnect.protocol.outages import Outage, OutageWatch
from rayconnect.protocol.upkeep import Job, RouteUpkeep, UpkeepSchedule, UpkeepStatus

#: what the outage watch calls the coordinator's own troubles
TABLE_STORE = "table store"
ROUNDS = "rounds (every one discarded)"
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 5.0


class ProbeStore(msgspec.Struct, frozen=True, tag=True):
    """Probe the table's store once (one light request, ``timeout_s``), then call
    ``probe_finished``."""

    timeout_s: float


class RunUpkeep(msgspec.Struct, frozen=True, tag=True):
    """Run upkeep ``job`` beside the rounds - on route table ``table``, or the sink's own
    table (None) - then call ``upkeep_finished``."""

    job: Job
    table: str | None = None


class StopRounds(msgspec.Struct, frozen=True, tag=True):
    """Stop the rounds for good (commit nothing more): an outage lasted too long, or the
    table was broken under the pipeline. ``reason`` is what status says."""

    reason: str


Chore: TypeAlias = ProbeStore | RunUpkeep | StopRounds


class State(enum.Enum):
    WAITING = "waiting"  # the coordinator has not recovered yet: probes, no upkeep
    RUNNING = "running"
    GAVE_UP = "gave-up"  # the rounds stopped for good: no probe, no upkeep


class Event(enum.Enum):
    RECOVERED = "recovered"
    TICK = "tick"
    PROBE_RESULT = "probe_result"
    OUTAGE = "outage"  # something failing, or fine again
    ROUND_OUTCOME = "round_outcome"  # a round finished or was discarded
    UPKEEP_FINISHED = "upkeep_finished"
    TABLES_COMMITTED = "tables_committed"  # a round's commits to route tables
    GIVE_UP = "give_up"  # an outage lasted give_up_after_s, or the table is broken


_S = State
_E = Event

TRANSITIONS: Final = MoveTable[State, Event](
    "housekeeping",
    {
        _S.WAITING: {
            _E.RECOVERED: _S.RUNNING,
            _E.TICK: _S.WAITING,
            _E.PROBE_RESULT: _S.WAITING,
            _E.OUTAGE: _S.WAITING,
            _E.GIVE_UP: _S.GAVE_UP,
        },
        _S.RUNNING: {
            _E.TICK: _S.RUNNING,
            _E.PROBE_RESULT: _S.RUNNING,
            _E.OUTAGE: _S.RUNNING,
            _E.ROUND_OUTCOME: _S.RUNNING,
            _E.UPKEEP_FINISHED: _S.RUNNING,
            _E.TABLES_COMMITTED: _S.RUNNING,
            _E.GIVE_UP: _S.GAVE_UP,
        },
        _S.GAVE_UP: {
            _E.RECOVERED: IGNORED,  # a recovery that finished after the give-up
            _E.TICK: _S.GAVE_UP,
            _E.PROBE_RESULT: IGNORED,  # the probe under way when it gave up
            _E.OUTAGE: _S.GAVE_UP,  # still shown in status
            _E.ROUND_OUTCOME: IGNORED,  # IO that was under way
            _E.UPKEEP_FINISHED: _S.GAVE_UP,  # a job that was running
            _E.TABLES_COMMITTED: IGNORED,  # IO that was under way
            _E.GIVE_UP: IGNORED,  # it stopped once; the first reason stands
        },
    },
)


class Housekeeping(TableMachine[State, Event]):
    """Probes, upkeep and the give-up decision of one coordinator; see the module docstring."""

    TRANSITIONS = TRANSITIONS

    def __init__(
        self,
        schedule: UpkeepSchedule,
        give_up_after_s: float | None,
        now: float,
        probe_every_s: float = PROBE_EVERY_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        routes: RouteUpkeep | None = None,
    ) -> None:
        super().__init__(State.WAITING)
        self.schedule = schedule
        self.routes = routes
        self.watch = OutageWatch(give_up_after_s)
        self.probe_every_s = probe_every_s
        self.probe_timeout_s = probe_timeout_s
        self._probe_at: float | None = now  # when the next probe goes out (None: one is out)
        self._probe_sent: float | None = None
        self._probe_late = False  # the probe out has been counted as failing already
        self.gave_up: str | None = None

    # -- read-only views -------------------------------------------------------------------

    @property
    def outages(self) -> tuple[Outage, ...]:
        return self.watch.outages

    def describe(self, now: float) -> list[str]:
        return self.watch.describe(now)

    def upkeep_status(self) -> UpkeepStatus:
        return self.schedule.status()

    def route_upkeep_status(self) -> dict[str, UpkeepStatus]:
        """Each route table's upkeep (empty without routes)."""
        return self.routes.status() if self.routes is not None else {}

    def next_deadline(self) -> float | None:
        """When ``tick`` has a probe to send or to count as failing, or None (upkeep and
        give-up are decided on every tick; the actor ticks at least that often anyway)."""
        if self._state is State.GAVE_UP:
            return None
        if self._probe_sent is not None:
            return None if self._probe_late else self._probe_sent + self.probe_timeout_s
        return self._probe_at

    # -- inputs ----------------------------------------------------------------------------

    def recovered(self, now: float) -> list[Chore]:
        """The coordinator claimed its epoch and started its rounds: upkeep may run."""
        self._fire(Event.RECOVERED)
        return self.tick(now)

    def tick(self, now: float) -> list[Chore]:
        """Time passed: a probe due, a probe too slow, upkeep due, an outage too long."""
        self._fire(Event.TICK)
        if self._state is State.GAVE_UP:
            return []
        chores: list[Chore] = []
        sent = self._probe_sent
        if sent is None and self._probe_at is not None and now >= self._probe_at:
            self._probe_sent, self._probe_at, self._probe_late = now, None, False
            chores.append(ProbeStore(self.probe_timeout_s))
        elif sent is not None and not self._probe_late and now >= sent + self.probe_timeout_s:
            self._probe_late = True
            self.watch.failing(TABLE_STORE, "no answer", now)
        if self._state is State.RUNNING:
            chores += [RunUpkeep(job) for job in self.schedule.due(now)]
            if self.routes is not None:
                chores += [RunUpkeep(j.job, j.table) for j in self.routes.due(now)]
        return chores + self._decide(now)

    def probe_finished(self, error: str | None, now: float) -> list[Chore]:
        """The probe answered: the store works (``error`` None) or failed with ``error``."""
        if not self._fire(Event.PROBE_RESULT):
            return []
        self._probe_sent, self._probe_late = None, False
        self._probe_at = now + self.probe_every_s
        return self._report(TABLE_STORE, error, now)

    def failing(
        self, what: str, reason: str | None, now: float, since: float | None = None
    ) -> list[Chore]:
        """``what`` fails (since ``since``, if its observer knows) for ``reason``; or works
        again (``reason`` None)."""
        self._fire(Event.OUTAGE)
        return self._report(what, reason, now, since)

    def round_finished(self, files: int, now: float) -> list[Chore]:
        """A round was committed (adding ``files`` files) or found empty: rounds work."""
        if not self._fire(Event.ROUND_OUTCOME):
            return []
        self.schedule.committed(files, now)
        return self._report(ROUNDS, None, now)

    def round_discarded(self, reason: str, now: float) -> list[Chore]:
        """A round was discarded: rounds fail, until one finishes."""
        if not self._fire(Event.ROUND_OUTCOME):
            return []
        return self._report(ROUNDS, reason or "discarded", now)

    def tables_committed(self, files: dict[str, int], now: float) -> list[Chore]:
        """A round committed route tables: table -> the files it added to each."""
        if not self._fire(Event.TABLES_COMMITTED):
            return []
        if self.routes is None:
            raise ValueError("tables_committed without routes")
        self.routes.committed(files, now)
        return []

    def upkeep_finished(
        self, job: Job, error: str | None, now: float, table: str | None = None
    ) -> list[Chore]:
        """A ``RunUpkeep`` (of route table ``table``) ended: it did its work (``error``
        None) or failed."""
        self._fire(Event.UPKEEP_FINISHED)
        if table is None:
            self.schedule.finished(job, error is None, now, error)
        elif self.routes is not None:
            self.routes.finished(table, job, error is None, now, error)
        else:
            raise ValueError(f"upkeep of table {table!r} finished without routes")
        return []

    def table_broken(self, reason: str, now: float) -> list[Chore]:
        """Another writer broke the table's assumptions: stop the rounds at once."""
        return self._give_up(f"table broken: {reason}")

    # -- helpers ---------------------------------------------------------------------------

    def _report(
        self, what: str, reason: str | None, now: float, since: float | None = None
    ) -> list[Chore]:
        if reason is None:
            self.watch.fine(what)
        else:
            self.watch.failing(what, reason, now, since)
        return self._decide(now)

    def _decide(self, now: float) -> list[Chore]:
        if self._state is State.GAVE_UP:
            return []
        decision = self.watch.decide(now)
        return [] if decision is None else self._give_up(decision.reason)

    def _give_up(self, reason: str) -> list[Chore]:
        if not self._fire(Event.GIVE_UP):
            return []
        self.gave_up = reason
        return [StopRounds(reason)]
