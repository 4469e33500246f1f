"""Postgres column types -> lake types and their JSON values, without IO: the mapping from
pgoutput's type oid and modifier (the table in docs/guides/database-mirror.md#types), array
values as JSON arrays, and the header a row's records carry."""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pytest

from rayconnect.formats.types import arrow_type
from rayconnect.source_tasks.postgres.column_types import lake_type
from rayconnect.source_tasks.postgres.events import RowCodec, TableShape
from rayconnect.source_tasks.postgres.pgoutput import Column, Unchanged
from rayconnect.source_tasks.postgres.values import json_encoder, parse_array


def typmod(precision: int, scale: int) -> int:
    """``numeric(precision, scale)``'s atttypmod, as Postgres packs it."""
    return ((precision << 16) | (scale & 0x7FF)) + 4


@pytest.mark.parametrize(
    ("oid", "modifier", "name", "arrow"),
    [
        (16, -1, "boolean", pa.bool_()),
        (17, -1, "binary", pa.binary()),
        (21, -1, "short", pa.int16()),
        (23, -1, "int", pa.int32()),
        (20, -1, "long", pa.int64()),
        (700, -1, "float", pa.float32()),
        (701, -1, "double", pa.float64()),
        (1700, typmod(12, 2), "decimal(12,2)", pa.decimal128(12, 2)),
        (1700, typmod(38, 0), "decimal(38,0)", pa.decimal128(38, 0)),
        (1700, -1, "string", pa.string()),  # unconstrained: any digits, kept exact
        (1700, typmod(39, 2), "string", pa.string()),  # wider than any lake decimal
        (1700, typmod(3, -2), "string", pa.string()),  # Postgres 15's negative scale
        (1700, typmod(2, 5), "string", pa.string()),  # a scale above the precision
        (1082, -1, "date", pa.date32()),
        (1114, 3, "timestamp_ntz", pa.timestamp("us")),
        (1184, -1, "timestamp", pa.timestamp("us", tz="UTC")),
        (3802, -1, "string", pa.string()),  # jsonb
        (2950, -1, "string", pa.string()),  # uuid
        (1186, -1, "string", pa.string()),  # interval
        (16390, -1, "string", pa.string()),  # an enum (the database's own oid)
        (1009, -1, "array<string>", pa.list_(pa.string())),
        (1007, -1, "array<int>", pa.list_(pa.int32())),
        (1231, typmod(5, 1), "array<decimal(5,1)>", pa.list_(pa.decimal128(5, 1))),
        (1185, -1, "array<timestamp>", pa.list_(pa.timestamp("us", tz="UTC"))),
        (16399, -1, "string", pa.string()),  # an array of an enum: its text
    ],
)
def test_lake_types_by_oid_and_modifier(
    oid: int, modifier: int, name: str, arrow: pa.DataType
) -> None:
    assert lake_type(oid, modifier) == name
    assert arrow_type(name, "t") == arrow


@pytest.mark.parametrize(
    ("text", "items"),
    [
        (b"{}", []),
        (b"{1,NULL,3}", [b"1", None, b"3"]),
        (b'{a,"b c","x,y","q\\"t","back\\\\slash","NULL","{brace}"}', None),
        (b"{{1,2},{3,NULL}}", [[b"1", b"2"], [b"3", None]]),
        (b"[0:1]={7,8}", [b"7", b"8"]),
    ],
)
def test_postgres_array_text_parsed(text: bytes, items: list | None) -> None:
    if items is None:  # quoting and escapes as Postgres writes them
        items = [b"a", b"b c", b"x,y", b'q"t', b"back\\slash", b"NULL", b"{brace}"]
    assert parse_array(text) == items


def test_arrays_are_json_arrays_of_their_elements_encoded_by_type() -> None:
    def value(oid: int, text: bytes, modifier: int = -1) -> object:
        return msgspec.json.decode(json_encoder(oid, modifier)(text))

    assert value(1009, b'{a,NULL,"b c"}') == ["a", None, "b c"]
    assert value(1007, b"{{1,2},{3,NULL}}") == [[1, 2], [3, None]]
    assert value(1231, b"{1.50,NaN}", typmod(5, 2)) == [1.5, "NaN"]
    assert value(1185, b'{"2024-01-02 03:04:05+00"}') == ["2024-01-02T03:04:05Z"]
    assert value(1000, b"{t,f}") == [True, False]
    assert value(1700, b"0.33333333333333333333") == "0.33333333333333333333"  # exact
    assert msgspec.json.decode(json_encoder(1700, typmod(12, 2))(b"-1.25")) == -1.25


def test_a_rows_records_carry_its_lake_types_and_typed_toast_is_null() -> None:
    columns = (
        Column("id", 23, -1, True),
        Column("note", 25, -1, False),
        Column("amount", 1700, typmod(12, 2), False),
        Column("tags", 1009, -1, False),
    )
    codec = RowCodec(TableShape("public", "t", columns, ("id",)))
    ((name, header),) = codec.headers
    assert name == "rayconnect.value_schema"
    assert msgspec.json.decode(header) == {
        "id": "int", "note": "string", "amount": "decimal(12,2)", "tags": "array<string>",
    }  # fmt: skip
    unchanged = Unchanged.TOAST
    row = msgspec.json.decode(codec.row((b"1", unchanged, unchanged, unchanged)))
    # a string column holds the placeholder; a decimal or a list cannot: null
    assert row == {"id": 1, "note": "__debezium_unavailable_value", "amount": None, "tags": None}
    assert RowCodec(codec.shape, types=False).headers == ()
