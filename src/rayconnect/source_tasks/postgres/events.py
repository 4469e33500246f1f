"""Debezium-compatible change events and the Kafka records that carry them (pure).

A record's key is the row's primary key as a JSON object (``{"id": 7}``), its value the
event ``{"before", "after", "source", "op", "ts_ms"}`` with ``op`` ``r`` (snapshot read),
``c``, ``u`` or ``d``; ``source`` says where the change is in Postgres (``lsn``, ``txId``,
``ts_ms`` of the commit, ``schema``, ``table``, ``snapshot``). ``before`` is the old row as
Postgres sends it: the key columns only (REPLICA IDENTITY DEFAULT) or the whole row (FULL).

A TOASTed value an update did not change is not sent by pgoutput: ``after`` takes it from
the old row when Postgres sent that (REPLICA IDENTITY FULL), else it holds the placeholder
``unavailable_value`` (Debezium's ``__debezium_unavailable_value``) - never null, which
would claim the value was cleared. An update that changes the primary key is, as in
Debezium, a delete of the old key (and its tombstone) followed by a create of the new one,
so a compacted topic or an upsert sink forgets the old key. Tables without a primary key
(REPLICA IDENTITY FULL) have key null and all their records go to Kafka partition 0, which
keeps them in commit order. A truncate (``op: t``, no key, no row) goes to every partition
of the table's topic, one copy each in the transaction, marked with the header
``rayconnect.truncate: partition`` (``protocol.truncate_marker``): each partition's readers
meet it in that partition's order, which makes a sink's truncate exact per partition.

Each record of a row change carries the header ``rayconnect.value_schema``: the table's
columns and their lake types (``column_types``) as a JSON object, ``{"id": "int", "amount":
"decimal(12,2)", ...}`` - what a sink's ``value_schema`` takes - so an upsert table made from
the topic has the database's types, not ones guessed from JSON values. A header, not
Debezium's ``{"schema", "payload"}`` wrapper: the value stays the event every reader of the
topic already reads, and the header is one shared bytes object per table shape (its cost:
docs/guides/database-mirror.md#types). ``column_types: none`` leaves it out. A column whose
lake type is not a string cannot hold the unavailable placeholder: its unchanged TOASTed
value is null in ``after``.

Events are written as JSON bytes directly (``values``: each column's text to its JSON
text); no Python value per column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rayconnect.formats.value_schema_header import VALUE_SCHEMA_HEADER
from rayconnect.protocol.truncate_marker import PARTITION_TRUNCATE_HEADERS
from rayconnect.protocol.unchanged_marker import unchanged_headers
from rayconnect.source_tasks.base import SourceRecord
from rayconnect.source_tasks.postgres.column_types import lake_type
from rayconnect.source_tasks.postgres.pgoutput import Cell, Column, Unchanged
from rayconnect.source_tasks.postgres.row_reader import compile_reader
from rayconnect.source_tasks.postgres.values import json_encoder

#: what ``after`` holds for a TOASTed value that was not sent (Debezium's default)
UNAVAILABLE_VALUE = "__debezium_unavailable_value"
Headers = tuple[tuple[str, bytes | None], ...]

_encode = msgspec.json.Encoder().encode


class TableShape(msgspec.Struct, frozen=True):
    """A table's columns as the events are built from them, and its primary key."""

    schema: str
    table: str
    columns: tuple[Column, ...]
    #: primary key column names, in key order; () for a table without one
    primary_key: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


class RowCodec:
    """Rows of one table shape as JSON, built once per shape (a Relation message)."""

    __slots__ = (
        "shape", "headers", "read", "_names", "_fields", "_encoders", "_key", "_identity",
        "_unavailable",
    )  # fmt: skip

    def __init__(
        self, shape: TableShape, unavailable_value: str = UNAVAILABLE_VALUE, types: bool = True
    ) -> None:
        self.shape = shape
        columns = shape.columns
        lake_types = {c.name: lake_type(c.type_oid, c.type_modifier) for c in columns}
        #: the headers of the table's row records: its columns' lake types (``types``)
        self.headers: Headers = (
            ((VALUE_SCHEMA_HEADER, _encode(lake_types)),) if types and columns else ()
        )
        self._names = [_encode(c.name) + b":" for c in columns]
        #: the names as a whole row writes them: ``{"a":`` first, then ``,"b":``
        self._fields = [(b"," if i else b"{") + name for i, name in enumerate(self._names)]
        self._encoders = [json_encoder(c.type_oid, c.type_modifier) for c in columns]
        position = {c.name: i for i, c in enumerate(columns)}
        #: the primary key's column positions, in key order
        self._key = [position[name] for name in shape.primary_key]
        #: the replica identity's columns: what an old key ('K') tuple holds
        self._identity = [i for i, c in enumerate(columns) if c.key]
        placeholder = _encode(unavailable_value)
        #: per column, what an unchanged TOASTed value is: the placeholder where the column
        #: is a string, else null (a decimal or a list cannot hold it)
        self._unavailable = [
            placeholder if lake_types[c.name] == "string" else b"null" for c in columns
        ]
        #: a row of values and NULLs at a position of a pgoutput message -> ``row(cells)``
        #: and ``key(cells)`` in one pass, or None (the general path): ``row_reader``
        self.read = compile_reader(self._fields, self._encoders, self._key, self._names)

    def row(self, cells: Sequence[Cell], old: Sequence[Cell] | None = None) -> bytes:
        """The whole row; an unchanged TOASTed value from ``old`` (a whole old row) if it
        has it, else the placeholder."""
        if not cells:
            return b"{}"
        fields, encoders = self._fields, self._encoders
        parts = []
        for i, cell in enumerate(cells):
            parts.append(fields[i])
            if cell is None:
                parts.append(b"null")
            elif type(cell) is bytes:
                parts.append(encoders[i](cell))
            else:
                kept = old[i] if old is not None else None
                parts.append(
                    encoders[i](kept) if type(kept) is bytes
                    else b"null" if kept is None and old is not None
                    else self._unavailable[i]
                )  # fmt: skip
        parts.append(b"}")
        return b"".join(parts)

    def unchanged(self, cells: Sequence[Cell], old: Sequence[Cell] | None = None) -> Headers:
        """The headers of ``row(cells, old)``: ``headers`` and, when the row does not carry
        some unchanged TOASTed values (``old``, a whole old row, has them all), their
        column names (``protocol.unchanged_marker``: a decimal or a list cannot hold the
        placeholder, so the names say it for every type)."""
        if old is not None or Unchanged.TOAST not in cells:  # (a C loop: every update)
            return self.headers
        columns = self.shape.columns
        names = [columns[i].name for i, cell in enumerate(cells) if cell is Unchanged.TOAST]
        return self.headers + unchanged_headers(names)

    def identity(self, cells: Sequence[Cell]) -> bytes:
        """An old key tuple ('K'): the replica identity's columns only (pgoutput sends the
        others as nulls, which they are not)."""
        return self._object(cells, self._identity)

    def key(self, cells: Sequence[Cell]) -> bytes | None:
        """The primary key as a JSON object in key order; None without a primary key."""
        return self._object(cells, self._key) if self._key else None

    def same_key(self, a: Sequence[Cell], b: Sequence[Cell]) -> bool:
        return all(a[i] == b[i] for i in self._key)

    def _object(self, cells: Sequence[Cell], positions: list[int]) -> bytes:
        parts = []
        for i in positions:
            cell = cells[i]
            text = self._encoders[i](cell) if type(cell) is bytes else b"null"
            parts.append(self._names[i] + text)
        return b"{" + b",".join(parts) + b"}"


def event_value(
    op: str, before: bytes | None, after: bytes | None, source: bytes, now_ms: int
) -> bytes:
    """A change event's JSON: ``{"before", "after", "source", "op", "ts_ms"}``."""
    return b"".join(
        (
            b'{"before":', before or b"null", b',"after":', after or b"null",
            b',"source":', source, b',"op":"', op.encode(), b'","ts_ms":',
            str(now_ms).encode(), b"}",
        )
    )  # fmt: skip


def source_tail(*, lsn: int, txid: int | None, commit_ms: int, snapshot: bool) -> bytes:
    """The transaction's part of a ``source`` block, after ``EventBuilder.source_head``."""
    return b'"lsn":%d,"lsn_text":"%X/%X","txId":%s,"ts_ms":%d,"snapshot":"%s"}' % (
        lsn, lsn >> 32, lsn & 0xFFFFFFFF, b"null" if txid is None else b"%d" % txid,
        commit_ms, b"true" if snapshot else b"false",
    )  # fmt: skip


def read_events(
    codec: RowCodec, rows: Sequence[Sequence[Cell]], source: bytes, now_ms: int
) -> tuple[list[bytes | None], list[bytes]]:
    """The keys and values of snapshot reads (``op: r``) of ``rows``, a page at a time:
    each value is ``event_value("r", None, row, ...)`` byte for byte, with the part every
    row shares built once."""
    head = b'{"before":null,"after":'
    tail = b',"source":' + source + b',"op":"r","ts_ms":' + str(now_ms).encode() + b"}"
    row, key = codec.row, codec.key
    values = [b"".join((head, row(cells), tail)) for cells in rows]
    keys = [key(cells) for cells in rows]
    return keys, values


def key_values(key: bytes | None) -> list[Any] | None:
    """A record key's values in key order (None: no primary key)."""
    return None if key is None else list(msgspec.json.decode(key).values())


class EventBuilder:
    """Builds the records of one task; ``topic_of`` names the topic of a table."""

    def __init__(
        self,
        topic_prefix: str,
        topic_of: Callable[[str, str], str],
        tombstones: bool,
        database: str,
    ) -> None:
        self.topic_prefix = topic_prefix
        self.topic_of = topic_of
        self.tombstones = tombstones
        self.database = database
        self._topics: dict[tuple[str, str], str] = {}
        self._heads: dict[tuple[str, str], bytes] = {}

    def topic(self, shape: TableShape) -> str:
        found = self._topics.get((shape.schema, shape.table))
        if found is None:
            found = self._topics[(shape.schema, shape.table)] = self.topic_of(
                shape.schema, shape.table
            )
        return found

    def source(
        self, shape: TableShape, *, lsn: int, txid: int | None, commit_ms: int, snapshot: bool
    ) -> bytes:
        """The ``source`` block, the same for every change of a transaction and table:
        ``source_head`` (once per table) and ``source_tail`` (once per transaction)."""
        tail = source_tail(lsn=lsn, txid=txid, commit_ms=commit_ms, snapshot=snapshot)
        return self.source_head(shape) + tail

    def source_head(self, shape: TableShape) -> bytes:
        """The table's part of its ``source`` blocks: ``{"connector": ..., "table": ...,``."""
        head = self._heads.get((shape.schema, shape.table))
        if head is None:
            fields = {
                "connector": "postgresql",
                "name": self.topic_prefix,
                "db": self.database,
                "schema": shape.schema,
                "table": shape.table,
            }
            head = self._heads[(shape.schema, shape.table)] = _encode(fields)[:-1] + b","
        return head

    def records(
        self,
        shape: TableShape,
        op: str,
        before: bytes | None,
        after: bytes | None,
        key: bytes | None,
        *,
        source: bytes,
        now_ms: int,
        offset: dict[str, Any],
        source_partition: Any,
        headers: Headers = (),
    ) -> list[SourceRecord]:
        """The record of one change (and its tombstone after a delete, if asked);
        ``headers`` on a row change's record (``RowCodec.headers``)."""
        value = event_value(op, before, after, source, now_ms)
        topic = self.topic(shape)
        if op == "t":
            return [
                SourceRecord(
                    topic,
                    value,
                    headers=PARTITION_TRUNCATE_HEADERS,
                    every_partition=True,
                    source_partition=source_partition,
                    source_offset=offset,
                )
            ]
        record = SourceRecord(
            topic,
            value,
            key=key,
            partition=None if key is not None else 0,
            headers=headers,
            source_partition=source_partition,
            source_offset=offset,
        )
        if op == "d" and self.tombstones and key is not None:
            tombstone = SourceRecord(
                topic, None, key=key, source_partition=source_partition, source_offset=offset
            )
            return [record, tombstone]
        return [record]
