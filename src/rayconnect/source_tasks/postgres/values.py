"""Column values from Postgres's text form to JSON, by the column's type (pure).

The snapshot reads every column as ``col::text`` and pgoutput sends the same text, so a row
is typed by one function whichever way it came: a value in an ``r`` event equals the same
value in a ``c``/``u`` event. JSON types: integers as integers; ``numeric`` as a JSON number
with its exact digits (``NaN``/``Infinity`` as strings); floats as numbers (non-finite as
strings); ``bool`` as true/false; timestamps as ISO 8601 (``timestamptz`` in UTC with a
``Z``: the connections set ``TimeZone=UTC``); ``bytea`` as base64 (as Debezium does); the
rest (text, uuid, json, dates, arrays...) as their Postgres text.
"""

from __future__ import annotations

import base64
import decimal
import math
from collections.abc import Callable
from typing import Any

from rayconnect.source_tasks.postgres.pgoutput import Unchanged

BOOL, BYTEA, INT8, INT2, INT4, OID = 16, 17, 20, 21, 23, 26
FLOAT4, FLOAT8, NUMERIC = 700, 701, 1700
TIMESTAMP, TIMESTAMPTZ = 1114, 1184


def _float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else text


def _numeric(text: str) -> Any:
    value = decimal.Decimal(text)
    return value if value.is_finite() else text


def _timestamp(text: str) -> str:
    return text.replace(" ", "T", 1)


def _timestamptz(text: str) -> str:
    """``2024-01-02 03:04:05.6+00`` (TimeZone=UTC) -> ``2024-01-02T03:04:05.6Z``."""
    text = text.replace(" ", "T", 1)
    return text[:-3] + "Z" if text.endswith("+00") else text


def _bytea(text: str) -> str:
    return base64.b64encode(bytes.fromhex(text[2:])).decode() if text.startswith("\\x") else text


_CONVERTERS: dict[int, Callable[[str], Any]] = {
    BOOL: lambda t: t in ("t", "true"),  # pgoutput sends t/f, bool::text true/false
    INT2: int,
    INT4: int,
    INT8: int,
    OID: int,
    FLOAT4: _float,
    FLOAT8: _float,
    NUMERIC: _numeric,
    TIMESTAMP: _timestamp,
    TIMESTAMPTZ: _timestamptz,
    BYTEA: _bytea,
}


def converter(type_oid: int) -> Callable[[str], Any]:
    """The function that types a column of ``type_oid`` (text as is if none)."""
    return _CONVERTERS.get(type_oid, str)


def typed(type_oid: int, text: str | None | Unchanged) -> Any:
    """One value: None stays None; an unchanged TOAST value stays the Unchanged marker (the
    event builder leaves such a column out)."""
    if text is None or isinstance(text, Unchanged):
        return text
    return converter(type_oid)(text)
