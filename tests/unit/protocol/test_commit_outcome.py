"""How a failed or timed-out commit ended, judged from the table read after it (pure)."""

from __future__ import annotations

import pytest

from rayconnect.protocol.commit_outcome import (
    CommitEnd,
    CommitOutcome,
    FailedCommit,
    judge,
    late_line,
)

A, B, C = "local/orders/0", "local/orders/1", "local/orders/2"
STALE = "StaleEpochError: committed offsets changed since the round started (_coordinator: ...)"
TIMEOUT = "TimeoutError: no answer within write_timeout_s=20 s"
#: round 7 of epoch 1: A and B moved, C reported no records (its offset stays at 50)
COMMIT = FailedCommit(
    epoch=1,
    txn_id=7,
    expected={A: 100, B: None, C: 50},
    offsets={A: 120, B: 30, C: 50},
    error=TIMEOUT,
    timed_out=True,
)


def test_a_timed_out_commit_that_landed_was_committed_after_all() -> None:
    outcome = judge(COMMIT, {A: 120, B: 30, C: 50}, table_epoch=1)
    assert outcome == CommitOutcome(
        epoch=1,
        txn_id=7,
        ended=CommitEnd.COMMITTED_AFTER_ALL,
        error=TIMEOUT,
        timed_out=True,
        table_epoch=1,
        then="its records stay; the next round starts after them",
    )


def test_a_commit_whose_partitions_are_where_the_round_started_was_not_committed() -> None:
    """B had no offset in the table: absent still means not committed."""
    outcome = judge(COMMIT, {A: 100, C: 50}, table_epoch=1)
    assert outcome.ended is CommitEnd.NOT_COMMITTED
    assert outcome.then == "its records are read again from the table's offsets"


@pytest.mark.parametrize("table_offsets", [{A: 100}, {A: 120}, {A: 500}])
def test_a_zombies_commit_refused_by_the_fence(table_offsets: dict[str, int]) -> None:
    """A newer epoch in the table: refused as fenced, whatever the offsets say (the newer
    coordinator may have moved them anywhere)."""
    refused = FailedCommit(
        epoch=1, txn_id=9, expected={A: 100}, offsets={A: 120}, error=STALE, timed_out=False
    )
    assert judge(refused, table_offsets, table_epoch=2).ended is CommitEnd.REFUSED_AS_FENCED


@pytest.mark.parametrize(
    "commit,table_offsets,table_epoch,line",
    [
        (
            COMMIT,
            {A: 120, B: 30, C: 50},
            1,
            f"txn 7 of epoch 1: the commit timed out ({TIMEOUT}) and was committed after all "
            "(table epoch 1); its records stay; the next round starts after them",
        ),
        (
            FailedCommit(epoch=1, txn_id=9, expected={A: 100}, offsets={A: 120}, error=STALE),
            {A: 100},
            2,
            f"txn 9 of epoch 1: the commit failed ({STALE}) and was refused as fenced "
            "(table epoch 2); stopping: epoch 1 fenced by epoch 2",
        ),
    ],
)
def test_the_log_line_says_how_the_commit_ended_and_what_comes_next(
    commit: FailedCommit, table_offsets: dict[str, int], table_epoch: int, line: str
) -> None:
    assert judge(commit, table_offsets, table_epoch).line() == line


def test_some_partitions_moved_and_some_not_is_partly_committed() -> None:
    """A sink with routes commits each route table by itself."""
    outcome = judge(COMMIT, {A: 120, C: 50}, table_epoch=1)
    assert outcome.ended is CommitEnd.PARTLY_COMMITTED


def test_a_timed_out_commit_still_running_is_said_to_be_under_way_unless_it_landed() -> None:
    running = judge(COMMIT, {A: 100, C: 50}, table_epoch=1, still_running=True)
    assert running.ended is CommitEnd.STILL_RUNNING
    assert "compare-and-set fails" in running.then
    landed = judge(COMMIT, {A: 120, B: 30, C: 50}, table_epoch=1, still_running=True)
    assert landed.ended is CommitEnd.COMMITTED_AFTER_ALL
    fenced = judge(COMMIT, {A: 100}, table_epoch=3, still_running=True)
    assert fenced.ended is CommitEnd.REFUSED_AS_FENCED


def test_a_late_return_says_how_the_timed_out_commit_ended() -> None:
    assert late_line(COMMIT, 31.25, 42, None) == (
        "txn 7 of epoch 1: the commit that timed out returned after 31.2 s: it landed as version 42"
    )
    assert late_line(COMMIT, 25.0, None, STALE) == (
        f"txn 7 of epoch 1: the commit that timed out returned after 25.0 s: it raised {STALE}"
    )
