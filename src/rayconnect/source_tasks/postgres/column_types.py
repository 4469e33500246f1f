"""Each column's lake type from its Postgres type (pgoutput's type oid and modifier), pure.

The names are the sink's ``value_schema`` type names (``formats.types``), so a record's
``rayconnect.value_schema`` header (``events``) types an upsert table's new columns exactly
as a declared schema would: ``numeric(12,2)`` -> ``decimal(12,2)``, ``date`` -> ``date``,
``timestamptz`` -> ``timestamp`` (UTC), ``timestamp`` -> ``timestamp_ntz``, arrays -> lists,
ints by width, ``real``/``double precision`` -> ``float``/``double``, ``bytea`` -> ``binary``.
Everything else - text, json/jsonb, uuid, enums and other types of the database's own
(their oids are not fixed), time, interval, money, network types - is a string in its
Postgres text form.

An unconstrained ``numeric`` (no precision) is a string too: its values may have any number
of digits (a division gives 20 decimals, a sum of them more), and no lake decimal holds
every one exactly (Delta's and Iceberg's widest is ``decimal(38,s)`` with one fixed scale).
A string keeps every value exact and never makes a record a dead letter; declare
``numeric(p,s)`` in Postgres for a decimal column. The same for ``numeric(p,s)`` that no
lake decimal can hold (precision over 38, a negative scale or one above the precision).
"""

from __future__ import annotations

#: the widest decimal Delta and Iceberg hold
MAX_DECIMAL_PRECISION = 38

NUMERIC = 1700

#: built-in scalar types -> lake type name (any other oid: ``string``)
SCALARS: dict[int, str] = {
    16: "boolean",
    17: "binary",  # bytea
    20: "long",  # int8
    21: "short",  # int2
    23: "int",  # int4
    26: "long",  # oid (unsigned 32 bits)
    700: "float",  # float4
    701: "double",  # float8
    1082: "date",
    1114: "timestamp_ntz",  # timestamp without time zone
    1184: "timestamp",  # timestamp with time zone: UTC
}

#: built-in array types -> their element type (arrays of other types: a string)
ARRAYS: dict[int, int] = {
    1000: 16,
    1001: 17,
    1005: 21,
    1007: 23,
    1016: 20,
    1028: 26,
    1021: 700,
    1022: 701,
    1231: NUMERIC,
    1182: 1082,
    1115: 1114,
    1185: 1184,
    1009: 25,  # text
    1015: 1043,  # varchar
    1014: 1042,  # bpchar
    1002: 18,  # "char"
    1003: 19,  # name
    2951: 2950,  # uuid
    199: 114,  # json
    3807: 3802,  # jsonb
    1183: 1083,  # time
    1187: 1186,  # interval
}


def numeric_type(type_modifier: int) -> str:
    """``decimal(p,s)`` for ``numeric(p,s)`` a lake decimal holds, else ``string``."""
    if type_modifier < 4:  # -1: unconstrained
        return "string"
    packed = type_modifier - 4
    precision = (packed >> 16) & 0xFFFF
    scale = ((packed & 0x7FF) ^ 1024) - 1024  # an 11-bit signed scale (Postgres 15)
    if not 0 < precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        return "string"
    return f"decimal({precision},{scale})"


def scalar_type(type_oid: int, type_modifier: int) -> str:
    if type_oid == NUMERIC:
        return numeric_type(type_modifier)
    return SCALARS.get(type_oid, "string")


def lake_type(type_oid: int, type_modifier: int) -> str:
    """The lake type name of a column of ``type_oid`` with ``type_modifier`` (pgoutput's
    Relation message; an array's modifier is its element's)."""
    element = ARRAYS.get(type_oid)
    if element is not None:
        return f"array<{scalar_type(element, type_modifier)}>"
    return scalar_type(type_oid, type_modifier)
