"""Debezium change events unwrapped into rows: each op, the schema/payload wrapper,
tombstones skipped, and every malformed event named with its reason."""

from __future__ import annotations

import json

import pyarrow as pa

from rayconnect.formats.debezium import unwrap


def _values(*events) -> pa.Array:
    return pa.array([None if e is None else json.dumps(e).encode() for e in events], pa.binary())


def test_each_op_gives_its_row_and_deletes_take_the_before_image():
    out = unwrap(
        _values(
            {"op": "c", "before": None, "after": {"id": 1, "v": "a"}},
            {"op": "r", "after": {"id": 2}},
            {"op": "u", "before": {"id": 1}, "after": {"id": 1, "v": "b"}},
            {"op": "d", "before": {"id": 2, "v": "x"}, "after": None},
        )
    )
    assert [json.loads(r) for r in out.rows.to_pylist()] == [
        {"id": 1, "v": "a"},
        {"id": 2},
        {"id": 1, "v": "b"},
        {"id": 2, "v": "x"},
    ]
    assert out.delete.to_pylist() == [False, False, False, True]
    assert out.bad == {} and out.skipped == frozenset()


def test_the_json_converters_schema_and_payload_wrapper_is_unwrapped_too():
    out = unwrap(
        _values({"schema": {"type": "struct"}, "payload": {"op": "d", "before": {"id": 9}}})
    )
    assert json.loads(out.rows[0].as_py()) == {"id": 9}
    assert out.delete.to_pylist() == [True]


def test_tombstones_are_skipped_and_bad_events_are_named():
    out = unwrap(
        _values(
            None,
            {"op": "d", "before": None},
            {"op": "c"},
            {"op": "x", "after": {"id": 1}},
            {"op": "t"},
            {"after": {"id": 1}},
            {"op": "m"},
        ).cast(pa.binary()),
        apply_truncate=False,
    )
    assert out.skipped == frozenset({0}) and out.truncate == frozenset()
    assert out.bad == {
        1: "debezium envelope: op 'd' without 'before'",
        2: "debezium envelope: op 'c' without 'after'",
        3: "debezium envelope: op must be one of c, r, u, d, not 'x'",
        4: "debezium envelope: op 't' (truncate/message) changes no row by key "
        "(truncate: dead_letter)",
        5: "debezium envelope: op must be one of c, r, u, d, not None",
        6: "debezium envelope: op 'm' (truncate/message) changes no row by key",
    }


def test_a_truncate_is_a_change_without_a_row_unless_dead_lettered():
    events = _values(
        {"op": "c", "after": {"id": 1}},
        {"schema": {}, "payload": {"op": "t", "before": None, "after": None}},
        {"op": "t"},
    )
    out = unwrap(events)
    assert out.truncate == frozenset({1, 2}) and out.bad == {}
    assert out.rows.to_pylist()[1:] == [None, None]
    assert out.delete.to_pylist() == [False, False, False]
    garbage = unwrap(pa.array([b"{not json"], pa.binary()))
    assert list(garbage.bad) == [0] and garbage.bad[0].startswith("debezium envelope: ")
    assert garbage.rows.to_pylist() == [None]
