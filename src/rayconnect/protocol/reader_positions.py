"""Where a reader's consumer stands on each of its splits, pure (the reader actor is its shell).

A reader hands each split's fetched records to the split's participant, which accepts only a
batch that starts exactly where it believes the split is: whenever the consumer and that
belief part, the split stops. The rules below keep them together.

Rules
-----
- A split's *position* is where its next batch starts: the participant's last seek, then the
  end of the last batch handed. Not the first record's offset: transaction markers and
  compaction leave holes, so a batch may begin past the position - it is handed from the
  position. A batch that begins *before* it is put back (the consumer is sought to the
  position).
- A seek always wins over a read in flight. Every seek takes a new number from a counter; a
  poll remembers the counter when it starts, and whatever it fetched for a split sought
  since is not handed: the consumer is put back to the split's position (aiokafka may have
  handed those records out anyway, when they matched the new position, and moved past them).
- A split paused while its records were fetched or handed is put back to the first record
  not handed. A piece that could not be handed (the participant is restarting) is put back
  too, unless a seek came meanwhile. A poll that failed as a whole puts every split back.
- New splits get a placeholder consumer position (0), so the consumer starts no reset of its
  own (``auto_offset_reset=none``); the participant seeks to the real one before it resumes
  the split. Re-assigning forgets the consumer's positions and pause flags: the kept splits'
  positions are sought again and the paused ones paused again.
- A poll that moved the consumer past batches that hold no record for us - commit markers,
  an aborted transaction - without handing any record moves the split too: the participant
  is handed an empty piece up to where the consumer stands (``skipped``), so a partition
  whose log ends in markers or an aborted transaction is caught up, not one behind for ever.

Inputs are the methods; outputs are ``Seek`` (where to move the consumer), ``Hand`` (which
records to give the split's participant) and the splits to pause, drop or attach.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

#: where a new split's consumer position is parked until its participant seeks
PLACEHOLDER = 0


class Seek(msgspec.Struct, frozen=True):
    """Move the consumer of split ``key`` to ``offset``."""

    key: str
    offset: int


class Hand(msgspec.Struct, frozen=True):
    """Give split ``key``'s participant the records fetched for ``[first, stop)``."""

    key: str
    first: int
    stop: int


class Assignment(msgspec.Struct, frozen=True):
    """What a new split set means for the consumer: assign ``splits`` (all of them), then
    ``pause`` and ``seek``; ``added`` splits ask their participants where to start."""

    splits: tuple[str, ...]
    dropped: tuple[str, ...]
    added: tuple[str, ...]
    pause: tuple[str, ...]
    seek: tuple[Seek, ...]


class PollToken(msgspec.Struct, frozen=True):
    """Taken when a poll starts: the seek counter then."""

    seeks: int


class _Split:
    __slots__ = ("position", "sought", "resumed")

    def __init__(self, sought: int) -> None:
        self.position: int | None = None  # unknown until the participant seeks
        self.sought = sought  # the seek counter at this split's last seek (or assignment)
        self.resumed = False


class ReaderPositions:
    """The positions and pause flags of one reader's splits; see the module docstring."""

    def __init__(self) -> None:
        self._splits: dict[str, _Split] = {}
        self._seeks = 0

    # -- views -----------------------------------------------------------------------------

    @property
    def splits(self) -> list[str]:
        return sorted(self._splits)

    @property
    def resumed(self) -> list[str]:
        return sorted(k for k, s in self._splits.items() if s.resumed)

    @property
    def any_resumed(self) -> bool:
        return any(s.resumed for s in self._splits.values())

    def owns(self, key: str) -> bool:
        return key in self._splits

    def position(self, key: str) -> int | None:
        split = self._splits.get(key)
        return None if split is None else split.position

    # -- the participants and the enumerator -----------------------------------------------

    def assign(self, wanted: Iterable[str]) -> Assignment:
        """The enumerator's complete split set for this reader."""
        wanted = set(wanted)
        dropped = tuple(sorted(set(self._splits) - wanted))
        for key in dropped:
            del self._splits[key]
        added = tuple(sorted(wanted - set(self._splits)))
        for key in added:
            self._seeks += 1  # a poll in flight fetched nothing for it
            self._splits[key] = _Split(self._seeks)
        seeks: list[Seek] = []
        for key in sorted(self._splits):
            split = self._splits[key]
            if split.position is None:
                seeks.append(Seek(key, PLACEHOLDER))
            else:
                seeks.append(self._seek(key, split.position))
        return Assignment(
            splits=tuple(sorted(self._splits)),
            dropped=dropped,
            added=added,
            pause=tuple(k for k in sorted(self._splits) if not self._splits[k].resumed),
            seek=tuple(seeks),
        )

    def seek(self, key: str, offset: int) -> Seek | None:
        """The participant moves the split (None: not, or no longer, ours)."""
        if key not in self._splits:
            return None
        return self._seek(key, offset)

    def pause(self, key: str) -> bool:
        """True: pause the consumer's split."""
        return self._set_resumed(key, False)

    def resume(self, key: str) -> bool:
        """True: resume the consumer's split."""
        return self._set_resumed(key, True)

    # -- the poll loop ---------------------------------------------------------------------

    def poll(self) -> PollToken:
        return PollToken(self._seeks)

    def fetched(self, token: PollToken, key: str, first_offset: int) -> Seek | int | None:
        """A poll fetched records of ``key`` starting at ``first_offset``: the position to
        hand them from (an int), a Seek that puts them back, or None (not ours)."""
        split = self._splits.get(key)
        if split is None:
            return None
        if split.sought > token.seeks or not split.resumed:
            # moved or paused while this poll was in flight: put the consumer back
            return None if split.position is None else Seek(key, split.position)
        first = first_offset if split.position is None else split.position
        if first_offset < first:  # not where the split is: put it back there
            return Seek(key, first)
        return first

    def piece(self, token: PollToken, key: str, first: int, stop: int) -> Hand | Seek | None:
        """May the records ``[first, stop)`` go to the participant now? A Hand (the split
        then stands at ``stop``), a Seek back to ``first`` (paused meanwhile: the rest is
        not wanted now), or None (a seek won, or the split is gone: nothing to do)."""
        split = self._splits.get(key)
        if split is None or split.sought > token.seeks:
            return None
        if not split.resumed:
            split.position = first
            return Seek(key, first)
        split.position = stop
        return Hand(key, first, stop)

    def skipped(self, token: PollToken, key: str, consumer_at: int | None) -> Hand | Seek | None:
        """A poll handed no record of ``key`` and left the consumer at ``consumer_at``: past
        the split's position, it moved over batches without records (control markers,
        aborted transactions) - a Hand of that empty range. A Seek back when a seek or a
        pause came while the poll was in flight (the consumer moved from an old position);
        None when nothing moved."""
        split = self._splits.get(key)
        if split is None or split.position is None or consumer_at is None:
            return None
        if consumer_at <= split.position:
            return None
        first = self.fetched(token, key, consumer_at)
        if not isinstance(first, int):
            return first
        return self.piece(token, key, first, consumer_at)

    def not_handed(self, token: PollToken, key: str, first: int) -> Seek | None:
        """The piece starting at ``first`` did not reach the participant: read it again,
        unless a seek came meanwhile."""
        split = self._splits.get(key)
        if split is None or split.sought > token.seeks:
            return None
        split.position = first
        return Seek(key, first)

    def poll_failed(self) -> list[Seek]:
        """What the failed poll fetched was not handed: put every split back."""
        return [
            Seek(k, s.position) for k, s in sorted(self._splits.items()) if s.position is not None
        ]

    # -- internals -------------------------------------------------------------------------

    def _set_resumed(self, key: str, resumed: bool) -> bool:
        split = self._splits.get(key)
        if split is not None:
            split.resumed = resumed
        return split is not None

    def _seek(self, key: str, offset: int) -> Seek:
        self._seeks += 1
        split = self._splits[key]
        split.position = offset
        split.sought = self._seeks
        return Seek(key, offset)
