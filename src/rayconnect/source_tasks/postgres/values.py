"""Column values from Postgres's text form straight to JSON text, by the column's type (pure).

The snapshot reads every column as ``col::text`` and pgoutput sends the same text, so a row
is encoded by one function whichever way it came: a value in an ``r`` event equals the same
value in a ``c``/``u`` event. JSON types: integers as integers; ``numeric`` as a JSON number
with its exact digits (``NaN``/``Infinity`` as strings); floats as numbers (non-finite as
strings); ``bool`` as true/false; timestamps as ISO 8601 (``timestamptz`` in UTC with a
``Z``: the connections set ``TimeZone=UTC``); ``bytea`` as base64 (as Debezium does); the
rest (text, uuid, json, dates, arrays...) as their Postgres text.

Why text to JSON text, and no Python value in between: Postgres's text of an integer or a
finite number already is its JSON, so most columns cost a slice of the message; the
change stream's rate is set by what each value costs (bench/postgres_source.py).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable

import msgspec

BOOL, BYTEA, INT8, INT2, INT4, OID = 16, 17, 20, 21, 23, 26
FLOAT4, FLOAT8, NUMERIC = 700, 701, 1700
TIMESTAMP, TIMESTAMPTZ = 1114, 1184

#: a column's value in Postgres's text form -> the same value as JSON text
Encode = Callable[[bytes], bytes]

_string = msgspec.json.Encoder().encode
_DIGITS = frozenset(b"0123456789")


def _text(text: bytes) -> bytes:
    return _string(text.decode())


def _same(text: bytes) -> bytes:
    return text


def _number(text: bytes) -> bytes:
    """A float or numeric: its text is JSON unless it is NaN or (-)Infinity."""
    first = text[0] if text else 0
    if first in _DIGITS or (first == 0x2D and len(text) > 1 and text[1] in _DIGITS):
        return text
    return b'"' + text + b'"'


def _bool(text: bytes) -> bytes:
    # pgoutput sends t/f, the snapshot's bool::text true/false
    return b"true" if text in (b"t", b"true") else b"false"


def _timestamp(text: bytes) -> bytes:
    return b'"' + text.replace(b" ", b"T", 1) + b'"'


def _timestamptz(text: bytes) -> bytes:
    """``2024-01-02 03:04:05.6+00`` (TimeZone=UTC) -> ``"2024-01-02T03:04:05.6Z"``."""
    text = text.replace(b" ", b"T", 1)
    return b'"' + (text[:-3] + b"Z" if text.endswith(b"+00") else text) + b'"'


def _bytea(text: bytes) -> bytes:
    if not text.startswith(b"\\x"):
        return _text(text)
    return b'"' + binascii.b2a_base64(binascii.a2b_hex(text[2:]), newline=False) + b'"'


_ENCODERS: dict[int, Encode] = {
    BOOL: _bool,
    INT2: _same,
    INT4: _same,
    INT8: _same,
    OID: _same,
    FLOAT4: _number,
    FLOAT8: _number,
    NUMERIC: _number,
    TIMESTAMP: _timestamp,
    TIMESTAMPTZ: _timestamptz,
    BYTEA: _bytea,
}


def json_encoder(type_oid: int) -> Encode:
    """The function that writes a column of ``type_oid`` as JSON (a string if none)."""
    return _ENCODERS.get(type_oid, _text)
