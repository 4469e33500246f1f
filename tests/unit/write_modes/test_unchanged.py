"""Values a change does not carry (``write_modes.unchanged``): marked when decoded, taken
from the round's earlier changes in the fold, then from the table's newest row of the key."""

from __future__ import annotations

import pyarrow as pa

from rayconnect.formats.rows import decode_block
from rayconnect.formats.settings import UNAVAILABLE_VALUE, RecordFormat
from rayconnect.protocol.unchanged_marker import unchanged_headers
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.write_modes.fold import DELETE_COLUMN, fold, is_change_column
from rayconnect.write_modes.unchanged import UNCHANGED_PREFIX, fill_from_table, mark

U_TEXT = UNCHANGED_PREFIX + "text"
U_TAGS = UNCHANGED_PREFIX + "tags"


def headers(*lists: list[str]) -> pa.Array:
    rows = [[{"key": k, "value": v} for k, v in unchanged_headers(names)] for names in lists]
    return pa.array(rows, RAW_RECORD_SCHEMA.field("headers").type)


def test_placeholders_and_the_header_become_nulls_with_marks() -> None:
    columns = pa.table(
        {
            "id": [1, 2, 3],
            "text": ["a", UNAVAILABLE_VALUE, "c"],
            "tags": pa.array([["x"], None, None], pa.list_(pa.string())),
        }
    )
    out, marks = mark(columns, headers([], [], ["tags"]), UNAVAILABLE_VALUE)
    assert out.column("text").to_pylist() == ["a", None, "c"]
    assert marks[U_TEXT].to_pylist() == [False, True, False]
    assert marks[U_TAGS].to_pylist() == [False, False, True]
    assert all(is_change_column(name) for name in marks)  # never a table column

    same, none = mark(columns.slice(0, 1), headers([]), UNAVAILABLE_VALUE)
    assert none == {} and same.equals(columns.slice(0, 1))
    _, unmarked = mark(columns, None, None)  # no placeholder, no headers: nothing
    assert unmarked == {}


def test_the_sink_marks_what_the_events_do_not_carry() -> None:
    """A Debezium update with the placeholder: the row's value null, its mark set."""
    fmt = RecordFormat(
        value_format="json",
        value_schema={"id": "long", "text": "string"},
        envelope="debezium",
        upsert_keys=("id",),
    )
    values = [
        b'{"op":"c","after":{"id":1,"text":"big"}}',
        b'{"op":"u","after":{"id":1,"text":"%s"}}' % UNAVAILABLE_VALUE.encode(),
    ]
    raw = pa.table(
        {
            "cluster": ["c", "c"],
            "topic": ["t", "t"],
            "partition": pa.array([0, 0], pa.int32()),
            "offset": pa.array([0, 1], pa.int64()),
            "timestamp": pa.array([0, 0], pa.timestamp("us", tz="UTC")),
            "key": pa.array([None, None], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": headers([], ["no_such_column"]),  # a name no column has: ignored
        },
        schema=RAW_RECORD_SCHEMA,
    )
    rows = decode_block(raw, fmt, None).rows
    assert rows.column("text").to_pylist() == ["big", None]
    assert rows.column(U_TEXT).to_pylist() == [False, True]
    folded = fold(rows, ["id"])  # the insert before it in the round carries the value
    assert folded.rows.column("text").to_pylist() == ["big"]
    assert not any(folded.rows.column(U_TEXT).to_pylist())


def changes(rows: list[tuple[int, int, str | None, bool, bool]]) -> pa.Table:
    """(id, offset, text, unchanged, delete)."""
    return pa.table(
        {
            "_kafka_partition": pa.array([0] * len(rows), pa.int32()),
            "_kafka_offset": pa.array([r[1] for r in rows], pa.int64()),
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "text": pa.array([r[2] for r in rows], pa.string()),
            U_TEXT: pa.array([r[3] for r in rows]),
            DELETE_COLUMN: pa.array([r[4] for r in rows]),
        }
    )


def test_the_fold_takes_the_latest_earlier_value_of_the_key() -> None:
    folded = fold(
        changes(
            [
                (1, 0, "v0", False, False),
                (1, 1, "v1", False, False),
                (1, 2, None, True, False),  # keeps v1, not v0
                (2, 3, None, True, False),  # nothing earlier in the round: the table's
                (3, 4, "x", False, False),
                (3, 5, None, False, True),  # deleted: no row to fill
            ]
        ),
        ["id"],
    )
    got = dict(zip(*(folded.rows.column(c).to_pylist() for c in ("id", "text")), strict=True))
    marks = dict(zip(*(folded.rows.column(c).to_pylist() for c in ("id", U_TEXT)), strict=True))
    assert got == {1: "v1", 2: None}
    assert marks == {1: False, 2: True}
    assert folded.deleted.column("id").to_pylist() == [3]


def test_the_rest_comes_from_the_tables_newest_row_of_the_key() -> None:
    rows = changes(
        [(1, 10, None, True, False), (2, 11, None, True, False), (3, 12, "n", False, False)]
    )
    rows = rows.drop_columns([DELETE_COLUMN])
    asked: list[list[int]] = []

    def current(keys: pa.Table, columns: list[str]) -> pa.Table:
        asked.append(keys.column("id").to_pylist())
        assert columns == ["text"]
        return pa.table(  # key 1: an old (deleted) row and its live one; key 2: none
            {
                "id": pa.array([1, 1], pa.int64()),
                "text": ["old", "live"],
                "tags": pa.array([["o"], ["l"]], pa.list_(pa.string())),  # (joins refuse lists)
                "_kafka_offset": pa.array([3, 7], pa.int64()),
            }
        )

    out = fill_from_table(rows, ["id"], current)
    assert asked == [[1, 2]]  # only the keys with a value to find
    assert out.column("text").to_pylist() == ["live", None, "n"]  # 2: not in the table
    assert U_TEXT not in out.column_names
