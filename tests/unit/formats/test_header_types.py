"""Columns typed by the records' ``rayconnect.value_schema`` header, without IO: a new
column takes the header's type (decimal, date, timestamps with and without a zone, lists,
base64 binary), a column the table has keeps the table's, a value that does not convert is
a bad record, and a block without the header is inferred as before."""

from __future__ import annotations

import datetime as dt
import decimal

import msgspec
import pyarrow as pa
from test_json_decoding import dead_letters_by_offset
from test_json_decoding import raw as json_raw

from rayconnect.formats.rows import decode_block
from rayconnect.formats.settings import RecordFormat
from rayconnect.formats.value_schema_header import VALUE_SCHEMA_HEADER, hinted_schema
from rayconnect.schema import RAW_RECORD_SCHEMA

JSON = RecordFormat(value_format="json", errors="dead_letter")
TYPES = {
    "id": "int",
    "amount": "decimal(12,2)",
    "day": "date",
    "at": "timestamp",
    "local_at": "timestamp_ntz",
    "tags": "array<string>",
    "days": "array<date>",
    "blob": "binary",
    "doc": "string",
}
HEADER = [(VALUE_SCHEMA_HEADER, msgspec.json.encode(TYPES))]
ROW = (
    b'{"id":1,"amount":12.5,"day":"2024-02-29","at":"2024-01-02T03:04:05.5Z",'
    b'"local_at":"2024-01-02T03:04:05.5","tags":["a",null],"days":["2024-01-01"],'
    b'"blob":"AP8=","doc":"{\\"k\\": 1}"}'
)


def raw(values: list[bytes], headers: list | None = None) -> pa.Table:
    """``values`` as a block of raw records, each with ``headers`` (the types' header)."""
    block = json_raw(values)
    field = block.schema.field("headers")
    at = block.column_names.index("headers")
    each = HEADER if headers is None else headers
    return block.set_column(at, field, pa.array([each] * len(values), field.type))


def test_new_columns_take_the_headers_types() -> None:
    block = decode_block(raw([ROW]), JSON, None)
    assert block.dead_letters.num_rows == 0
    rows = block.rows
    assert {n: rows.schema.field(n).type for n in TYPES} == {
        "id": pa.int32(),
        "amount": pa.decimal128(12, 2),
        "day": pa.date32(),
        "at": pa.timestamp("us", tz="UTC"),
        "local_at": pa.timestamp("us"),
        "tags": pa.list_(pa.string()),
        "days": pa.list_(pa.date32()),
        "blob": pa.binary(),
        "doc": pa.string(),
    }
    (row,) = rows.select(list(TYPES)).to_pylist()
    assert row == {
        "id": 1,
        "amount": decimal.Decimal("12.50"),
        "day": dt.date(2024, 2, 29),
        "at": dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=dt.UTC),
        "local_at": dt.datetime(2024, 1, 2, 3, 4, 5, 500000),
        "tags": ["a", None],
        "days": [dt.date(2024, 1, 1)],
        "blob": b"\x00\xff",
        "doc": '{"k": 1}',
    }


def test_without_the_header_columns_are_inferred_as_before() -> None:
    rows = decode_block(raw([ROW], headers=[]), JSON, None).rows
    assert rows.schema.field("amount").type == pa.float64()
    assert rows.schema.field("day").type == pa.timestamp("us", tz="UTC")  # iso_time's rule


def test_a_column_the_table_has_keeps_the_tables_type() -> None:
    """An ``ALTER TABLE ... TYPE`` at the source changes the header, not the lake column:
    values are parsed as the table's type, and one that does not fit is a dead letter."""
    first = decode_block(raw([ROW]), JSON, None).rows
    wider = {**TYPES, "id": "long", "amount": "decimal(14,4)"}
    header = [(VALUE_SCHEMA_HEADER, msgspec.json.encode(wider))]
    fits = ROW.replace(b'"amount":12.5', b'"amount":7.25')
    too_fine = ROW.replace(b'"amount":12.5', b'"amount":7.2501')
    block = decode_block(raw([fits, too_fine], headers=header), JSON, first.schema)
    assert block.rows.schema.field("id").type == pa.int32()
    assert block.rows.column("amount").to_pylist() == [decimal.Decimal("7.25")]
    (reason,) = block.dead_letters.column("reason").to_pylist()
    assert "decimal128(12, 2)" in reason and "7.2501" in reason


def test_a_value_that_does_not_convert_is_a_bad_record_not_a_null() -> None:
    bad_day = ROW.replace(b'"day":"2024-02-29"', b'"day":"infinity"')
    bad_blob = ROW.replace(b'"blob":"AP8="', b'"blob":"not base64!"')
    bad_list = ROW.replace(b'"days":["2024-01-01"]', b'"days":["2024-01-01","x"]')
    block = decode_block(raw([ROW, bad_day, bad_blob, bad_list]), JSON, None)
    assert block.rows.column("_kafka_offset").to_pylist() == [0]
    assert dead_letters_by_offset(block) == {
        1: "field 'day': not a date32[day]",
        2: "field 'blob': not a binary",
        3: "field 'days': not a list<item: date32[day]>",
    }


def test_the_first_shape_of_a_block_wins_and_a_bad_header_is_ignored() -> None:
    one = [(VALUE_SCHEMA_HEADER, b'{"a": "int"}')]
    two = [(VALUE_SCHEMA_HEADER, b'{"a": "string", "b": "date"}')]
    junk = [(VALUE_SCHEMA_HEADER, b"not json"), ("other", None)]
    headers = pa.array([one, two, junk, None], RAW_RECORD_SCHEMA.field("headers").type)
    assert hinted_schema(headers) == pa.schema([("a", pa.int32()), ("b", pa.date32())])
    assert hinted_schema(pa.array([junk], RAW_RECORD_SCHEMA.field("headers").type)) is None
