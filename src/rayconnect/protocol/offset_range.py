"""A table whose committed offset lies outside its partition's log, pure.

A pipeline resumes each partition from the table's offset. That offset can lie past the
log's end (the topic was deleted and re-created, the broker lost its log, the pipeline was
pointed at another cluster of the same id) or before its start (retention deleted what was
never committed). Reading on from there reads nothing, or the wrong records, without a word
- the worst kind of failure: a pipeline that looks healthy and never moves.

The reader that serves the partition notices (its position past the high watermark the
broker reports, or the broker's OFFSET_OUT_OF_RANGE) and tells the coordinator, whose
machine decides by ``offsets_out_of_range`` (``config.sink.OffsetsOutOfRange``):

- ``fail`` (the default): the pipeline gives up with an error naming the partition, the
  table's offset and the log's range. Nothing is read or committed for it.
- ``earliest`` / ``latest``: that partition starts over at the log's start / end. Its next
  round starts there, and the commit that lands it moves the table's offset *down* from the
  stale one (the one place offsets go backwards; the commit's compare-and-set still expects
  the stale offset, so a race cannot land it twice) and records the reset in the table
  version's metadata (``rayconnect.offset_resets``).

A report is judged against the coordinator's own view of the table: one whose offset is not
the partition's committed offset, or lies inside the reported range, is stale and ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

#: what to do with a committed offset outside its partition's log
OutOfRangePolicy = Literal["fail", "earliest", "latest"]


class OffsetsOutOfRange(msgspec.Struct, frozen=True):
    """A reader's word: partition ``partition`` was asked to read at ``offset`` and its log
    holds ``[log_start, log_end)`` (``log_start`` None: not known)."""

    #: the partition, ``cluster/topic/partition``
    partition: str
    #: where the reader was asked to read: the table's committed offset
    offset: int
    #: the log's end (its high watermark) as the reader saw it
    log_end: int
    #: the log's start; None: not known
    log_start: int | None = None

    @property
    def ahead(self) -> bool:
        """Past the log's end (else: before its start)."""
        return self.offset > self.log_end

    @property
    def state(self) -> str:
        """The partition's state in ``rayconnect status``."""
        return "offsets_ahead" if self.ahead else "offsets_before_log_start"

    def outside(self) -> bool:
        """Whether ``offset`` really lies outside the log."""
        return self.ahead or (self.log_start is not None and self.offset < self.log_start)

    def describe(self) -> str:
        start = "?" if self.log_start is None else f"{self.log_start:,}"
        where = "past the end of" if self.ahead else "before the start of"
        return (
            f"{self.partition}: the table's committed offset {self.offset:,} lies {where} "
            f"the partition's log [{start}, {self.log_end:,}) - the topic was re-created, "
            "the broker lost its log or retention removed records never committed"
        )


class Reset(msgspec.Struct, frozen=True):
    """A partition starting over: from the table's ``stale`` offset to ``start``."""

    stale: int
    start: int


class OffsetResets:
    """The coordinator's book of partitions outside their logs: reported, and (with a
    reset policy) starting over. Pure; the coordinator asks it and applies the answers."""

    def __init__(self, policy: OutOfRangePolicy = "fail") -> None:
        self.policy = policy
        #: partition -> the report that found it outside its log (until it moved on)
        self.reports: dict[str, OffsetsOutOfRange] = {}
        #: partition -> its reset, until a commit lands it
        self.pending: dict[str, Reset] = {}

    def judge(self, report: OffsetsOutOfRange, committed: int | None) -> bool:
        """Whether ``report`` is news: the partition's committed offset, outside its log,
        not known already."""
        if committed is None or report.offset != committed or not report.outside():
            return False
        known = self.reports.get(report.partition)
        self.reports[report.partition] = report
        if self.policy != "fail":
            start = report.log_end if self.policy == "latest" else (report.log_start or 0)
            self.pending[report.partition] = Reset(stale=committed, start=start)
        return known != report

    def starts(self, offsets: dict[str, int]) -> dict[str, int]:
        """The round's START offsets: the table's, and each pending reset's new start."""
        if not self.pending:
            return offsets
        return {**offsets, **{key: r.start for key, r in self.pending.items()}}

    def landed(self, resets: Iterable[str]) -> None:
        """A commit landed these partitions' resets: they are done."""
        for key in resets:
            self.pending.pop(key, None)
            self.reports.pop(key, None)

    def reloaded(self, offsets: dict[str, int]) -> None:
        """The table was read again: a reset whose stale offset is gone has landed (a
        commit reported failed that did land), or the partition moved on otherwise."""
        for key in list(self.pending):
            if offsets.get(key) != self.pending[key].stale:
                del self.pending[key]
                self.reports.pop(key, None)
