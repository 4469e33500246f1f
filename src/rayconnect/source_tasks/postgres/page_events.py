"""A snapshot page's events built a column at a time (pure): the snapshot's encoder.

``events.read_events`` writes a row at a time - a Python call per column per row. A page
of ``COPY`` text is a grid: split once (``copy_text.parse_columns``), each column is
encoded with one comprehension (an integer column's text already is its JSON: nothing to
do but nulls), and each row's value is one ``bytes % tuple`` of a template holding the
field names and the parts every row of the page shares. The bytes are
``read_events``'s, byte for byte (tests/unit/source_tasks: both on the same rows).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from rayconnect.source_tasks.postgres.events import TableShape
from rayconnect.source_tasks.postgres.values import json_encoder

_encode = msgspec.json.Encoder().encode
#: ``values``'s encoders, known by identity (another one is called per value)
_SAME, _NUMBER = json_encoder(20), json_encoder(701)
_TEXT, _TIMESTAMPTZ = json_encoder(25), json_encoder(1184)
#: what a JSON string must escape (a column holding none is quoted as it is)
_NEEDS_ESCAPE = re.compile(rb'[\x00-\x1f"\\]')

Column = Sequence[bytes | None]


def _quoted(column: Sequence[bytes]) -> list[bytes]:
    """Each value in quotes: one join and one split (no value holds a tab here)."""
    return (b'"' + b'"\t"'.join(column) + b'"').split(b"\t")


def _whole_column(encode: object, column: Sequence[bytes]) -> list[bytes] | None:
    """``column`` (no nulls) encoded by a few operations on all of it, when its values
    allow (else None: value by value) - the same bytes ``encode`` writes for each."""
    if encode is _SAME:
        return list(column)
    joined = b"".join(column)
    if encode is _NUMBER:  # digits as they are; only NaN and Infinity are quoted
        return None if b"N" in joined or b"I" in joined or b"" in column else list(column)
    if encode is _TEXT:
        joined.decode()  # invalid UTF-8 fails here as the value's own decode would
        return None if _NEEDS_ESCAPE.search(joined) else _quoted(column)
    if encode is _TIMESTAMPTZ:
        # one space each (no BC suffix), every one ending +00 (TimeZone=UTC)
        if joined.count(b" ") != len(column) or joined.count(b"+00") != len(column):
            return None
        quoted = b'"' + b'"\t"'.join(column).replace(b" ", b"T") + b'"'
        out = quoted.replace(b'+00"', b'Z"').split(b"\t")
        return out if len(out) == len(column) else None
    return None


def _escape(part: bytes) -> bytes:
    return part.replace(b"%", b"%%")


class PageCodec:
    """One table shape's page encoder: a value template and a key template."""

    __slots__ = ("_encoders", "_value", "_key", "_key_positions")

    def __init__(self, shape: TableShape) -> None:
        columns = shape.columns
        self._encoders = [json_encoder(c.type_oid, c.type_modifier) for c in columns]
        names = [_escape(_encode(c.name)) + b":" for c in columns]
        row = b",".join(name + b"%b" for name in names)
        #: the value up to ``source`` (the part after it is the page's)
        self._value = b'{"before":null,"after":{' + row + b"}"
        position = {c.name: i for i, c in enumerate(columns)}
        self._key_positions = [position[name] for name in shape.primary_key]
        self._key = b"{" + b",".join(names[i] + b"%b" for i in self._key_positions) + b"}"

    def _json(self, i: int, column: Column) -> list[bytes]:
        encode = self._encoders[i]
        if None not in column:
            whole = _whole_column(encode, column)  # type: ignore[arg-type]  # no None
            if whole is not None:
                return whole
        if encode is _SAME:
            return [b"null" if v is None else v for v in column]
        return [b"null" if v is None else encode(v) for v in column]

    def events(
        self, columns: Sequence[Column], source: bytes, now_ms: int
    ) -> tuple[list[bytes | None], list[bytes]]:
        """The keys and values of snapshot reads (``op: r``) of the rows ``columns`` hold
        (column ``i`` of the table shape: each row's text, None for null)."""
        if not columns or not columns[0]:
            return [], []
        tail = b',"source":' + source + b',"op":"r","ts_ms":' + str(now_ms).encode() + b"}"
        encoded = [self._json(i, column) for i, column in enumerate(columns)]
        template = self._value + _escape(tail)
        values = [template % row for row in zip(*encoded, strict=True)]
        if not self._key_positions:
            return [None] * len(values), values
        key = self._key
        keys: list[bytes | None] = [
            key % row for row in zip(*(encoded[i] for i in self._key_positions), strict=True)
        ]
        return keys, values
