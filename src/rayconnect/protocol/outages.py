"""When a pipeline gives up on an outage: a pure decision, time is an input.

Outages outside Ray - the Kafka broker unreachable, the table's store failing - are waited
out: nothing is lost while a pipeline waits (the table, or the offsets topic, holds where it
stands), and most outages end by themselves (a broker restart, a rolling upgrade, an object
store brown-out). But an outage that never ends should not leave a pipeline waiting silently
for ever: after ``give_up_after_s`` of one *continuous* outage the pipeline gives up, with
the reason, so that the operator (or a supervisor restarting ``rayconnect run``) is told.

``OutageWatch`` keeps the outages its observers report - each named by what failed
(``"broker local (reader local/0)"``, ``"table store"``) with since when and why - and says
when one has lasted too long. It reads no clock: every input carries ``now`` (seconds, the
same clock as the ``since`` values, the wall clock in practice, since observers in other
processes report when their outage began). Once it has given up, it stays given up.
"""

from __future__ import annotations

import msgspec

__all__ = ["DEFAULT_GIVE_UP_AFTER_S", "GiveUp", "Outage", "OutageWatch"]

#: 15 minutes: far beyond a broker restart or a network blip (seconds), a rolling upgrade of
#: a Kafka cluster or an object store brown-out (minutes), so those are ridden out unseen;
#: short enough that an outage for good reaches a human within a quarter of an hour.
DEFAULT_GIVE_UP_AFTER_S = 900.0


class Outage(msgspec.Struct, frozen=True):
    """One thing failing without a break since ``since``; ``reason`` is its latest error."""

    what: str
    since: float
    reason: str

    def lasted(self, now: float) -> float:
        return max(0.0, now - self.since)


class GiveUp(msgspec.Struct, frozen=True):
    """The decision: ``outage`` lasted ``lasted_s``, at least ``give_up_after_s``."""

    outage: Outage
    lasted_s: float
    give_up_after_s: float

    @property
    def reason(self) -> str:
        o = self.outage
        return (
            f"gave up: {o.what} failing for {self.lasted_s:.0f} s without a break "
            f"(give_up_after_s={self.give_up_after_s:g}): {o.reason}"
        )


class OutageWatch:
    """The outages under way; ``decide(now)`` says when to give up (None: keep waiting).

    ``give_up_after_s=None`` never gives up (outages are still kept, for status)."""

    def __init__(self, give_up_after_s: float | None = DEFAULT_GIVE_UP_AFTER_S) -> None:
        if give_up_after_s is not None and give_up_after_s <= 0:
            raise ValueError("give_up_after_s must be > 0 or None")
        self.give_up_after_s = give_up_after_s
        self._outages: dict[str, Outage] = {}
        self._gave_up: GiveUp | None = None

    def failing(self, what: str, reason: str, now: float, since: float | None = None) -> None:
        """``what`` failed (again): the outage began at ``since`` as its observer saw it,
        else at the first failure reported here; later reports only update the reason."""
        known = self._outages.get(what)
        began = known.since if known is not None else now if since is None else since
        if known is not None and since is not None:
            began = min(began, since)
        self._outages[what] = Outage(what, began, reason)

    def fine(self, what: str) -> None:
        """``what`` works again: its outage is over (unknown names are fine too)."""
        self._outages.pop(what, None)

    @property
    def outages(self) -> tuple[Outage, ...]:
        """The outages under way, oldest first."""
        return tuple(sorted(self._outages.values(), key=lambda o: (o.since, o.what)))

    @property
    def gave_up(self) -> GiveUp | None:
        return self._gave_up

    def decide(self, now: float) -> GiveUp | None:
        """The oldest outage once it has lasted ``give_up_after_s``; after that, always it."""
        if self._gave_up is None and self.give_up_after_s is not None and self._outages:
            oldest = self.outages[0]
            if oldest.lasted(now) >= self.give_up_after_s:
                self._gave_up = GiveUp(oldest, oldest.lasted(now), self.give_up_after_s)
        return self._gave_up

    def describe(self, now: float) -> list[str]:
        """One line per outage under way: ``"table store failing since ... (12 s): why"``."""
        return [f"{o.what} failing for {o.lasted(now):.0f} s: {o.reason}" for o in self.outages]
