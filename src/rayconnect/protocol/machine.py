"""Transition tables as data (h11's ``_state.py``), shared by the five protocol machines.

The table *makes* the move; the coordinator, the participant, the enumerator, the cluster
enumerator and the source task use it. A machine first works out what an input means (a
START of a newer round, a WRITE-STATUS of another round, a round that turned out empty ...):
that meaning is an *event*. The table (``MoveTable``) says, for every state, what each event
does: move to a state (possibly the same one), or ``IGNORED`` - a deliberate cell, for what
the network may legitimately deliver late or twice. An event with no cell in the current
state cannot happen; ``ProtocolError`` says so. The handlers never assign the state
themselves (``TableMachine._fire`` does), so the table is the whole story of the moves.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, Generic, TypeVar

from rayconnect.protocol.errors import ProtocolError

S = TypeVar("S", bound=enum.Enum)
I = TypeVar("I", bound=enum.Enum)  # noqa: E741 - the conventional name for "input"


class Ignored(enum.Enum):
    IGNORED = "ignored"


#: A cell of a ``MoveTable``: the event is expected here and deliberately has no effect.
IGNORED: Final = Ignored.IGNORED


class MoveTable(Generic[S, I]):
    """``rows[state][event]`` = the state ``event`` moves a machine to, or ``IGNORED``."""

    def __init__(self, name: str, rows: Mapping[S, Mapping[I, S | Ignored]]) -> None:
        self.name = name
        self.rows: dict[S, dict[I, S | Ignored]] = {state: dict(row) for state, row in rows.items()}

    def move(self, state: S, event: I, why: str | None = None) -> S | None:
        """The state after ``event``; None if the table ignores it in ``state``; raises
        ``ProtocolError`` if ``event`` cannot happen in ``state`` (``why``: what the input
        was, for the message)."""
        target = self.rows.get(state, {}).get(event)
        if target is None:
            detail = f": {why}" if why else ""
            raise ProtocolError(
                f"{self.name}: {event.name} cannot happen in state {state.name}{detail}"
            )
        return None if isinstance(target, Ignored) else target

    def ignored(self) -> dict[S, frozenset[I]]:
        """Per state, the events the table deliberately ignores there."""
        return {
            state: frozenset(e for e, t in row.items() if t is IGNORED)
            for state, row in self.rows.items()
        }

    def describe(self) -> str:
        """The table as text, one ``STATE --EVENT--> TARGET`` line per cell (for docs/logs)."""
        return "\n".join(
            f"{state.name:<11} --{event.name}--> {target.name}"
            for state, row in self.rows.items()
            for event, target in row.items()
        )


class TableMachine(Generic[S, I]):
    """A machine whose ``TRANSITIONS`` table makes every move; it counts what it ignores."""

    TRANSITIONS: MoveTable[S, I]

    def __init__(self, initial: S) -> None:
        self._state = initial
        self._ignored = 0

    @property
    def state(self) -> S:
        return self._state

    def _fire(self, event: I, why: str | None = None) -> bool:
        """Move as the table says; False (and counted) if the table ignores ``event`` here;
        ``why`` explains the input if the table has no cell for it."""
        after = self.TRANSITIONS.move(self._state, event, why)
        if after is None:
            self._ignored += 1
            return False
        self._state = after
        return True
