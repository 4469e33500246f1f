"""One participant's open transaction: buffer, flushes in flight, files (KIP-89 bookkeeping).

The participant (participant.py) decides *when* to flush and report; this class only keeps
the round's books so those decisions read as predicates. The invariant it keeps is the
one exactly-once needs from a participant: the accepted batches are contiguous from
``first_offset`` to ``next_offset``, and by the time ``can_report()`` holds, ``files`` hold
exactly those offsets - every buffered batch was handed to a flush and every flush came back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rayconnect.protocol.effects import Flush
from rayconnect.protocol.messages import WriteStatus
from rayconnect.protocol.types import DataFile


@dataclass(frozen=True)
class Batch:
    """One batch from the reader: offsets ``[first_offset, next_offset)`` as ``handle``."""

    first_offset: int
    next_offset: int
    count: int
    nbytes: int
    handle: object
    received_at: float
    #: consistent cuts: the batch ends with a cut marker of this LSN
    cut_lsn: int | None = None


class WriteState:
    """The writes of round ``(epoch, txn_id)`` of one partition."""

    def __init__(self, epoch: int, txn_id: int, first_offset: int | None) -> None:
        self.epoch = epoch
        self.txn_id = txn_id
        #: None until the starting-offset policy is resolved to an offset.
        self.first_offset = first_offset
        self.next_offset = first_offset
        self.records = 0
        self.files: list[DataFile] = []
        self.in_flight: set[int] = set()
        self.size_flushes = 0
        self.commit_requested = False
        self.reported: WriteStatus | None = None
        self._batches: list[object] = []
        self._buffer_first = first_offset
        self.buffered_records = 0
        self.buffered_bytes = 0
        self.oldest_at: float | None = None

    def is_current(self, epoch: int, txn_id: int) -> bool:
        return (epoch, txn_id) == (self.epoch, self.txn_id)

    def resolve(self, offset: int) -> None:
        """The policy's offset is known: the round starts there."""
        self.first_offset = self.next_offset = self._buffer_first = offset

    def adopt(self, carry: ReadAhead) -> None:
        """Take over the batches read ahead since the last END; they start at this round's
        first offset (the caller checked), so the round stays contiguous."""
        assert carry.first_offset == self.next_offset
        for batch in carry.batches:
            self.append(batch)

    def append(self, batch: Batch) -> None:
        """Buffer a batch that starts exactly at ``self.next_offset`` (the caller checked).
        An empty one (commit markers, an aborted transaction: no record) only moves the
        offset - it has no rows to flush."""
        self.next_offset = batch.next_offset
        if not batch.count:
            return
        self._batches.append(batch.handle)
        self.records += batch.count
        self.buffered_records += batch.count
        self.buffered_bytes += batch.nbytes
        if self.oldest_at is None:
            self.oldest_at = batch.received_at

    @property
    def has_buffer(self) -> bool:
        return bool(self._batches)

    def is_aged(self, now: float, max_age_s: float) -> bool:
        return self.oldest_at is not None and now >= self.oldest_at + max_age_s

    def take_flush(self, flush_id: int) -> Flush:
        """Hand the whole buffer to flush ``flush_id`` and start an empty one."""
        assert self._buffer_first is not None and self.next_offset is not None
        flush = Flush(
            flush_id=flush_id,
            batches=tuple(self._batches),
            first_offset=self._buffer_first,
            next_offset=self.next_offset,
            records=self.buffered_records,
            nbytes=self.buffered_bytes,
        )
        self.in_flight.add(flush_id)
        self._batches = []
        self._buffer_first = self.next_offset
        self.buffered_records = self.buffered_bytes = 0
        self.oldest_at = None
        return flush

    def flushed(self, flush_id: int, files: Iterable[DataFile]) -> bool:
        """Flush ``flush_id`` of this round wrote ``files``; False if it is not ours."""
        if flush_id not in self.in_flight:
            return False
        self.in_flight.remove(flush_id)
        self.files.extend(files)
        return True

    def can_report(self) -> bool:
        """Everything accepted is in files and the starting offset is known."""
        return self.first_offset is not None and not self.in_flight and not self._batches

    def write_status(
        self, key: str, cut_seen: int | None = None, cut_first: int | None = None
    ) -> WriteStatus:
        assert self.first_offset is not None and self.next_offset is not None
        self.reported = WriteStatus(
            epoch=self.epoch,
            txn_id=self.txn_id,
            partition=key,
            files=tuple(self.files),
            first_offset=self.first_offset,
            next_offset=self.next_offset,
            records=self.records,
            cut_seen=cut_seen,
            cut_first=cut_first,
        )
        return self.reported


class ReadAhead:
    """Batches read after END-COMMIT, held for the next round.

    Reading does not stop while a round is written and committed: the next round, if it
    starts where the reported one ended (its START's offset for this partition equals
    ``first_offset``), adopts these batches; any other START drops them and seeks. Nothing
    here is ever flushed or reported by itself, so it cannot reach the table outside a round.
    It is bounded by the flush settings: past them, the participant pauses the reader.
    """

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self.next_offset = first_offset
        self.batches: list[Batch] = []
        self.records = 0
        self.nbytes = 0
        #: The reader was paused because the read-ahead is full.
        self.full = False
        #: A batch reached the high watermark in a way that asks for the commit
        #: (``Participant._reached_end``): the START that adopts these batches asks.
        self.ends_round = False

    def append(self, batch: Batch) -> None:
        """Keep a batch that starts exactly at ``self.next_offset`` (the caller checked)."""
        self.batches.append(batch)
        self.next_offset = batch.next_offset
        self.records += batch.count
        self.nbytes += batch.nbytes

    def take_through(self, end: int) -> list[Batch]:
        """The leading batches that end at or before ``end`` (consistent cuts: the part a
        round's cut takes); what stays starts where they end."""
        n = 0
        while n < len(self.batches) and self.batches[n].next_offset <= end:
            n += 1
        taken, self.batches = self.batches[:n], self.batches[n:]
        for batch in taken:
            self.first_offset = batch.next_offset
            self.records -= batch.count
            self.nbytes -= batch.nbytes
        return taken
