"""Debezium-compatible change events and the Kafka records that carry them (pure).

A record's key is the row's primary key as a JSON object (``{"id": 7}``), its value the
event ``{"before", "after", "source", "op", "ts_ms"}`` with ``op`` ``r`` (snapshot read),
``c``, ``u`` or ``d``; ``source`` says where the change is in Postgres (``lsn``, ``txId``,
``ts_ms`` of the commit, ``schema``, ``table``, ``snapshot``). ``before`` is the old row as
Postgres sends it: the key columns only (REPLICA IDENTITY DEFAULT) or the whole row (FULL).
A column whose TOASTed value an update did not change is left out of ``after`` (pgoutput
does not send it). Tables without a primary key (REPLICA IDENTITY FULL) have key null and
all their records go to Kafka partition 0, which keeps them in commit order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from rayconnect.source_tasks.base import SourceRecord
from rayconnect.source_tasks.postgres.pgoutput import Cell, Column, Unchanged, format_lsn
from rayconnect.source_tasks.postgres.values import converter

#: numeric as JSON numbers with their exact digits
_encoder = msgspec.json.Encoder(decimal_format="number")

Row = dict[str, Any]


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


def row(columns: Sequence[Column], cells: Sequence[Cell]) -> Row:
    """Typed values by column name; unchanged TOAST values left out."""
    out: Row = {}
    for column, cell in zip(columns, cells, strict=True):
        if cell is None:
            out[column.name] = None
        elif not isinstance(cell, Unchanged):
            out[column.name] = converter(column.type_oid)(cell)
    return out


def key_of(shape: TableShape, values: Row) -> list[Any] | None:
    """The primary key's values in key order (None: no primary key)."""
    if not shape.primary_key:
        return None
    return [values.get(c) for c in shape.primary_key]


class EventBuilder:
    """Builds the records of one task; ``topic_of`` names the topic of a table."""

    def __init__(self, topic_prefix: str, topic_of: Any, tombstones: bool, database: str) -> None:
        self.topic_prefix = topic_prefix
        self.topic_of = topic_of
        self.tombstones = tombstones
        self.database = database
        self._topics: dict[tuple[str, str], str] = {}

    def topic(self, shape: TableShape) -> str:
        found = self._topics.get((shape.schema, shape.table))
        if found is None:
            found = self._topics[(shape.schema, shape.table)] = self.topic_of(
                shape.schema, shape.table
            )
        return found

    def records(
        self,
        shape: TableShape,
        op: str,
        before: Row | None,
        after: Row | None,
        *,
        lsn: int,
        txid: int | None,
        commit_ms: int,
        snapshot: bool,
        offset: dict[str, Any],
        source_partition: Any,
    ) -> list[SourceRecord]:
        """The record of one change (and its tombstone after a delete, if asked)."""
        values = after if after is not None else before or {}
        key_values = key_of(shape, values)
        key = (
            None
            if key_values is None
            else _encoder.encode(dict(zip(shape.primary_key, key_values, strict=True)))
        )
        event = {
            "before": before,
            "after": after,
            "source": {
                "connector": "postgresql",
                "name": self.topic_prefix,
                "db": self.database,
                "schema": shape.schema,
                "table": shape.table,
                "lsn": lsn,
                "lsn_text": format_lsn(lsn),
                "txId": txid,
                "ts_ms": commit_ms,
                "snapshot": "true" if snapshot else "false",
            },
            "op": op,
            "ts_ms": int(time.time() * 1000),
        }
        topic = self.topic(shape)
        partition = None if key is not None else 0
        out = [
            SourceRecord(
                topic,
                _encoder.encode(event),
                key=key,
                partition=partition,
                source_partition=source_partition,
                source_offset=offset,
            )
        ]
        if op == "d" and self.tombstones and key is not None:
            out.append(
                SourceRecord(
                    topic,
                    None,
                    key=key,
                    source_partition=source_partition,
                    source_offset=offset,
                )
            )
        return out
