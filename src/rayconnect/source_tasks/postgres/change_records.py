"""The stream's inserts and updates as records, straight from their pgoutput bytes (pure).

Most of a change stream is inserts and updates of rows made of values and NULLs. Each such
message becomes its record here in one step: the table's compiled row reader
(``row_reader``) writes the row and the key, and the event is four pieces joined - the
part before the row, the row, the table's part of ``source`` and the transaction's rest,
each made once per table or per transaction. Everything else (deletes, updates with an
old row or an unchanged TOASTed value, truncates, a table the task treats apart) answers
None and goes the general way (``events``), which writes the same bytes.
"""

from __future__ import annotations

import struct
from typing import Any

from rayconnect.source_tasks.base import SourceRecord
from rayconnect.source_tasks.postgres.events import (
    EventBuilder,
    Headers,
    RowCodec,
    source_tail,
)
from rayconnect.source_tasks.postgres.pgoutput import Begin, ms_of
from rayconnect.source_tasks.postgres.row_reader import RowReader

_RELATION = struct.Struct(">i").unpack_from
_INSERT, _NEW = 0x49, 0x4E
_BEFORE_NULL = b'{"before":null,"after":'


class _Table:
    """What every fast record of one relation shares."""

    __slots__ = ("read", "topic", "headers", "source", "partition")

    def __init__(self, read: RowReader, topic: str, headers: Headers, source: bytes, keyed: bool):
        self.read, self.topic, self.headers, self.source = read, topic, headers, source
        #: a keyless table's records all go to partition 0 (commit order), as ``events``'
        self.partition = None if keyed else 0


class ChangeRecords:
    """The records of plain inserts and updates of the transaction under way."""

    def __init__(self, events: EventBuilder, source_partition: Any) -> None:
        self._events = events
        self._partition = source_partition
        self._tables: dict[int, _Table] = {}
        self._tail_c = self._tail_u = b""

    def relation(self, relation_id: int, codec: RowCodec | None) -> None:
        """The relation's changes are the table of ``codec`` (None: the general way takes
        them all)."""
        read = codec.read if codec is not None else None
        if codec is None or read is None:
            self._tables.pop(relation_id, None)
            return
        shape, events = codec.shape, self._events
        source = b',"source":' + events.source_head(shape)
        keyed = bool(shape.primary_key)
        self._tables[relation_id] = _Table(read, events.topic(shape), codec.headers, source, keyed)

    def begin(self, txn: Begin, now_ms: int) -> None:
        """A transaction starts: its part of the events, made once."""
        commit_ms = ms_of(txn.commit_ts_us)
        tail = source_tail(lsn=txn.final_lsn, txid=txn.xid, commit_ms=commit_ms, snapshot=False)
        end = b'","ts_ms":%d}' % now_ms
        self._tail_c = tail + b',"op":"c' + end
        self._tail_u = tail + b',"op":"u' + end

    def record(self, payload: bytes, offset: dict[str, Any]) -> SourceRecord | None:
        """An Insert or Update message (kind ``I``/``U``) as its record with ``offset``,
        or None: the general way takes it."""
        if payload[5] != _NEW:  # an update's old key or row, a delete
            return None
        table = self._tables.get(_RELATION(payload, 1)[0])
        if table is None:
            return None
        found = table.read(payload, 6)
        if found is None:
            return None
        row, key = found
        tail = self._tail_c if payload[0] == _INSERT else self._tail_u
        value = b"".join((_BEFORE_NULL, row, table.source, tail))
        partition = table.partition
        return SourceRecord(
            table.topic, value, key, table.headers, partition, self._partition, offset
        )
