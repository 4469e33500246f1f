"""Consistent cuts: the cut markers one partition has read, and where a round's cut ends it.

A source that writes cut markers (the Postgres source with ``cut_markers: true``) ends
each Kafka transaction that ends at a database commit with one marker record in EVERY
partition of every topic it writes (header ``rayconnect.cut``: the commit LSN of the last
database transaction in it). Each partition is in commit order, so in every partition:

- every record before the marker with LSN ``L`` comes from a transaction committed at or
  before ``L``, every record after it from one committed after ``L``;
- the markers are the same in every partition that existed when they were written (one
  Kafka transaction: all of them or none), and a partition made later holds only records
  committed after the markers it lacks.

So a round whose every partition ends right after its marker ``L`` holds exactly the
database's transactions up to ``L`` - across all tables: a *cut*. The coordinator picks
``L`` at START from what the participants reported seeing (``next_cut``), so that every
partition already read its marker; a participant holds what it reads past its cut for
the next round. This module is the arithmetic; ``participant.py`` and ``coordinator.py``
apply it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Final

#: the Kafka header of a cut marker; its value is the LSN, in decimal ASCII
CUT_HEADER: Final = "rayconnect.cut"


class CutMarks:
    """The markers of one partition past its committed offset: each marker's LSN by the
    offset right after it (where a round ending at it ends). Markers arrive in offset
    order; one read again (after a seek) is kept once. They must be every marker past the
    round's start, with no gap (``end_for`` relies on it): the participant keeps only
    those of batches it takes in order."""

    def __init__(self) -> None:
        self._ends: list[int] = []
        self._lsns: list[int] = []

    def __len__(self) -> int:
        return len(self._ends)

    def seen(self, end_offset: int, lsn: int) -> None:
        """The marker ending at ``end_offset`` (its offset + 1) carries ``lsn``."""
        i = bisect.bisect_left(self._ends, end_offset)
        if i < len(self._ends) and self._ends[i] == end_offset:
            return
        self._ends.insert(i, end_offset)
        self._lsns.insert(i, lsn)

    def forget_through(self, offset: int | None) -> None:
        """Markers at or before ``offset`` (committed) can never end a round again."""
        if offset is None:
            return
        i = bisect.bisect_right(self._ends, offset)
        del self._ends[:i], self._lsns[:i]

    def highest(self, after: int | None) -> int | None:
        """The highest LSN of a marker ending past ``after`` (None: none known)."""
        if not self._ends or (after is not None and self._ends[-1] <= after):
            return None
        return self._lsns[-1]

    def lowest(self, after: int | None) -> int | None:
        """The lowest LSN of a marker ending past ``after`` (None: none known)."""
        i = 0 if after is None else bisect.bisect_right(self._ends, after)
        return self._lsns[i] if i < len(self._lsns) else None

    def end_for(self, cut: int | None, start: int) -> int | None:
        """Where a round starting at ``start`` ends for ``cut``: right after the last
        marker with LSN <= ``cut`` past ``start``, or ``start`` when there is none. None
        while it cannot be known yet: no marker with LSN >= ``cut`` read past ``start``
        (records after the last marker read may still belong to the cut). No cut (None):
        the round takes nothing."""
        if cut is None:
            return start
        i = bisect.bisect_right(self._ends, start)
        ends, lsns = self._ends[i:], self._lsns[i:]
        if not lsns or lsns[-1] < cut:
            return None
        end = start
        for e, lsn in zip(ends, lsns, strict=True):
            if lsn > cut:
                break
            end = e
        return end


def next_cut(
    partitions: Iterable[str],
    seen: Mapping[str, int | None],
    committed: int | None,
    first: Mapping[str, int | None] | None = None,
) -> int | None:
    """The cut of the next round: the lowest LSN among the highest markers each partition
    reported (so every partition has read its marker for it), if every partition reported
    one and it is past the ``committed`` cut; else None (the round takes nothing and
    reports again - cheap, and it never waits for a marker that may not come).

    Nor below any partition's ``first`` marker past its end (``WriteStatus.cut_first``):
    a partition may stand past the others (a partial commit moved it on, or a version the
    coordinator never heard of), and a cut below its first marker would end it where it
    stands, holding transactions past the cut. At or above it, its end follows a marker."""
    lowest: int | None = None
    for key in partitions:
        lsn = seen.get(key)
        if lsn is None:
            return None
        lowest = lsn if lowest is None else min(lowest, lsn)
    if lowest is None or (committed is not None and lowest <= committed):
        return None
    floor = cut_floor(first or {})
    if floor is not None and lowest < floor:
        return None
    return lowest


def cut_floor(first: Mapping[str, int | None]) -> int | None:
    """The lowest LSN the next cut may take: the highest of the partitions' first markers
    past their ends (``next_cut``); None: no bound."""
    return max((f for f in first.values() if f is not None), default=None)
