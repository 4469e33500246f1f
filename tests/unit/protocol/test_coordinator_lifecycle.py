"""The coordinator's partition retirement (FLIP-246) and stop, as machine inputs."""

from __future__ import annotations

import pytest

from rayconnect.protocol.commit_state import RejectionKind
from rayconnect.protocol.coordinator import TRANSITIONS, Coordinator, State
from rayconnect.protocol.coordinator import Event as E
from rayconnect.protocol.effects import (
    Broadcast,
    CommitTable,
    Fenced,
    PartitionsRetired,
    ReloadTable,
    RoundDiscarded,
    RoundFinished,
    Stopped,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.messages import AckCommit, EndCommit, StartCommit, WriteStatus
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile

A, B = "c1/t/0", "c1/t/1"
CFG = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0)


def status(key: str, first: int, next_: int, txn: int = 1) -> WriteStatus:
    files = (DataFile(f"{key}/{txn}.parquet", 100, next_ - first),) if next_ > first else ()
    return WriteStatus(7, txn, key, files, first, next_, next_ - first)


def started() -> Coordinator:
    coord = Coordinator("pipe", {A, B}, CFG)
    coord.recover(7, {A: 10, B: 20}, now=0.0)
    return coord


def commit_round(coord: Coordinator, txn: int, now: float, a: int = 5) -> list[object]:
    """END (by the interval), both report (A moved ``a`` records), the commit lands: its
    effects but the ``RoundFinished`` it says so with."""
    coord.tick(now)
    start_a, start_b = coord.round.start_offsets[A], coord.round.start_offsets[B]  # type: ignore[union-attr]
    coord.step(status(A, start_a, start_a + a, txn), now)
    [commit] = coord.step(status(B, start_b, start_b, txn), now)
    assert isinstance(commit, CommitTable)
    ready = coord.commit_succeeded(version=txn, now=now)
    assert [e.version for e in ready if isinstance(e, RoundFinished)] == [txn]
    return [e for e in ready if not isinstance(e, RoundFinished)]


def test_a_partition_retired_mid_round_stays_until_that_round_is_committed() -> None:
    coord = started()
    assert coord.retire_partitions([B], now=1.0) == []
    assert coord.status().retiring == (B,)
    ack, retired, start = commit_round(coord, 1, now=10.0)
    assert isinstance(ack, Broadcast) and ack.to == (A, B)  # B's round is committed first
    assert retired == PartitionsRetired((B,))
    assert start == Broadcast(to=(A,), message=StartCommit(7, 2, {A: 15}))
    assert coord.status().partitions == (A,) and coord.status().retiring == ()


def test_a_partition_retired_after_end_waits_for_the_next_round() -> None:
    coord = started()
    coord.tick(10.0)  # END of txn 1 is out: what B reads next is not in it
    coord.retire_partitions([B], now=10.5)
    coord.step(status(A, 10, 15), now=11.0)
    [commit] = coord.step(status(B, 20, 20), now=11.0)
    ack, finished, start = coord.commit_succeeded(version=1, now=11.0)
    assert isinstance(finished, RoundFinished) and finished.version == 1
    assert isinstance(start, Broadcast) and start.to == (A, B)
    ack, retired, start = commit_round(coord, 2, now=21.0)
    assert retired == PartitionsRetired((B,)) and start.to == (A,)  # type: ignore[union-attr]


def test_an_empty_round_lets_a_retired_partition_go_and_a_discarded_one_does_not() -> None:
    coord = started()
    coord.retire_partitions([B], now=1.0)
    coord.tick(10.0)
    coord.step(status(A, 10, 10), now=11.0)
    discarded, reload = coord.tick(16.0)  # timed out, nothing to commit: discarded
    assert isinstance(discarded, RoundDiscarded) and reload == ReloadTable()
    [start] = coord.table_reloaded({A: 10, B: 20}, now=16.5)
    assert start.to == (A, B)  # type: ignore[union-attr]
    coord.tick(27.0)
    coord.step(status(A, 10, 10, txn=2), now=27.0)
    # Empty: no table was touched, so the epoch is confirmed before B's participant ends.
    assert coord.step(status(B, 20, 20, txn=2), now=27.0) == [
        RoundFinished(txn_id=2, version=None, files=0, duration_s=None, end_to_start_s=None),
        ReloadTable(),
    ]
    retired, start = coord.table_reloaded({A: 10, B: 20}, now=27.5, table_epoch=7)
    assert retired == PartitionsRetired((B,)) and start.to == (A,)  # type: ignore[union-attr]
    assert coord.status().rounds_empty == 1


def test_a_zombie_finishing_an_empty_round_retires_nobody_and_learns_it_is_fenced() -> None:
    coord = started()  # epoch 7
    coord.retire_partitions([B], now=1.0)
    coord.tick(10.0)
    coord.step(status(A, 10, 10), now=11.0)
    assert coord.step(status(B, 20, 20), now=11.0) == [
        RoundFinished(1, None, 0, None, None),
        ReloadTable(),
    ]
    [fenced] = coord.table_reloaded({A: 10, B: 20}, now=11.5, table_epoch=8)
    assert isinstance(fenced, Fenced) and coord.state is State.FENCED
    assert coord.status().partitions == (A, B)  # nobody's participant was ended


def test_a_stop_after_an_empty_round_with_a_retirement_due_just_stops() -> None:
    coord = started()
    coord.retire_partitions([B], now=1.0)
    coord.stop(commit=True, now=2.0)
    coord.step(status(A, 10, 10), now=2.5)
    assert coord.step(status(B, 20, 20), now=2.5) == [
        RoundFinished(1, None, 0, None, None),
        Stopped(),
    ]


def test_adding_a_retiring_partition_back_cancels_its_retirement() -> None:
    coord = started()
    coord.retire_partitions([B], now=1.0)
    coord.add_partitions([B, "c1/t/2"], now=2.0)
    ack, start = commit_round(coord, 1, now=10.0)
    assert isinstance(ack, Broadcast) and isinstance(start, Broadcast)
    assert start.to == (A, B, "c1/t/2")


def test_stop_with_commit_ends_the_running_round_and_reports_instead_of_starting() -> None:
    coord = started()
    [end] = coord.stop(commit=True, now=3.0)
    assert end == Broadcast(to=(A, B), message=EndCommit(7, 1))
    assert coord.state is State.LAST_ENDED
    coord.step(status(A, 10, 12), now=3.5)
    [commit] = coord.step(status(B, 20, 20), now=3.5)
    assert isinstance(commit, CommitTable) and coord.state is State.LAST_COMMITTING
    ack, finished, stopped = coord.commit_succeeded(version=1, now=4.0)
    assert finished == RoundFinished(1, 1, 1, 4.0, None)
    assert ack.message == AckCommit(7, 1, 1, {A: 12, B: 20})  # type: ignore[union-attr]
    assert stopped == Stopped() and coord.state is State.STOPPED
    assert coord.next_deadline() is None and coord.tick(100.0) == []
    assert coord.status().rounds_requested == 0


def test_stop_with_commit_of_an_empty_round_and_of_a_discarded_one() -> None:
    coord = started()
    coord.stop(commit=True, now=3.0)
    coord.step(status(A, 10, 10), now=3.5)
    assert coord.step(status(B, 20, 20), now=3.5) == [
        RoundFinished(1, None, 0, None, None),
        Stopped(),
    ]
    coord = started()
    coord.tick(10.0)
    coord.step(status(A, 10, 15), now=11.0)
    [commit] = coord.step(status(B, 20, 20), now=11.0)
    assert coord.stop(commit=True, now=11.5) == []  # waits for the commit under way
    # no reload, no round
    assert coord.commit_failed("timeout", now=12.0) == [RoundDiscarded(1, "timeout"), Stopped()]
    assert coord.status().rounds_discarded == 1


def test_stop_while_reloading_or_without_commit_is_done_at_once() -> None:
    coord = started()
    coord.tick(10.0)
    coord.tick(16.0)  # nobody reported: discarded, reloading
    assert coord.stop(commit=True, now=16.5) == [Stopped()]
    assert coord.table_reloaded({}, now=17.0) == []  # the reload under way changes nothing
    coord = started()
    coord.tick(10.0)
    assert coord.stop(commit=False, now=10.5) == [Stopped()]
    assert coord.step(status(A, 10, 15), now=11.0) == []
    idle = Coordinator("pipe", {A}, CFG)
    assert idle.stop(commit=True, now=0.0) == [Stopped()]
    assert idle.recover(7, {}, now=1.0) == []  # recovery that finished after the stop


def test_duplicate_status_is_a_typed_rejection_the_table_ignores() -> None:
    coord = started()
    coord.tick(10.0)
    coord.step(status(A, 10, 15), now=11.0)
    rejection = coord.round.rejection(status(A, 10, 16))  # type: ignore[union-attr]
    assert rejection is not None and rejection.kind is RejectionKind.DUPLICATE
    assert coord.step(status(A, 10, 16), now=11.0) == []
    assert (coord.status().messages_ignored, coord.status().statuses_rejected) == (1, 0)
    assert coord.step(status(B, 21, 22), now=11.0) == []  # wrong start: rejected, counted
    assert coord.status().statuses_rejected == 1
    assert "first_offset 21 != round start 20" in (coord.status().last_error or "")


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (State.STARTED, E.COMMIT_SUCCEEDED),
        (State.ENDED, E.TABLE_RELOADED),
        (State.COMMITTING, E.RECOVER),
        (State.IDLE, E.STATUS_DUPLICATE),  # no round: every message is STALE
        (State.STARTED, E.ROUND_HAS_DATA),  # a running round cannot be complete
    ],
)
def test_events_the_table_has_no_cell_for_raise(state: State, event: E) -> None:
    with pytest.raises(ProtocolError):
        TRANSITIONS.move(state, event)


def test_stale_messages_are_ignored_in_every_state() -> None:
    assert all(E.STALE in ignored for ignored in TRANSITIONS.ignored().values())
