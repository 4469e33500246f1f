"""Column type names of a declared schema (``value_schema``) -> Arrow types.

The names are the ones users know from Spark/Delta DDL: ``string``, ``long``, ``int``,
``double``, ``float``, ``boolean``, ``binary`` (base64 in the JSON), ``date`` (``YYYY-MM-DD``),
``timestamp`` (an ISO-8601 string; UTC), ``timestamp_ntz`` (an ISO-8601 string without a
zone: a timestamp without time zone), ``timestamp_millis`` (epoch milliseconds),
``decimal(p,s)`` (a JSON number or string of its digits; ``p`` up to 38), ``array<T>``; a
nested mapping is a struct. Everything is nullable: a missing field is a null, never a bad
record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

#: Arrow type a timestamp column has in the table (Delta's timestamp: µs, UTC).
TIMESTAMP = pa.timestamp("us", tz="UTC")

_SCALARS: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": TIMESTAMP,
    "timestamp_ntz": pa.timestamp("us"),
    #: epoch milliseconds in the JSON; a timestamp in the table
    "timestamp_millis": TIMESTAMP,
}

_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")

#: Field metadata marking a column whose JSON holds epoch milliseconds.
EPOCH_MILLIS = {b"rayconnect.encoding": b"epoch_millis"}


class TypeNameError(ValueError):
    """A declared column type that is not one of the known names."""


def arrow_type(spec: Any, where: str) -> pa.DataType:
    """The Arrow type of one declared column (``where`` names it in errors)."""
    if isinstance(spec, Mapping):
        return pa.struct(declared_fields(spec, where))
    if not isinstance(spec, str):
        raise TypeNameError(f"{where}: a type name or a mapping of fields, not {spec!r}")
    name = spec.strip().lower()
    if name.startswith("array<") and name.endswith(">"):
        return pa.list_(arrow_type(spec.strip()[6:-1], f"{where}[]"))
    decimal = _DECIMAL.fullmatch(name)
    if decimal is not None:
        precision, scale = int(decimal[1]), int(decimal[2])
        if not 0 < precision <= 38 or scale > precision:
            raise TypeNameError(f"{where}: {spec!r}: precision 1..38, scale 0..precision")
        return pa.decimal128(precision, scale)
    if name not in _SCALARS:
        raise TypeNameError(
            f"{where}: unknown type {spec!r}; known: {', '.join(sorted(_SCALARS))}, "
            "decimal(p,s), array<T>, or a mapping of fields (a struct)"
        )
    return _SCALARS[name]


def declared_fields(spec: Mapping[str, Any], where: str = "value_schema") -> list[pa.Field]:
    """Declared columns, in order, all nullable; epoch-millis columns carry a marker."""
    fields = []
    for name, type_spec in spec.items():
        if not isinstance(name, str) or not name:
            raise TypeNameError(f"{where}: a column name must be a non-empty string")
        t = arrow_type(type_spec, f"{where}.{name}")
        millis = isinstance(type_spec, str) and type_spec.strip().lower() == "timestamp_millis"
        fields.append(pa.field(name, t, nullable=True, metadata=EPOCH_MILLIS if millis else None))
    return fields
