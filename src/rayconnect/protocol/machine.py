"""Transition tables as data, shared by the coordinator and the participant (h11 style).

Each machine declares, for every state, the inputs it accepts and the states each input may
lead to. Driving an input is three steps: look the pair up (not in the table: *ignored* if
the input is a message from the network, ``ProtocolError`` if it is a local input), run the
handler, then check that the handler landed in one of the listed states. The check makes the
table the reviewed truth rather than a comment that drifts from the code.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from rayconnect.protocol.errors import ProtocolError

S = TypeVar("S", bound=enum.Enum)
I = TypeVar("I", bound=enum.Enum)  # noqa: E741 - the conventional name for "input"
R = TypeVar("R")


class TransitionTable(Generic[S, I]):
    """``rows[state][input]`` = the states ``input`` may move a machine to from ``state``."""

    def __init__(
        self,
        name: str,
        rows: Mapping[S, Mapping[I, Iterable[S]]],
        ignorable: Iterable[I],
    ) -> None:
        self.name = name
        self.rows: dict[S, dict[I, frozenset[S]]] = {
            state: {event: frozenset(targets) for event, targets in row.items()}
            for state, row in rows.items()
        }
        self.ignorable = frozenset(ignorable)

    def allowed(self, state: S, event: I) -> frozenset[S] | None:
        """The states ``event`` may lead to; None = ignore it; raises if it is impossible."""
        targets = self.rows.get(state, {}).get(event)
        if targets is not None:
            return targets
        if event in self.ignorable:
            return None
        raise ProtocolError(f"{self.name}: {event.name} is not allowed in state {state.name}")

    def drive(
        self,
        state: S,
        event: I,
        handler: Callable[[], R],
        current: Callable[[], S],
        ignored: Callable[[], R],
    ) -> R:
        """Run ``handler`` for ``event`` if the table allows it, else ``ignored()``;
        ``current`` reads the machine's state afterwards, for the check."""
        targets = self.allowed(state, event)
        if targets is None:
            return ignored()
        result = handler()
        after = current()
        if after not in targets:  # a bug in this package, not in the caller
            raise AssertionError(
                f"{self.name}: {event.name} moved {state.name} -> {after.name}, "
                f"table allows {sorted(t.name for t in targets)}"
            )
        return result

    def describe(self) -> str:
        """The table as text, one ``STATE --INPUT--> TARGETS`` line per row (for docs/logs)."""
        return "\n".join(
            f"{state.name:<11} --{event.name}--> {'|'.join(sorted(t.name for t in targets))}"
            for state, row in self.rows.items()
            for event, targets in row.items()
        )
