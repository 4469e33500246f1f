"""The fold's rules: last change per key in offset order, deletes win when last, and the
result equals applying every change one by one (checked against a dict on random streams)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayconnect.write_modes.fold import (
    DELETE_COLUMN,
    LSN_COLUMN,
    TRUNCATE_COLUMN,
    fold,
    missing_key,
)


def _changes(rows: list[tuple[int, int, int, str | None]]) -> pa.Table:
    """(partition, offset, key, value or None for a delete)."""
    return pa.table(
        {
            "_kafka_partition": pa.array([r[0] for r in rows], pa.int32()),
            "_kafka_offset": pa.array([r[1] for r in rows], pa.int64()),
            "id": pa.array([r[2] for r in rows], pa.int64()),
            "v": pa.array([r[3] for r in rows], pa.string()),
            DELETE_COLUMN: pa.array([r[3] is None for r in rows], pa.bool_()),
        }
    )


def _state(folded) -> tuple[dict[int, str], set[int]]:
    rows = dict(
        zip(folded.rows.column("id").to_pylist(), folded.rows.column("v").to_pylist(), strict=True)
    )
    return rows, set(folded.deleted.column("id").to_pylist())


def test_last_change_of_a_key_wins_in_offset_order_not_arrival_order():
    folded = fold(
        _changes([(0, 7, 1, "c"), (0, 5, 1, "a"), (0, 6, 1, "b"), (0, 1, 2, "x")]), ["id"]
    )
    assert _state(folded) == ({1: "c", 2: "x"}, set())
    assert DELETE_COLUMN not in folded.rows.column_names


def test_a_delete_after_an_insert_leaves_only_the_delete_and_an_insert_after_a_delete_the_row():
    folded = fold(
        _changes([(0, 1, 1, "a"), (0, 2, 1, None), (0, 3, 2, None), (0, 4, 2, "b")]), ["id"]
    )
    assert _state(folded) == ({2: "b"}, {1})


def test_a_key_in_two_partitions_takes_the_highest_partition_deterministically():
    folded = fold(_changes([(3, 1, 1, "from-3"), (1, 99, 1, "from-1")]), ["id"])
    assert _state(folded) == ({1: "from-3"}, set())


def test_an_empty_round_folds_to_nothing_and_missing_columns_are_named():
    folded = fold(_changes([]), ["id"])
    assert folded.rows.num_rows == 0 and folded.deleted.num_rows == 0
    with pytest.raises(ValueError, match="'name'"):
        fold(_changes([(0, 1, 1, "a")]), ["name"])


def test_changes_without_a_key_are_found_for_the_dead_letter_table():
    table = pa.table({"id": [1, None, 3], "k2": ["a", "b", None]})
    assert missing_key(table, ["id"]).to_pylist() == [False, True, False]
    assert missing_key(table, ["id", "k2"]).to_pylist() == [False, True, True]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 9), st.one_of(st.none(), st.text(max_size=2))),
        max_size=60,
    )
)
def test_the_fold_equals_applying_every_change_in_order(stream):
    # one partition per key (Kafka's keying): partition = key % 3; offsets ascend per partition
    offsets = {0: 0, 1: 0, 2: 0}
    rows, table_before = [], {5: "old", 6: "old"}
    for _, key, value in stream:
        p = key % 3
        offsets[p] += 1
        rows.append((p, offsets[p], key, value))
    expected = dict(table_before)
    for _, _, key, value in sorted(rows, key=lambda r: (r[0], r[1])):
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    folded_rows, deleted = _state(fold(_changes(rows), ["id"]))
    applied = {k: v for k, v in table_before.items() if k not in deleted and k not in folded_rows}
    applied.update(folded_rows)
    assert applied == expected
    assert not (set(folded_rows) & deleted)


# -- truncate: removes the table's rows and the round's changes before it ---------------


def _with_truncates(rows: list[tuple[int, int, int | None, str | None, int, bool]]) -> pa.Table:
    """(partition, offset, key, value or None for a delete, timestamp ms, truncate)."""
    return (
        _changes([r[:4] for r in rows])
        .append_column("_kafka_timestamp", pa.array([r[4] for r in rows], pa.timestamp("ms")))
        .append_column(TRUNCATE_COLUMN, pa.array([r[5] for r in rows]))
    )


def test_a_truncate_keeps_only_its_partitions_later_changes_by_offset():
    folded = fold(
        _with_truncates(
            [
                (0, 1, 1, "before", 10, False),
                (0, 2, 2, "before", 10, False),
                (0, 3, None, None, 10, True),  # the truncate: same ms as the changes around it
                (0, 4, 2, "after", 10, False),
                (0, 5, 3, None, 10, False),  # a delete after it: nothing left to delete
            ]
        ),
        ["id"],
    )
    assert folded.truncated
    assert _state(folded) == ({2: "after"}, {3})
    assert TRUNCATE_COLUMN not in folded.rows.column_names


def test_other_partitions_are_ordered_against_a_truncate_by_timestamp_ties_kept():
    folded = fold(
        _with_truncates(
            [
                (1, 7, 11, "earlier", 99, False),  # stamped before the truncate: removed
                (2, 3, 12, "same-ms", 100, False),  # a tie: kept (it may follow it)
                (0, 9, None, None, 100, True),
                (1, 8, 13, "later", 101, False),
                (0, 2, 14, "old", 150, False),  # its own partition goes by offset: removed
            ]
        ),
        ["id"],
    )
    assert folded.truncated
    assert _state(folded) == ({12: "same-ms", 13: "later"}, set())


def test_two_truncates_each_remove_what_precedes_them():
    folded = fold(
        _with_truncates(
            [
                (0, 1, 1, "a", 10, False),
                (0, 2, None, None, 11, True),
                (1, 1, 2, "b", 12, False),
                (0, 3, None, None, 13, True),
                (1, 2, 3, "c", 14, False),
            ]
        ),
        ["id"],
    )
    assert _state(folded) == ({3: "c"}, set())


def test_a_round_of_only_a_truncate_empties_the_table_even_without_key_columns():
    changes = _with_truncates([(0, 4, None, None, 10, True)]).drop_columns(["id", "v"])
    folded = fold(changes, ["id"])
    assert folded.truncated and folded.rows.num_rows == 0 and folded.deleted.num_rows == 0
    assert fold(_with_truncates([(0, 1, 1, "a", 1, False)]), ["id"]).truncated is False


def test_a_truncate_cannot_be_ordered_without_timestamps():
    changes = _with_truncates([(0, 1, None, None, 1, True)]).drop_columns(["_kafka_timestamp"])
    with pytest.raises(ValueError, match="_kafka_timestamp"):
        fold(changes, ["id"])


def test_other_partitions_go_by_the_sources_lsn_where_both_events_have_one():
    changes = _with_truncates(
        [
            (1, 1, 21, "lsn-before", 500, False),  # stamped later, but committed before it
            (0, 5, None, None, 400, True),
            (1, 2, 22, "lsn-same", 300, False),  # the truncating transaction's own: kept
            (2, 1, 23, "no-lsn", 399, False),  # no LSN: by its timestamp, before it
        ]
    ).append_column(LSN_COLUMN, pa.array([90, 100, 100, None], pa.int64()))
    folded = fold(changes, ["id"])
    assert _state(folded) == ({22: "lsn-same"}, set())
    assert LSN_COLUMN not in folded.rows.column_names
    untouched = fold(changes.filter(pa.array([True, False, True, True])), ["id"])
    assert not untouched.truncated and LSN_COLUMN not in untouched.rows.column_names
