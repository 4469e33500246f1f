"""Where a Postgres source is, as its Kafka source offset (pure).

Streaming: ``lsn`` is the commit LSN of the Postgres transaction of the last record written
and ``n`` that record's index among the transaction's changes: on restart every transaction
with a smaller commit LSN is skipped, and of the one with ``lsn`` the first ``n + 1``
changes (all of them unless it was split at ``max_records_per_transaction``).

Snapshot. Each table is read in primary-key order, in pages; ``table``/``after`` say which
table and the last key written. A snapshot is an exported snapshot at an LSN (a temporary
slot's consistent point): its rows hold every transaction that committed before that LSN,
so the stream must skip those for the rows it covered. Exported snapshots end with their
connection, so a task restarted mid-snapshot continues with a new one at a later LSN, from
the key it reached: each table keeps ``segments``, key ranges each read at its own LSN, and
the stream skips a change whose commit LSN is below its key's segment's LSN. Nothing is
lost (the slot keeps the WAL since before the first segment) and nothing is written twice.
A table without a primary key (REPLICA IDENTITY FULL) is read in one Kafka transaction and
has one segment.

Parallel snapshot (``chunks``). The snapshot is planned as chunks - key ranges of a table
(``snapshot_plan``), or heap page ranges (``ctid``) of a table without a key - read by several
workers at once; the whole plan, with each chunk's progress (``after``, its own
``segments``, ``done``), is this offset, committed in the same Kafka transaction as the
rows it covers. A chunk's segments follow the rule above within the chunk, so a task
restarted with a new exported snapshot continues each unfinished chunk from its key at the
new LSN and redoes nothing else; when every chunk is done their segments, in key order,
become the table's ``segments`` (``finish_snapshot``) and the stream starts.
"""

from __future__ import annotations

import decimal
from typing import Any

import msgspec

Key = list[Any]


def comparable_key(key: Key | None) -> Key | None:
    """A key as it is kept in offsets and compared: numeric values as floats (JSON would
    make them strings, which neither compare with numbers nor in numeric order)."""
    if key is None:
        return None
    return [float(v) if isinstance(v, decimal.Decimal) else v for v in key]


class Segment(msgspec.Struct, array_like=True):
    """Rows with a key above ``after`` (None: from the first), up to the next segment's
    ``after``, were read at ``lsn``."""

    after: Key | None
    lsn: int


class Chunk(msgspec.Struct, array_like=True):
    """Rows of ``table`` with a key above ``lo`` up to and including ``hi`` (None: open
    end); ``after`` is the last key written (``lo`` until one is). A table without a key:
    heap pages ``[lo[0], hi[0])`` (its ``ctid`` range), read whole in the one Kafka
    transaction that holds all of that table's chunks."""

    table: str
    lo: Key | None
    hi: Key | None
    after: Key | None
    segments: list[Segment] = []
    done: bool = False

    def begin_segment(self, lsn: int) -> None:
        """Continue from ``after`` at ``lsn``: a new segment, or the last one moved to
        ``lsn`` if none of its rows was written yet."""
        if self.segments and self.segments[-1].after == self.after:
            self.segments[-1] = Segment(self.after, lsn)
        else:
            self.segments.append(Segment(self.after, lsn))

    def continue_at(self, lsn: int) -> None:
        """Continue at ``lsn`` (a progress read back from Kafka): its last segment already
        is at ``lsn`` if it was written in this exported snapshot."""
        if self.done or (self.segments and self.segments[-1].lsn == lsn):
            return
        self.begin_segment(lsn)


class Progress(msgspec.Struct, omit_defaults=True):
    lsn: int = 0
    n: int = -1
    #: the table being snapshotted (index into the task's tables); None once done
    table: int | None = None
    after: Key | None = None
    #: ``schema.table`` -> its segments, for as long as the stream may still need them
    segments: dict[str, list[Segment]] = {}
    #: the parallel snapshot's plan and each chunk's progress; [] once done
    chunks: list[Chunk] = []
    #: the plan's id: a chunk's progress its worker committed (``chunk_offsets``) counts
    #: for this plan only
    plan: int = 0
    #: how many snapshot workers (transactional ids) the plan was started with: all of
    #: them are fenced before a restarted task reads its chunks' progress
    snapshot_workers: int = 0
    #: the captured tables as of this offset: a table of the publication not in it was
    #: added since and is snapshotted while streaming ([]: an offset from before this field)
    known: list[str] = []
    #: tables to snapshot while streaming (``incremental_snapshot``), the first one under
    #: way: its rows with a key above ``pending_after`` are still to read
    pending: list[str] = []
    pending_after: Key | None = None

    def to_offset(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    @classmethod
    def from_offset(cls, offset: Any) -> Progress:
        return msgspec.convert(offset, cls)

    @property
    def snapshotting(self) -> bool:
        return self.table is not None or bool(self.chunks)

    def begin_chunks(self, lsn: int) -> None:
        """A new exported snapshot at ``lsn``: every unfinished chunk continues there."""
        for chunk in self.chunks:
            if not chunk.done:
                chunk.begin_segment(lsn)

    def finish_snapshot(self) -> None:
        """Every chunk is done: their segments join their tables' (in plan order, which is
        key order per table) for the stream's ``in_snapshot``; the snapshot is over."""
        assert all(c.done for c in self.chunks), "finish_snapshot with chunks to read"
        for chunk in self.chunks:
            segments = self.segments.setdefault(chunk.table, [])
            # a keyless table's chunks share its one segment (read in one transaction)
            segments.extend(s for s in chunk.segments if s not in segments)
        self.chunks, self.table, self.after = [], None, None
        self.plan = self.snapshot_workers = 0

    def begin_segment(self, table: str, lsn: int) -> None:
        """Read ``table`` from ``after`` on at ``lsn``: a new segment, or the last one
        moved to ``lsn`` if none of its rows was written yet."""
        segments = self.segments.setdefault(table, [])
        if segments and segments[-1].after == self.after:
            segments[-1] = Segment(self.after, lsn)
        else:
            segments.append(Segment(self.after, lsn))

    def in_snapshot(self, table: str, key: Key | None, commit_lsn: int) -> bool:
        """True if the snapshot already holds this change's effect (the stream skips it)."""
        segments = self.segments.get(table)
        if not segments:
            return False
        chosen = segments[0]
        if key is not None:
            for segment in segments[1:]:
                if segment.after is not None and key > segment.after:
                    chosen = segment
                else:
                    break
        return commit_lsn < chosen.lsn

    def request(self, tables: list[str]) -> list[str]:
        """Snapshot ``tables`` while streaming (after those pending); the ones added. A
        table already pending is not asked twice."""
        added = [t for t in dict.fromkeys(tables) if t not in self.pending]
        self.pending += added
        self.known += [t for t in added if t not in self.known]
        return added

    def chunk_written(self, last_key: Key | None, exhausted: bool) -> None:
        """A chunk of ``pending[0]`` is in Kafka up to ``last_key``; ``exhausted``: the
        table has no rows after it - the next pending table is next."""
        if exhausted:
            self.pending, self.pending_after = self.pending[1:], None
        elif last_key is not None:
            self.pending_after = last_key

    def highest_segment_lsn(self) -> int:
        return max((s.lsn for ss in self.segments.values() for s in ss), default=0)

    def already_written(self, commit_lsn: int, n: int) -> bool:
        """Change ``n`` of the transaction committed at ``commit_lsn`` is in Kafka."""
        return commit_lsn < self.lsn or (commit_lsn == self.lsn and n <= self.n)
