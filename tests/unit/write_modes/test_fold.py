"""The fold's rules: last change per key in offset order, deletes win when last, and the
result equals applying every change one by one (checked against a dict on random streams)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayconnect.protocol.types import TopicPartition
from rayconnect.write_modes.fold import (
    DELETE_COLUMN,
    LSN_COLUMN,
    PARTITION_TRUNCATE_COLUMN,
    TRUNCATE_COLUMN,
    Folded,
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


# -- per-partition truncates (rayconnect's Postgres source: one marked copy per partition) --

Change = tuple[int, int, int | None, str | None, bool]  # partition, offset, key, value, marker


def _marked(rows: list[Change], topic: str = "t") -> pa.Table:
    """(partition, offset, key, value or None for a delete, per-partition truncate), of
    cluster "c" and ``topic``; no timestamps: a partition's truncate needs no order
    between partitions."""
    return (
        _changes([r[:4] for r in rows])
        .append_column("_kafka_cluster", pa.array(["c"] * len(rows)))
        .append_column("_kafka_topic", pa.array([topic] * len(rows)))
        .append_column(PARTITION_TRUNCATE_COLUMN, pa.array([r[4] for r in rows]))
    )


def _apply(table: dict[int, tuple[int, str]], folded: Folded) -> dict[int, tuple[int, str]]:
    """What the appliers do with a folded round (write_modes.delta_merge/iceberg_upsert), on
    a table of key -> (partition, value) - every row is of cluster "c", topic "t"."""
    if folded.truncated:
        table = {}
    gone = {tp.partition for tp in folded.truncated_partitions}
    table = {k: row for k, row in table.items() if row[0] not in gone}
    for key in folded.deleted.column("id").to_pylist():
        table.pop(key, None)
    for row in folded.rows.select(["id", "_kafka_partition", "v"]).to_pylist():
        table[row["id"]] = (row["_kafka_partition"], row["v"])
    return table


def test_a_partitions_truncate_removes_its_partitions_rows_and_its_earlier_changes_only():
    folded = fold(
        _marked(
            [
                (0, 1, 2, "p0-before", False),
                (1, 1, 1, "p1-before", False),  # another partition: untouched
                (0, 2, None, None, True),
                (0, 3, 4, "p0-after", False),
                (1, 2, 3, "p1-after", False),
            ]
        ),
        ["id"],
    )
    assert not folded.truncated
    assert folded.truncated_partitions == frozenset({TopicPartition("c", "t", 0)})
    assert _state(folded) == ({1: "p1-before", 3: "p1-after", 4: "p0-after"}, set())
    assert PARTITION_TRUNCATE_COLUMN not in folded.rows.column_names
    table = {5: (0, "old-p0"), 6: (1, "old-p1")}
    assert _apply(table, folded) == {
        6: (1, "old-p1"),
        1: (1, "p1-before"),  # (its partition's own truncate is still to come)
        3: (1, "p1-after"),
        4: (0, "p0-after"),
    }


def test_a_partitions_truncate_names_its_topic_and_a_later_delete_still_applies():
    changes = pa.concat_tables(
        [
            _marked([(0, 1, 1, "t-before", False), (0, 2, None, None, True)], topic="t"),
            _marked([(0, 1, 2, "u-same-partition", False)], topic="u"),  # another topic
            _marked([(0, 3, 3, None, False)], topic="t"),  # a delete after the truncate
        ]
    )
    folded = fold(changes, ["id"])
    assert folded.truncated_partitions == frozenset({TopicPartition("c", "t", 0)})
    assert _state(folded) == ({2: "u-same-partition"}, {3})


def test_a_partition_behind_by_a_round_ends_exact_either_way():
    """The case a single truncate event cannot get right (docs/guides/upserts.md): in
    Postgres, key 3 (partition 1) is inserted, then the table truncated, then keys 4
    (partition 0) and 5 (partition 1) inserted. Whichever partition is read a round
    later, the table ends as Postgres: {4, 5}."""
    table = {1: (0, "old"), 2: (1, "old")}
    p0 = [(0, 10, None, None, True), (0, 11, 4, "after", False)]
    p1 = [(1, 20, 3, "before", False), (1, 21, None, None, True), (1, 22, 5, "after", False)]
    for first, second in ((p0, p1), (p1, p0)):
        state = _apply(table, fold(_marked(first), ["id"]))
        state = _apply(state, fold(_marked(second), ["id"]))
        assert state == {4: (0, "after"), 5: (1, "after")}


def test_a_whole_table_truncate_beside_partition_truncates_empties_the_table():
    changes = (
        _marked(
            [
                (0, 1, 1, "a", False),
                (0, 2, None, None, True),
                (2, 1, None, None, False),  # a truncate without the marker (Debezium's)
                (1, 5, 2, "b", False),  # stamped after it
            ]
        )
        .append_column("_kafka_timestamp", pa.array([1, 2, 2, 3], pa.timestamp("ms")))
        .append_column(TRUNCATE_COLUMN, pa.array([False, False, True, False]))
    )
    folded = fold(changes, ["id"])
    assert folded.truncated and folded.truncated_partitions == frozenset()
    assert _state(folded) == ({2: "b"}, set())
    assert TRUNCATE_COLUMN not in folded.rows.column_names


def test_a_round_of_only_partition_truncates_without_key_columns():
    changes = _marked([(0, 4, None, None, True), (3, 9, None, None, True)])
    folded = fold(changes.drop_columns(["id", "v"]), ["id"])
    assert folded.rows.num_rows == 0 and folded.deleted.num_rows == 0
    assert folded.truncated_partitions == {TopicPartition("c", "t", 0), TopicPartition("c", "t", 3)}
    with pytest.raises(ValueError, match="_kafka_topic"):
        fold(changes.drop_columns(["_kafka_topic"]), ["id"])


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(
        st.one_of(
            st.tuples(st.integers(0, 7), st.sampled_from(["a", "b", None])),  # None: delete
            st.just(("truncate", None)),
        ),
        max_size=40,
    ),
    cuts=st.lists(st.lists(st.integers(0, 50), min_size=3, max_size=3), max_size=4),
)
def test_rounds_read_unevenly_end_as_the_history_with_partition_truncates(history, cuts):
    """A Postgres history over 8 keys in 3 partitions (key % 3), a TRUNCATE a copy in each;
    read in rounds that end anywhere in each partition (a reader ahead, one behind): the
    table ends as the history does."""
    partitions: list[list[Change]] = [[], [], []]
    truth: dict[int, str] = {}
    for key, value in history:
        if key == "truncate":
            truth.clear()
            for p, records in enumerate(partitions):
                records.append((p, len(records), None, None, True))
            continue
        p = key % 3
        partitions[p].append((p, len(partitions[p]), key, value, False))
        if value is None:
            truth.pop(key, None)
        else:
            truth[key] = value
    table: dict[int, tuple[int, str]] = {}
    read = [0, 0, 0]
    for cut in [*cuts, [50, 50, 50]]:  # the last round reads every partition to its end
        ends = [
            min(max(r, c), len(partitions[p]))
            for p, (r, c) in enumerate(zip(read, cut, strict=True))
        ]
        round_ = [x for p in range(3) for x in partitions[p][read[p] : ends[p]]]
        read = ends
        if round_:
            table = _apply(table, fold(_marked(round_), ["id"]))
    assert {k: v for k, (_, v) in table.items()} == truth
