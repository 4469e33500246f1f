"""The offsets rule across many tables (``protocol.table_offsets``): restart from the
smallest, skip below a table's own, introduce a partition at the round's start."""

from __future__ import annotations

from rayconnect.protocol.table_offsets import (
    TableRound,
    restart_offsets,
    round_starts,
    table_round,
)

P, Q = "c/t/0", "c/t/1"


def test_a_partition_restarts_from_the_smallest_offset_among_its_tables() -> None:
    tables = {"a": {P: 100, Q: 7}, "b": {P: 40}}
    assert restart_offsets(tables, own={P: 120, "c/u/0": 9}) == {P: 40, Q: 7, "c/u/0": 9}
    assert restart_offsets({}, {}) == {}


def test_a_table_new_to_a_partition_gets_the_rounds_start_first() -> None:
    plan = table_round({}, [P], starts={P: 40}, ends={P: 90})
    assert plan == TableRound(introduce={P: 40}, expected={P: 40}, offsets={P: 90}, floors={})
    assert plan.moves


def test_after_a_recovery_a_table_ahead_skips_what_it_holds() -> None:
    # A committed round 40..100, B did not; the partition restarts at 40 and reads to 90
    a = table_round({P: 100}, [P], starts={P: 40}, ends={P: 90})
    assert a == TableRound(introduce={}, expected={P: 100}, offsets={P: 100}, floors={P: 100})
    assert not a.moves  # nothing new for A: no commit unless files remain
    b = table_round({P: 40}, [P], starts={P: 40}, ends={P: 90})
    assert b == TableRound(introduce={}, expected={P: 40}, offsets={P: 90}, floors={})
    # the next round reads 90..130: A takes from 100
    a = table_round({P: 100}, [P], starts={P: 90}, ends={P: 130})
    assert (a.offsets, a.floors) == ({P: 130}, {P: 100})


def test_a_partition_never_committed_starts_where_its_participant_began() -> None:
    assert round_starts({P: None, Q: 5}, {P: 12, Q: 5}) == {P: 12, Q: 5}


def test_a_partition_the_round_moved_without_a_record_moves_every_table_holding_it() -> None:
    """Commit markers, an aborted tail: the round's end is past a table's offset, and no
    file of the round holds the partition - the tables that have it move (a caught-up
    table shows lag 0); a partition with rows moves only the tables its rows went to."""
    from rayconnect.protocol.table_offsets import idle_partitions

    tables = {"a": {"c/t/0": 10, "c/t/1": 5}, "b": {"c/t/0": 10}, "c": {"c/t/2": 3}}
    ends = {"c/t/0": 12, "c/t/1": 9, "c/t/2": 3}
    assert idle_partitions(tables, ["c/t/1"], ends) == {"a": {"c/t/0"}, "b": {"c/t/0"}}
    assert idle_partitions(tables, ["c/t/0", "c/t/1"], ends) == {}
    assert idle_partitions(tables, [], {"c/t/9": 1}) == {}  # not in the round: nothing
