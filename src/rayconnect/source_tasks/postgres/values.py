"""Column values from Postgres's text form straight to JSON text, by the column's type (pure).

The snapshot reads every column as ``col::text`` and pgoutput sends the same text, so a row
is encoded by one function whichever way it came: a value in an ``r`` event equals the same
value in a ``c``/``u`` event. JSON types: integers as integers; ``numeric`` as a JSON number
with its exact digits (``NaN``/``Infinity`` as strings); floats as numbers (non-finite as
strings); ``bool`` as true/false; timestamps as ISO 8601 (``timestamptz`` in UTC with a
``Z``: the connections set ``TimeZone=UTC``); ``bytea`` as base64 (as Debezium does); arrays
of the built-in types as JSON arrays of their elements so encoded (``column_types.ARRAYS``;
a multi-dimensional one as nested arrays); the rest (text, uuid, json, dates...) as their
Postgres text. A ``numeric`` whose lake type is a string (``column_types``: unconstrained)
is a JSON string of its exact digits, as Debezium's ``decimal.handling.mode: string`` writes
it: a JSON number of 20 digits is a float to most readers, and its column a string.

Why text to JSON text, and no Python value in between: Postgres's text of an integer or a
finite number already is its JSON, so most columns cost a slice of the message; the
change stream's rate is set by what each value costs (bench/postgres_source.py).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable

import msgspec

from rayconnect.source_tasks.postgres.column_types import ARRAYS, scalar_type

BOOL, BYTEA, INT8, INT2, INT4, OID = 16, 17, 20, 21, 23, 26
FLOAT4, FLOAT8, NUMERIC = 700, 701, 1700
TIMESTAMP, TIMESTAMPTZ = 1114, 1184

#: a column's value in Postgres's text form -> the same value as JSON text
Encode = Callable[[bytes], bytes]

_string = msgspec.json.Encoder().encode
_DIGITS = frozenset(b"0123456789")


def _text(text: bytes) -> bytes:
    return _string(text.decode())


def same_text(text: bytes) -> bytes:
    """An integer's text is its JSON (a row reader uses the slice itself: no call)."""
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
    INT2: same_text,
    INT4: same_text,
    INT8: same_text,
    OID: same_text,
    FLOAT4: _number,
    FLOAT8: _number,
    NUMERIC: _number,
    TIMESTAMP: _timestamp,
    TIMESTAMPTZ: _timestamptz,
    BYTEA: _bytea,
}


def _scalar_encoder(type_oid: int, type_modifier: int) -> Encode:
    if type_oid == NUMERIC and scalar_type(type_oid, type_modifier) == "string":
        return _text
    return _ENCODERS.get(type_oid, _text)


def json_encoder(type_oid: int, type_modifier: int = -1) -> Encode:
    """The function that writes a column of ``type_oid`` (and ``type_modifier``) as JSON
    (its text as a string if no other)."""
    element = ARRAYS.get(type_oid)
    if element is None:
        return _scalar_encoder(type_oid, type_modifier)
    encode = _scalar_encoder(element, type_modifier)
    return lambda text: _json_array(parse_array(text), encode)


#: a Postgres array's elements: each one's text (None: NULL), or a nested array
ArrayItems = list["bytes | None | ArrayItems"]


def parse_array(text: bytes) -> ArrayItems:
    """A Postgres array's text form (``{1,NULL,"a b","q\\"x"}``, nested ``{{1},{2}}``, a
    ``[1:2]=`` bounds prefix) -> its elements, unquoted and unescaped."""
    pos = text.find(b"{")
    if pos < 0:
        raise ValueError(f"not a Postgres array: {text[:40]!r}")
    stack: list[ArrayItems] = [[]]
    pos += 1
    n = len(text)
    while pos < n:
        c = text[pos]
        if c == 0x7B:  # {
            stack.append([])
            pos += 1
        elif c == 0x7D:  # }
            done = stack.pop()
            if not stack:
                return done
            stack[-1].append(done)
            pos += 1
        elif c == 0x2C or c in b" \t\n":  # , and whitespace between elements
            pos += 1
        elif c == 0x22:  # "...": backslash escapes
            out = bytearray()
            pos += 1
            while text[pos] != 0x22:
                if text[pos] == 0x5C:
                    pos += 1
                out.append(text[pos])
                pos += 1
            stack[-1].append(bytes(out))
            pos += 1
        else:
            end = pos
            while end < n and text[end] not in b",}":
                end += 1
            item = text[pos:end].strip()
            stack[-1].append(None if item.upper() == b"NULL" else item)
            pos = end
    raise ValueError(f"unterminated Postgres array: {text[:40]!r}")


def _json_array(items: ArrayItems, encode: Encode) -> bytes:
    parts = [
        b"null" if item is None
        else _json_array(item, encode) if isinstance(item, list)
        else encode(item)
        for item in items
    ]  # fmt: skip
    return b"[" + b",".join(parts) + b"]"
