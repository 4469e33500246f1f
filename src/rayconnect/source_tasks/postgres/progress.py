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


class Progress(msgspec.Struct, omit_defaults=True):
    lsn: int = 0
    n: int = -1
    #: the table being snapshotted (index into the task's tables); None once done
    table: int | None = None
    after: Key | None = None
    #: ``schema.table`` -> its segments, for as long as the stream may still need them
    segments: dict[str, list[Segment]] = {}

    def to_offset(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    @classmethod
    def from_offset(cls, offset: Any) -> Progress:
        return msgspec.convert(offset, cls)

    @property
    def snapshotting(self) -> bool:
        return self.table is not None

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

    def highest_segment_lsn(self) -> int:
        return max((s.lsn for ss in self.segments.values() for s in ss), default=0)

    def already_written(self, commit_lsn: int, n: int) -> bool:
        """Change ``n`` of the transaction committed at ``commit_lsn`` is in Kafka."""
        return commit_lsn < self.lsn or (commit_lsn == self.lsn and n <= self.n)
