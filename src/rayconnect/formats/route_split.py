"""A block of raw records split by route table (``config.routes``), before decoding.

Routing happens on the raw records so that each table's rows are decoded against that
table's own schema (a column of one table never steers another's parser), and so that the
rows of a table keep their Kafka order. A topic rule needs nothing but the topic (one
decision per distinct topic of the block); a field rule reads only its field from the JSON
value (a msgspec type that skips everything else), also under a Debezium JSON converter's
``payload``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import pyarrow as pa

from rayconnect.formats.rows import dead_letter_rows


class Routed(msgspec.Struct, frozen=True):
    """A record's table (None: unrouted, ``reason`` says why)."""

    table: str | None
    reason: str = ""


class Router(Protocol):
    """What decides a record's table (``config.routes.Routes``)."""

    @property
    def fields(self) -> tuple[str, ...]: ...

    @property
    def unrouted(self) -> str:
        """``dead_letter`` or ``stop``: what a record no rule takes does."""
        ...

    def route(self, topic: str, values: Mapping[str, str | None] | None = None) -> Routed: ...


@dataclass(frozen=True)
class RoutedBlock:
    """A raw block's rows by table (each in the block's order), and the unrouted ones as
    dead-letter rows (``formats.rows.DEAD_LETTER_SCHEMA``, the reason in ``reason``)."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    unrouted: pa.Table | None = None
    #: the first unrouted record's (offset, reason), for ``unrouted: stop``
    first_unrouted: tuple[int, str] | None = None


def _leaf(value: Any) -> str | None:
    """A field's value as a table name part: text and numbers only."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str | int | float):
        return str(value)
    return None


def field_reader(path: str) -> Callable[[bytes | None], str | None]:
    """A function reading the dotted ``path`` of a JSON value (or of its ``payload``),
    decoding nothing else; None where it is absent, not text or a number, or the value is
    not JSON."""
    parts = path.split(".")
    node: Any = Any
    for name in reversed(parts[1:]):
        node = msgspec.defstruct("_At", [(name, node | None, None)]) | None
    inner = msgspec.defstruct("_Value", [(parts[0], node, None)])
    outer = msgspec.defstruct("_Wrapped", [(parts[0], node, None), ("payload", inner | None, None)])
    decode = msgspec.json.Decoder(outer).decode

    def walk(obj: Any) -> Any:
        for name in parts:
            if obj is None:
                return None
            obj = getattr(obj, name)
        return obj

    def read(value: bytes | None) -> str | None:
        if value is None:
            return None
        try:
            decoded = decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        found = walk(decoded)
        wrapped = getattr(decoded, "payload", None)
        if found is None and wrapped is not None:
            found = walk(wrapped)
        return _leaf(found)

    return read


def split_block(raw: pa.Table, routes: Router) -> RoutedBlock:
    """``raw`` (the raw record schema) split by the table each record's route gives."""
    topics = raw.column("topic").to_pylist()
    decisions: list[Routed]
    if not routes.fields:
        by_topic = {t: routes.route(t) for t in set(topics)}
        decisions = [by_topic[t] for t in topics]
    else:
        readers = {f: field_reader(f) for f in routes.fields}
        values = raw.column("value").to_pylist()
        decided: dict[tuple[str, tuple[str | None, ...]], Routed] = {}  # few distinct ones
        decisions = []
        for t, v in zip(topics, values, strict=True):
            read = {f: read(v) for f, read in readers.items()}
            seen = (t, tuple(read.values()))
            routed = decided.get(seen)
            if routed is None:
                routed = decided[seen] = routes.route(t, read)
            decisions.append(routed)
    rows: dict[str, list[int]] = {}
    bad: dict[int, str] = {}
    for i, routed in enumerate(decisions):
        if routed.table is None:
            bad[i] = routed.reason
        else:
            rows.setdefault(routed.table, []).append(i)
    if len(rows) == 1 and not bad:
        return RoutedBlock({next(iter(rows)): raw})
    tables = {name: raw.take(pa.array(idx, pa.int64())) for name, idx in rows.items()}
    if not bad:
        return RoutedBlock(tables)
    first = min(bad)
    offset = int(raw.column("offset")[first].as_py())
    return RoutedBlock(tables, dead_letter_rows(raw, bad), (offset, bad[first]))
