"""Checking and encoding what a SourceTask's poll() returns (source/base.py)."""

from __future__ import annotations

import json

import pytest

import rayconnect as rc
from rayconnect.source_tasks.base import (
    DEAD_LETTER_MAX_VALUE,
    BadRecord,
    dead_letter,
    encode_record,
)


def test_a_good_record_encodes_value_key_and_headers() -> None:
    record = rc.SourceRecord("t", {"a": 1}, key="k", headers=[("h", b"v")], source_offset=3)
    assert encode_record(record) == (b'{"a":1}', b"k", [("h", b"v")])
    assert encode_record(rc.SourceRecord("t", b"raw")) == (b"raw", None, None)
    assert encode_record(rc.SourceRecord("t", b"raw", every_partition=True)) == (b"raw", None, None)


@pytest.mark.parametrize(
    "record, why",
    [
        (rc.SourceRecord("bad/topic", "v"), "invalid topic"),
        (rc.SourceRecord("t", object()), "cannot encode as JSON"),
        (rc.SourceRecord("t", "v", key={1, object()}), "cannot encode as JSON"),
        (rc.SourceRecord("t", "v", headers=[("h", "not bytes")]), "a header must be"),
        (rc.SourceRecord("t", "v", partition=-1), "partition must be"),
        (rc.SourceRecord("t", "v", partition=1, every_partition=True), "give one of them"),
        ({"topic": "t", "value": 1}, "not a rayconnect.SourceRecord"),
    ],
)
def test_a_bad_record_is_named_with_the_reason(record: object, why: str) -> None:
    with pytest.raises(BadRecord, match=why) as e:
        encode_record(record)
    if isinstance(record, rc.SourceRecord):
        assert repr(record.topic) in str(e.value)


def test_a_dead_letter_keeps_what_it_can_and_says_why_and_where_from() -> None:
    record = rc.SourceRecord(
        "t", {"x": object()}, key="k", source_partition={"f": "a"}, source_offset=7
    )
    value, key, headers = dead_letter(record, "boom")
    assert value is not None and value.startswith(b"{'x': <object")  # its repr
    assert key == b"k"
    h = dict(headers)  # type: ignore[arg-type]
    assert h["rayconnect.error"] == b"boom"
    origin = json.loads(h["rayconnect.origin"])  # type: ignore[arg-type]
    assert origin == {"topic": "t", "source_partition": {"f": "a"}, "source_offset": 7}


def test_a_dead_letter_of_a_huge_value_is_truncated_and_says_its_size() -> None:
    value, _, headers = dead_letter(rc.SourceRecord("t", b"x" * 2_000_000), "too large")
    assert value == b"x" * DEAD_LETTER_MAX_VALUE
    assert dict(headers)["rayconnect.value_bytes"] == b"2000000"  # type: ignore[arg-type]
