"""The rule that makes an inferred JSON column of ISO-8601 strings a timestamp column
(``formats.iso_time``): exact values, the forms it takes and refuses, and that the column's
type, once in the table, parses the same values in later rounds (no flapping)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from rayconnect.formats.iso_time import as_timestamps
from rayconnect.formats.json import JsonDecoder
from rayconnect.formats.types import TIMESTAMP

UTC = dt.UTC


def _decode(values: list[bytes | None], table: pa.Schema | None = None):  # noqa: ANN202
    return JsonDecoder().decode(pa.array(values, pa.binary()), table)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2024-05-01T12:00:00.123Z", dt.datetime(2024, 5, 1, 12, 0, 0, 123000, UTC)),
        ("2024-05-01T12:00:00.123456+02:00", dt.datetime(2024, 5, 1, 10, 0, 0, 123456, UTC)),
        ("2024-05-01 12:00:00.5", dt.datetime(2024, 5, 1, 12, 0, 0, 500000, UTC)),
        ("2024-05-01T12:00:00-0530", dt.datetime(2024, 5, 1, 17, 30, tzinfo=UTC)),
        ("2024-05-01T12:00+01", dt.datetime(2024, 5, 1, 11, 0, tzinfo=UTC)),
        ("2024-05-01T12:00:00", dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)),
        ("2024-05-01", dt.datetime(2024, 5, 1, tzinfo=UTC)),
    ],
)
def test_iso_forms_become_utc_microseconds(text: str, want: dt.datetime) -> None:
    got = as_timestamps(pa.array([text, None]))
    assert got is not None and got.type == TIMESTAMP
    assert got.to_pylist() == [want, None]


@pytest.mark.parametrize(
    "text",
    [
        "2024-05-01T12:00:00.123456789Z",  # ns: more than the table's µs
        "2024-02-30T12:00:00",  # not a calendar day
        "2024-05-01t12:00:00",
        "2024-5-01T12:00:00",
        "20240501T120000",
        "2024-05-01Z",
        "12:00:00",
        "soon",
    ],
)
def test_other_strings_keep_the_column_a_string(text: str) -> None:
    assert as_timestamps(pa.array(["2024-05-01T12:00:00Z", text])) is None


def test_an_inferred_column_with_fractional_seconds_is_a_timestamp_nested_too() -> None:
    decoded = _decode(
        [
            b'{"ts": "2024-05-01T12:00:00.250Z", "at": {"t": "2024-05-01 10:00:00"}, '
            b'"seen": ["2024-05-01T00:00:00+02:00"], "note": "2024-05-01T12:00:00Z"}',
            b'{"ts": "2024-05-01T12:00:01+01:00", "note": "not a time"}',
            None,
        ]
    )
    columns = decoded.columns
    assert columns.schema.field("ts").type == TIMESTAMP
    assert columns.schema.field("at").type == pa.struct([pa.field("t", TIMESTAMP)])
    assert columns.schema.field("seen").type == pa.list_(TIMESTAMP)
    assert columns.schema.field("note").type == pa.string()  # one value is not a time
    assert columns.column("ts").to_pylist() == [
        dt.datetime(2024, 5, 1, 12, 0, 0, 250000, UTC),
        dt.datetime(2024, 5, 1, 11, 0, 1, tzinfo=UTC),
        None,
    ]
    assert columns.column("seen").to_pylist()[0] == [dt.datetime(2024, 4, 30, 22, 0, tzinfo=UTC)]


def test_the_decision_holds_in_later_rounds_and_in_a_block_with_a_bad_record() -> None:
    # round 1: whole seconds and fractions mixed (Arrow alone would infer a string)
    first = _decode([b'{"ts": "2024-05-01T12:00:00"}', b'{"ts": "2024-05-01T12:00:00.5Z"}'])
    table = first.columns.schema
    assert table.field("ts").type == TIMESTAMP
    # round 2: the table's type steers the parser; every form the rule took parses again
    later = _decode(
        [b'{"ts": "2024-05-01T12:00:00.123456-01:00"}', b'{"ts": "2024-05-01"}', b"{oops"],
        table,
    )
    assert later.columns.column("ts").to_pylist() == [
        dt.datetime(2024, 5, 1, 13, 0, 0, 123456, UTC),
        dt.datetime(2024, 5, 1, tzinfo=UTC),
    ]
    assert list(later.bad) == [2]
    # a string column stays one: timestamps arriving later are its strings
    strings = _decode([b'{"s": "x"}']).columns.schema
    again = _decode([b'{"s": "2024-05-01T12:00:00.5Z"}'], strings)
    assert again.columns.column("s").to_pylist() == ["2024-05-01T12:00:00.5Z"]


def test_a_bad_record_does_not_split_the_decision_between_pieces() -> None:
    """The error path parses pieces of the block apart: one piece of whole seconds (Arrow:
    timestamp) and one with fractions (Arrow: string) must not conflict."""
    decoded = _decode(
        [b'{"ts": "2024-05-01T12:00:00"}'] * 4
        + [b"{bad"]
        + [b'{"ts": "2024-05-01T12:00:00.1"}'] * 3
    )
    assert decoded.bad.keys() == {4}
    assert decoded.columns.schema.field("ts").type == TIMESTAMP
    assert decoded.columns.num_rows == 7
