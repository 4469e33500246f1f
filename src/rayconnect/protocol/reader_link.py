"""Whether a participant's steering reached its reader: a small machine of its own, pure.

A participant steers its partition's reader (``Seek``, ``Pause``, ``Resume``) and then
believes the reader does what it asked. That belief is false when a steering effect never
reached a reader: the participant host found none to send it to (the enumerator, which
names readers, was restarting - a lost node took both), or the call failed. A reader that
starts later asks where to begin (``attached``); a reader that lived on never asks, and
would read on from wherever it was - or stay paused for ever. So the participant must know
that its steering is in doubt and steer again, to what it wants *then*, once a reader is
found. This machine says which of three states that belief is in; the participant turns
them into effects (``FindReader``, then the steering its state calls for), and the actor only
looks readers up and reports what it found.

- ``SYNCED``: every steering effect so far reached the reader (as far as anyone knows).
- ``LOST``: one did not, or the participant is fresh in a host that restarted while a reader
  may have lived on. The next ``tick`` asks the actor to look for the reader.
- ``FINDING``: a lookup is under way (``FindReader``); its answer is ``found`` (steer the
  reader to what the participant wants now) or ``not_found`` (LOST again: the next tick
  asks again, so lookups are paced by the actor's timer, not repeated at once).

A reader that attaches (``attached``) answers the doubt in every state. Lookup answers that
come after it are late and ignored; a steering failure during a lookup changes nothing (the
lookup's answer steers to the wishes of its own time).
"""

from __future__ import annotations

import enum
from typing import Final

from rayconnect.protocol.machine import IGNORED, MoveTable, TableMachine


class LinkState(enum.Enum):
    SYNCED = "synced"
    LOST = "lost"
    FINDING = "finding"


class LinkEvent(enum.Enum):
    STEER_LOST = "steer_lost"  # a steering effect did not reach a reader (or may not have)
    FIND = "find"  # a tick while LOST: look the reader up
    FOUND = "found"  # the lookup found the reader: steer it to the wishes of now
    NOT_FOUND = "not_found"  # the lookup found none
    ATTACHED = "attached"  # a (re)started reader asked where to begin


_S = LinkState
_E = LinkEvent

TRANSITIONS: Final = MoveTable[LinkState, LinkEvent](
    "reader link",
    {
        _S.SYNCED: {
            _E.STEER_LOST: _S.LOST,
            _E.FOUND: IGNORED,  # a lookup answered after the reader attached
            _E.NOT_FOUND: IGNORED,
            _E.ATTACHED: _S.SYNCED,
        },
        _S.LOST: {
            _E.STEER_LOST: _S.LOST,
            _E.FIND: _S.FINDING,
            _E.FOUND: IGNORED,  # an older lookup, overtaken by an attach and a new loss
            _E.NOT_FOUND: IGNORED,
            _E.ATTACHED: _S.SYNCED,
        },
        _S.FINDING: {
            _E.STEER_LOST: _S.FINDING,  # the lookup under way steers to the wishes of then
            _E.FOUND: _S.SYNCED,
            _E.NOT_FOUND: _S.LOST,
            _E.ATTACHED: _S.SYNCED,
        },
    },
)


class ReaderLink(TableMachine[LinkState, LinkEvent]):
    """The participant's belief about its reader; ``fire`` says whether an event counts."""

    TRANSITIONS = TRANSITIONS

    def __init__(self, synced: bool = True) -> None:
        super().__init__(LinkState.SYNCED if synced else LinkState.LOST)
        #: when the link was lost (or the last lookup failed): the time a tick looks again
        self.lost_at: float | None = None if synced else 0.0

    def fire(self, event: LinkEvent, now: float) -> bool:
        """Move as the table says; False if the table ignores ``event`` here."""
        if not self._fire(event):
            return False
        if self._state is not LinkState.LOST:
            self.lost_at = None
        elif self.lost_at is None:
            self.lost_at = now
        return True

    @property
    def lookup_due(self) -> bool:
        return self._state is LinkState.LOST
