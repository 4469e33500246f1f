"""Example-based tests of the coordinator's transitions (protocol/coordinator.py)."""

from __future__ import annotations

import pytest

from rayconnect.protocol.coordinator import TRANSITIONS, Coordinator, State
from rayconnect.protocol.effects import (
    Broadcast,
    CommitTable,
    Fenced,
    ReloadTable,
    RoundDiscarded,
    RoundFinished,
    SendMessage,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.messages import (
    AckCommit,
    Drained,
    EndCommit,
    ParticipantStarted,
    RequestCommit,
    RoundLost,
    StartCommit,
    WriteStatus,
)
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile

A, B = "c1/t/0", "c1/t/1"
CFG = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0)


def status(
    key: str, first: int, next_: int, *, epoch: int = 7, txn: int = 1, files: int = 1
) -> WriteStatus:
    data = tuple(DataFile(f"{key}/f{i}.parquet", 100, 1) for i in range(files))
    return WriteStatus(epoch, txn, key, data if next_ > first else (), first, next_, next_ - first)


def started(offsets: dict[str, int] | None = None) -> Coordinator:
    coord = Coordinator("pipe", {A, B}, CFG)
    coord.recover(7, {A: 10, B: 20} if offsets is None else offsets, now=0.0)
    return coord


def ended() -> Coordinator:
    coord = started()
    coord.tick(10.0)
    return coord


def test_recover_broadcasts_start_of_txn_1_with_the_table_offsets() -> None:
    coord = Coordinator("pipe", {A, B}, CFG)
    ready = coord.recover(7, {A: 10, "c1/gone/0": 3}, now=0.0)
    assert ready == [Broadcast(to=(A, B), message=StartCommit(7, 1, {A: 10}))]
    assert (coord.state, coord.epoch, coord.txn_id) == (State.STARTED, 7, 1)


def test_commit_interval_ends_the_round() -> None:
    coord = started()
    assert coord.tick(9.9) == []
    assert coord.next_deadline() == 10.0
    assert coord.tick(10.0) == [Broadcast(to=(A, B), message=EndCommit(7, 1))]
    assert coord.state is State.ENDED


def test_request_commit_ends_the_round_early_and_stale_requests_are_ignored() -> None:
    coord = started()
    assert coord.step(RequestCommit(7, 0, A), now=1.0) == []  # older txn
    assert coord.step(RequestCommit(7, 1, "c1/other/0"), now=1.0) == []  # unknown partition
    assert coord.state is State.STARTED
    assert coord.step(RequestCommit(7, 1, A), now=1.0) == [
        Broadcast(to=(A, B), message=EndCommit(7, 1))
    ]
    assert coord.state is State.ENDED


def test_a_backlog_drained_over_many_partitions_ends_the_round() -> None:
    """commit_when_drained, judged pipeline-wide: no partition read a flush's worth, but
    their DRAINED reports within one interval add up to one - a backlog spread thin."""
    cfg = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0, flush_max_records=100)
    coord = Coordinator("pipe", {A, B}, cfg)
    coord.recover(7, {A: 10, B: 20}, now=0.0)
    assert coord.step(Drained(A, 60, 600), now=1.0) == []
    assert coord.step(Drained("c1/other/0", 60, 600), now=1.5) == []  # not ours: stale
    assert coord.step(Drained(B, 40, 400), now=2.0) == [
        Broadcast(to=(A, B), message=EndCommit(7, 1))
    ]
    assert (coord.state, coord.status().rounds_drained) == (State.ENDED, 1)


def test_drained_reports_expire_after_an_interval_so_steady_traffic_keeps_the_pacing() -> None:
    cfg = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0, flush_max_bytes=1000)
    coord = Coordinator("pipe", {A, B}, cfg)
    coord.recover(7, {A: 10, B: 20}, now=0.0)
    coord.step(Drained(A, 5, 600), now=1.0)
    coord.tick(10.0)  # the interval ended round 1
    coord.step(status(A, 10, 15), now=10.5)
    coord.step(status(B, 20, 20), now=10.5)
    coord.commit_succeeded(version=1, now=11.0)
    assert coord.step(Drained(B, 5, 500), now=12.0) == []  # A's 600 B expired at 11
    assert coord.state is State.STARTED
    assert coord.step(Drained(A, 5, 500), now=13.0) != []  # 1000 B within 10 s
    assert coord.state is State.ENDED


def test_a_backlog_drained_while_a_round_is_written_ends_the_next_round_at_its_start() -> None:
    """What the participants read ahead while round 1 was written is round 2's data: if it
    finished a backlog, round 2 ends right after its START instead of waiting the interval."""
    cfg = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0, flush_max_records=100)
    coord = Coordinator("pipe", {A, B}, cfg)
    coord.recover(7, {A: 10, B: 20}, now=0.0)
    coord.step(Drained(A, 100, 1), now=1.0)  # ends round 1
    coord.step(status(A, 10, 110), now=1.5)
    assert coord.step(Drained(B, 30, 1), now=1.6) == []  # read ahead; round 1 still ENDED
    [commit] = coord.step(status(B, 20, 20), now=1.7)
    assert isinstance(commit, CommitTable)
    assert coord.commit_succeeded(version=1, now=2.0) == [
        Broadcast(to=(A, B), message=AckCommit(7, 1, 1, {A: 110, B: 20})),
        RoundFinished(txn_id=1, version=1, files=1, duration_s=2.0, end_to_start_s=1.0),
        Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 110, B: 20})),
        Broadcast(to=(A, B), message=EndCommit(7, 2)),
    ]
    # nothing drained since: round 3 waits for a report or the interval
    coord.step(status(A, 110, 110, txn=2), now=2.5)
    coord.step(status(B, 20, 50, txn=2), now=2.5)
    assert coord.commit_succeeded(version=2, now=3.0)[-1] == Broadcast(
        to=(A, B), message=StartCommit(7, 3, {A: 110, B: 50})
    )
    assert coord.state is State.STARTED and coord.status().rounds_drained == 2


def test_a_backlog_drained_while_a_discarded_round_was_written_ends_the_next_round() -> None:
    """Same after a round whose commit failed: the retried round starts from the table's
    offsets and, with a flush's worth read meanwhile, ends right after its START."""
    cfg = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0, flush_max_records=100)
    coord = Coordinator("pipe", {A, B}, cfg)
    coord.recover(7, {A: 10, B: 20}, now=0.0)
    coord.step(Drained(A, 100, 1), now=1.0)  # ends round 1
    coord.step(status(A, 10, 110), now=1.5)
    coord.step(status(B, 20, 20), now=1.7)
    assert coord.step(Drained(B, 100, 1), now=1.8) == []  # while round 1 is committed
    assert coord.commit_failed("conflict", now=2.0) == [
        RoundDiscarded(1, "conflict"),
        ReloadTable(),
    ]
    assert coord.table_reloaded({A: 10, B: 20}, now=2.5) == [
        Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 10, B: 20})),
        Broadcast(to=(A, B), message=EndCommit(7, 2)),
    ]
    assert coord.status().rounds_drained == 2


def test_all_reported_commits_then_ack_and_next_start() -> None:
    coord = ended()
    assert coord.step(status(A, 10, 15), now=11.0) == []
    [commit] = coord.step(status(B, 20, 20), now=11.5)
    assert isinstance(commit, CommitTable)
    assert commit.epoch == 7 and commit.txn_id == 1
    assert commit.expected == {A: 10, B: 20}
    assert commit.offsets == {A: 15, B: 20}
    assert [f.path for f in commit.files] == ["c1/t/0/f0.parquet"]
    assert commit.metadata.pipeline == "pipe"
    assert commit.metadata.partial is False
    assert coord.state is State.COMMITTING
    ready = coord.commit_succeeded(version=42, now=12.0)
    assert ready == [
        Broadcast(to=(A, B), message=AckCommit(7, 1, 42, {A: 15, B: 20})),
        RoundFinished(txn_id=1, version=42, files=1, duration_s=12.0, end_to_start_s=2.0),
        Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 15, B: 20})),
    ]
    s = coord.status()
    assert (s.rounds_committed, s.last_round_duration_s, s.offsets) == (1, 12.0, {A: 15, B: 20})


def test_the_next_interval_counts_from_the_previous_end_not_the_next_start() -> None:
    """Participants read ahead from END on, so ENDs are commit_interval_s apart however
    long writing and committing took (here 3 s), as long as it took less than that."""
    coord = ended()  # END at 10
    coord.step(status(A, 10, 15), now=11.0)
    coord.step(status(B, 20, 20), now=11.0)
    coord.commit_succeeded(version=1, now=13.0)  # START of txn 2 at 13
    assert coord.next_deadline() == 20.0
    assert coord.tick(20.0) == [Broadcast(to=(A, B), message=EndCommit(7, 2))]
    coord.step(status(A, 15, 15, txn=2), now=20.5)
    coord.step(status(B, 20, 20, txn=2), now=20.5)  # empty round: txn 3 at once
    assert coord.txn_id == 3
    assert coord.next_deadline() == 30.0


def test_after_a_discarded_round_the_interval_counts_from_the_start() -> None:
    coord = ended()
    coord.step(status(A, 10, 15), now=11.0)
    coord.step(status(B, 20, 20), now=11.0)
    coord.commit_failed("conflict", now=12.0)
    coord.table_reloaded({A: 10, B: 20}, now=13.0, table_epoch=7)
    assert coord.next_deadline() == 23.0


def test_partition_without_table_offset_expects_none_and_any_start() -> None:
    coord = started(offsets={A: 10})
    coord.tick(10.0)
    coord.step(status(A, 10, 10), now=10.0)
    [commit] = coord.step(status(B, 3, 8), now=10.0)
    assert isinstance(commit, CommitTable)
    assert commit.expected == {A: 10, B: None}
    assert commit.offsets == {A: 10, B: 8}


def test_a_round_where_nothing_moved_is_not_committed() -> None:
    coord = ended()
    coord.step(status(A, 10, 10), now=11.0)
    ready = coord.step(status(B, 20, 20), now=11.0)
    assert ready == [
        RoundFinished(txn_id=1, version=None, files=0, duration_s=None, end_to_start_s=1.0),
        Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 10, B: 20})),
    ]
    assert coord.status().rounds_empty == 1


def test_timeout_commits_the_partitions_that_reported_partially() -> None:
    coord = ended()
    coord.step(status(A, 10, 15), now=11.0)
    assert coord.tick(14.9) == []
    assert coord.status().waiting_for == (B,)
    [commit] = coord.tick(15.0)
    assert isinstance(commit, CommitTable)
    assert commit.expected == {A: 10} and commit.offsets == {A: 15}
    assert commit.metadata.partial is True
    ack, finished, start = coord.commit_succeeded(version=3, now=16.0)
    assert finished == RoundFinished(1, 3, 1, 16.0, 6.0)
    assert ack == Broadcast(to=(A, B), message=AckCommit(7, 1, 3, {A: 15, B: 20}))
    assert start == Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 15, B: 20}))
    assert coord.status().rounds_partial == 1


def test_timeout_without_data_discards_the_round_and_restarts_from_the_table() -> None:
    coord = ended()
    coord.step(status(A, 10, 10), now=11.0)
    [discarded, reload] = coord.tick(15.0)
    assert discarded == RoundDiscarded(1, f"txn 1: no data from {[A]}, timed out waiting for {[B]}")
    assert reload == ReloadTable()
    assert coord.state is State.RELOADING
    assert coord.status().rounds_discarded == 1
    ready = coord.table_reloaded({A: 10, B: 20}, now=15.1, table_epoch=7)
    assert ready == [Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 10, B: 20}))]


def test_a_zombie_whose_participants_left_learns_it_is_fenced_on_timeout() -> None:
    coord = ended()  # no participant answers: they follow a newer coordinator
    assert coord.tick(15.0)[-1] == ReloadTable()
    assert coord.table_reloaded({A: 10, B: 20}, now=15.1, table_epoch=8) == [
        Fenced(epoch=7, table_epoch=8)
    ]
    assert coord.state is State.FENCED


@pytest.mark.parametrize(
    "bad",
    [
        status(A, 10, 15, epoch=6),  # older epoch (I3)
        status(A, 10, 15, txn=2),  # another txn
        status("c1/other/0", 0, 5),  # unknown partition
    ],
)
def test_status_of_another_round_or_partition_is_ignored(bad: WriteStatus) -> None:
    coord = ended()
    assert coord.step(bad, now=11.0) == []
    assert coord.step(status(B, 20, 20), now=11.0) == []  # still waiting for A
    assert coord.status().waiting_for == (A,)


@pytest.mark.parametrize(
    "bad", [status(A, 9, 15), status(A, 10, 9), WriteStatus(7, 1, A, (), 10, 10, -1)]
)
def test_invalid_status_is_rejected_and_counts_as_not_reported(bad: WriteStatus) -> None:
    coord = ended()
    assert coord.step(bad, now=11.0) == []
    assert coord.status().statuses_rejected == 1
    assert coord.status().waiting_for == (A, B)


def test_duplicate_status_is_ignored_first_one_counts() -> None:
    coord = ended()
    coord.step(status(A, 10, 15), now=11.0)
    assert coord.step(status(A, 10, 16), now=11.0) == []
    [commit] = coord.step(status(B, 20, 20), now=11.0)
    assert isinstance(commit, CommitTable) and commit.offsets[A] == 15


def test_status_before_end_is_ignored() -> None:
    coord = started()
    assert coord.step(status(A, 10, 15), now=1.0) == []
    assert coord.status().messages_ignored == 1


def test_commit_failed_reloads_the_table_and_starts_over_with_a_new_txn() -> None:
    coord = ended()
    coord.step(status(A, 10, 15), now=11.0)
    coord.step(status(B, 20, 20), now=11.0)
    assert coord.commit_failed("conflict", now=12.0) == [
        RoundDiscarded(1, "conflict"),
        ReloadTable(),
    ]
    assert coord.state is State.RELOADING
    assert coord.step(status(A, 10, 15), now=12.0) == []  # late: ignored
    ready = coord.table_reloaded({A: 15, B: 20}, now=13.0, table_epoch=7)
    assert ready == [Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 15, B: 20}))]
    assert coord.status().rounds_discarded == 1


def test_reload_showing_a_newer_epoch_fences_the_coordinator() -> None:
    coord = ended()
    coord.step(status(A, 10, 15), now=11.0)
    coord.step(status(B, 20, 20), now=11.0)
    coord.commit_failed("stale epoch", now=12.0)
    assert coord.table_reloaded({A: 10}, now=13.0, table_epoch=8) == [Fenced(7, 8)]
    assert coord.state is State.FENCED
    assert coord.tick(100.0) == []
    assert coord.step(status(A, 10, 15), now=100.0) == []


def test_new_partition_joins_at_next_start_and_is_not_awaited_before() -> None:
    coord = ended()
    c = "c1/t/2"
    coord.step(status(A, 10, 15), now=11.0)
    assert coord.add_partitions({c}, now=11.0) == []  # not in this round: nobody waits for it
    [commit] = coord.step(status(B, 20, 20), now=11.0)
    assert isinstance(commit, CommitTable) and set(commit.offsets) == {A, B}
    ack, _, start = coord.commit_succeeded(version=1, now=12.0)
    assert ack.to == (A, B)
    assert start == Broadcast(to=(A, B, c), message=StartCommit(7, 2, {A: 15, B: 20}))


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.recover(8, {}, 1.0),
        lambda c: c.commit_succeeded(1, 1.0),
        lambda c: c.commit_failed("x", 1.0),
        lambda c: c.table_reloaded({}, 1.0),
        lambda c: c.step(StartCommit(7, 1, {}), 1.0),
    ],
)
def test_impossible_local_inputs_raise(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError):
        call(started())


def test_inputs_before_recover() -> None:
    coord = Coordinator("pipe", {A}, CFG)
    assert coord.tick(100.0) == []
    assert coord.step(status(A, 0, 1), now=1.0) == []
    with pytest.raises(ProtocolError):
        coord.commit_succeeded(1, 1.0)


def test_the_transition_table_covers_every_state() -> None:
    assert set(TRANSITIONS.rows) == set(State)
    assert "COMMITTING  --COMMIT_FAILED--> RELOADING" in TRANSITIONS.describe()


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        CommitSettings(commit_interval_s=0)


def test_a_lost_participant_is_not_waited_for_after_end() -> None:
    coord = ended()
    assert coord.step(RoundLost(7, 1, B, "flush failed"), now=11.0) == []  # A still awaited
    ready = coord.step(status(A, 10, 15), now=11.5)
    [commit] = ready  # at once, not after write_timeout_s
    assert isinstance(commit, CommitTable)
    assert commit.offsets == {A: 15}  # B keeps its offset
    assert commit.metadata.partial is True


def test_a_round_lost_of_another_round_is_ignored() -> None:
    coord = ended()
    assert coord.step(RoundLost(7, 2, B, "old"), now=11.0) == []
    assert coord.step(status(A, 10, 15), now=11.5) == []  # still waits for B


def test_a_fresh_participant_rejoins_a_running_round() -> None:
    coord = Coordinator("p", [A, B], CommitSettings(commit_interval_s=10, write_timeout_s=4))
    coord.recover(7, {A: 10, B: 20}, now=0.0)
    assert coord.step(ParticipantStarted(B), now=1.0) == [
        SendMessage(to=B, message=StartCommit(7, 1, {A: 10, B: 20}))
    ]
    assert coord.state is State.STARTED


def test_a_fresh_participant_after_end_is_not_waited_for() -> None:
    coord = ended()
    coord.step(status(A, 10, 15), now=11.0)
    [commit] = coord.step(ParticipantStarted(B), now=11.5)
    assert isinstance(commit, CommitTable) and commit.offsets == {A: 15}


def test_a_lost_partition_with_no_data_elsewhere_is_an_empty_round() -> None:
    coord = ended()
    coord.step(status(A, 10, 10), now=11.0)
    empty, start = coord.step(RoundLost(7, 1, B, "x"), now=11.5)
    assert empty == RoundFinished(1, None, 0, None, 1.5)
    assert start == Broadcast(to=(A, B), message=StartCommit(7, 2, {A: 10, B: 20}))


# -- files shared by partitions of one host (DataFile.shared_by) ----------------------------

C = "c1/t/2"


def shared(*keys: str, name: str = "host-f0.parquet") -> DataFile:
    return DataFile(name, 300, 3, shared_by=tuple(sorted(keys)))


def sharing(key: str, first: int, next_: int, *files: DataFile) -> WriteStatus:
    return WriteStatus(7, 1, key, files, first, next_, next_ - first)


def three() -> Coordinator:
    coord = Coordinator("pipe", {A, B, C}, CFG)
    coord.recover(7, {A: 10, B: 20, C: 30}, now=0.0)
    coord.tick(10.0)
    return coord


def test_a_file_shared_by_partitions_that_all_reported_it_is_committed_once() -> None:
    coord = three()
    f = shared(A, B)
    coord.step(sharing(A, 10, 15, f), now=11.0)
    coord.step(sharing(B, 20, 22, f), now=11.0)
    [commit] = coord.step(status(C, 30, 31), now=11.0)
    assert isinstance(commit, CommitTable)
    assert sorted(x.path for x in commit.files) == ["c1/t/2/f0.parquet", "host-f0.parquet"]
    assert commit.offsets == {A: 15, B: 22, C: 31}
    assert commit.metadata.partial is False


def test_a_partition_is_left_out_with_the_partner_whose_status_never_came() -> None:
    """A's rows share a file with B's; B's host died before it reported. Committing A
    would put B's rows in the table without B's offset: A is left out too (C goes in)."""
    coord = three()
    f = shared(A, B)
    coord.step(sharing(A, 10, 15, f), now=11.0)
    coord.step(status(C, 30, 31), now=11.0)
    [commit] = coord.tick(15.0)
    assert isinstance(commit, CommitTable)
    assert commit.offsets == {C: 31} and commit.expected == {C: 30}
    assert [x.path for x in commit.files] == ["c1/t/2/f0.parquet"]
    assert commit.metadata.partial is True
    ack, _, start = coord.commit_succeeded(version=4, now=16.0)
    assert ack.message.offsets == {A: 10, B: 20, C: 31}  # A starts again from the table
    assert start.message == StartCommit(7, 2, {A: 10, B: 20, C: 31})


def test_a_partner_that_reported_without_the_file_leaves_the_file_out() -> None:
    """B restarted and re-read: its status has a file of its own, not the shared one (which
    holds its rows of before the restart). The shared file may not be committed, so A stays
    out; B commits what it reported."""
    coord = three()
    f = shared(A, B)
    coord.step(sharing(A, 10, 15, f), now=11.0)
    coord.step(sharing(B, 20, 22, DataFile("b-again.parquet", 100, 2)), now=11.0)
    [commit] = coord.step(status(C, 30, 31), now=11.0)
    assert isinstance(commit, CommitTable)
    assert commit.offsets == {B: 22, C: 31}
    assert sorted(x.path for x in commit.files) == ["b-again.parquet", "c1/t/2/f0.parquet"]


def test_leaving_out_follows_chains_of_shared_files() -> None:
    """A shares a file with B, B another with C, C never reports: all three stay out and,
    nothing being left to commit, the round is discarded and restarts from the table."""
    coord = three()
    coord.step(sharing(A, 10, 15, shared(A, B, name="ab.parquet")), now=11.0)
    coord.step(
        sharing(B, 20, 22, shared(A, B, name="ab.parquet"), shared(B, C, name="bc.parquet")),
        now=11.0,
    )
    ready = coord.tick(15.0)
    assert not any(isinstance(e, CommitTable) for e in ready)
    assert ready == [RoundDiscarded(1, coord.status().last_error or ""), ReloadTable()]
    assert coord.status().rounds_discarded == 1
    assert "shared with partitions that did not report" in (coord.status().last_error or "")
