"""Example-based tests of the participant's transitions (protocol/participant.py)."""

from __future__ import annotations

import msgspec
import pytest

from rayconnect.protocol.effects import (
    COORDINATOR,
    Flush,
    Pause,
    Resume,
    Seek,
    SeekToPolicy,
    SendMessage,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.messages import (
    AckCommit,
    Drained,
    EndCommit,
    RequestCommit,
    RoundLost,
    StartCommit,
)
from rayconnect.protocol.participant import (
    TRANSITIONS,
    Event,
    Participant,
    State,
)
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile

KEY = "c1/t/0"
CFG = CommitSettings(
    flush_max_records=10, flush_max_bytes=1000, flush_max_age_s=5.0, request_commit_after_flushes=2
)
FILE = DataFile("c1/t/0/a.parquet", 10, 3)


def drained(records: int, nbytes: int) -> SendMessage:
    return SendMessage(to=COORDINATOR, message=Drained(KEY, records, nbytes))


def writing(offset: int | None = 100, txn: int = 1) -> Participant:
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, txn, {KEY: offset} if offset is not None else {}), now=0.0)
    return p


def feed(p: Participant, first: int, n: int, now: float = 0.0, nbytes: int = 10) -> list:  # type: ignore[type-arg]
    return p.records(first, first + n, n, nbytes, f"batch@{first}", now)


def test_paused_until_the_first_start_which_seeks_and_resumes() -> None:
    p = Participant(KEY, CFG)
    assert p.state is State.PAUSED
    assert feed(p, 0, 3) == []  # nothing is accepted before a START
    ready = p.step(StartCommit(1, 1, {KEY: 100}), now=0.0)
    assert ready == [Seek(100), Resume()]
    assert (p.state, p.position, p.committed_offset) == (State.WRITING, 100, 100)


def test_no_seek_when_the_reader_is_already_there() -> None:
    p = writing(100)
    p.step(EndCommit(1, 1), now=1.0)
    p.step(AckCommit(1, 1, 5, {KEY: 100}), now=2.0)
    assert p.step(StartCommit(1, 2, {KEY: 100}), now=3.0) == [Resume()]


def test_no_table_offset_seeks_by_policy_and_waits_for_the_resolved_offset() -> None:
    p = writing(offset=None)
    assert p.state is State.WRITING and p.position is None
    assert feed(p, 0, 3) == []  # dropped: the start is unknown
    # the dropped batch moved the reader: seek again once the offset is known (and resume:
    # the same path serves a reader that attached, paused, while the offset was unknown)
    assert p.position_resolved(0, now=0.0) == [Seek(0), Resume()]
    assert feed(p, 0, 3) == []
    [flush] = p.step(EndCommit(1, 1), now=1.0)
    [send] = p.flushed(flush.flush_id, [FILE], now=1.0)  # type: ignore[union-attr]
    assert isinstance(send, SendMessage)
    assert (send.message.first_offset, send.message.next_offset) == (0, 3)


def test_every_start_without_offset_goes_back_to_the_policy() -> None:
    p = writing(offset=None)
    p.position_resolved(0, now=0.0)
    feed(p, 0, 3)
    assert p.step(StartCommit(1, 2, {}), now=1.0) == [SeekToPolicy(), Resume()]


def test_idle_policy_partition_reports_once_the_offset_is_resolved() -> None:
    p = writing(offset=None)
    assert p.step(EndCommit(1, 1), now=1.0) == [Pause()]
    assert p.state is State.ENDING
    [send] = p.position_resolved(42, now=2.0)
    assert isinstance(send, SendMessage)
    assert (send.message.first_offset, send.message.next_offset) == (42, 42)


def test_idle_partition_reports_at_once_on_end() -> None:
    p = writing(100)
    [send] = p.step(EndCommit(1, 1), now=1.0)
    assert isinstance(send, SendMessage) and send.to == COORDINATOR
    assert (send.message.first_offset, send.message.next_offset, send.message.files) == (
        100,
        100,
        (),
    )
    assert p.state is State.REPORTED


def test_end_flushes_the_rest_then_reports_when_the_flush_returns() -> None:
    p = writing(100)
    feed(p, 100, 3)
    [flush] = p.step(EndCommit(1, 1), now=1.0)  # no Pause: the reader reads ahead
    assert isinstance(flush, Flush)
    assert (flush.first_offset, flush.next_offset, flush.batches) == (100, 103, ("batch@100",))
    assert p.state is State.ENDING
    [send] = p.flushed(flush.flush_id, [FILE], now=2.0)
    assert isinstance(send, SendMessage)
    assert send.message.files == (FILE,)
    assert (send.message.first_offset, send.message.next_offset, send.message.records) == (
        100,
        103,
        3,
    )
    assert p.step(EndCommit(1, 1), now=3.0) == [send]  # duplicate END: same status again


def test_an_empty_batch_past_markers_moves_the_offset_with_nothing_to_flush() -> None:
    """The reader's empty piece over commit markers or an aborted transaction: the round
    reports the offset past them, without a flush (no rows), alone or after records."""
    p = writing(100)
    assert p.records(100, 102, 0, 0, None, 0.0) == []
    [send] = p.step(EndCommit(1, 1), now=1.0)
    assert isinstance(send, SendMessage)
    assert (send.message.next_offset, send.message.records, send.message.files) == (102, 0, ())
    q = writing(100)
    feed(q, 100, 3)
    q.records(103, 105, 0, 0, None, 0.0)  # the aborted tail after the records
    [flush] = q.step(EndCommit(1, 1), now=1.0)
    assert isinstance(flush, Flush)
    assert (flush.next_offset, flush.batches) == (105, ("batch@100",))
    [send] = q.flushed(flush.flush_id, [FILE], now=2.0)
    assert (send.message.next_offset, send.message.records) == (105, 3)


def test_flush_by_records() -> None:
    p = writing(0, txn=1)
    assert feed(p, 0, 9) == []
    [flush] = feed(p, 9, 1)
    assert isinstance(flush, Flush) and flush.records == 10


def test_flush_by_bytes() -> None:
    p = writing(0)
    [flush] = feed(p, 0, 1, nbytes=1000)
    assert isinstance(flush, Flush) and flush.nbytes == 1000


def test_flush_by_age() -> None:
    p = writing(0)
    feed(p, 0, 1, now=1.0)
    assert p.next_deadline() == 6.0
    assert p.tick(5.9) == []
    [flush] = p.tick(6.0)
    assert isinstance(flush, Flush)
    assert p.next_deadline() is None


def test_request_commit_once_per_round_after_enough_size_flushes() -> None:
    p = writing(0)
    assert len(feed(p, 0, 10)) == 1
    flush, request = feed(p, 10, 10)
    assert isinstance(flush, Flush)
    assert request == SendMessage(to=COORDINATOR, message=RequestCommit(1, 1, KEY))
    assert len(feed(p, 20, 10)) == 1  # not again in this round


def test_gap_seeks_back_once_and_stale_batches_are_dropped() -> None:
    p = writing(100)
    assert feed(p, 103, 2) == [Seek(100)]
    assert feed(p, 105, 2) == []  # same gap, already seeking
    assert feed(p, 90, 5) == []  # stale
    assert feed(p, 100, 3) == []  # accepted
    assert p.position == 103


def test_newer_start_discards_the_open_round_and_late_flush_results_are_ignored() -> None:
    p = writing(100)
    feed(p, 100, 10)  # size flush in flight
    assert p.step(StartCommit(1, 2, {KEY: 100}), now=1.0) == [Seek(100), Resume()]
    assert p.flushed(0, [FILE], now=2.0) == []  # flush of txn 1: ignored
    [send] = p.step(EndCommit(1, 2), now=3.0)
    assert isinstance(send, SendMessage) and send.message.files == ()


def test_older_or_duplicate_start_end_ack_are_ignored() -> None:
    p = writing(100, txn=5)
    assert p.step(StartCommit(1, 4, {KEY: 0}), now=1.0) == []
    assert p.step(StartCommit(1, 5, {KEY: 0}), now=1.0) == []
    assert p.step(StartCommit(0, 9, {KEY: 0}), now=1.0) == []  # older epoch (I3)
    assert p.step(EndCommit(1, 4), now=1.0) == []
    assert p.step(AckCommit(1, 4, 1, {KEY: 0}), now=1.0) == []
    assert p.state is State.WRITING and p.round == (1, 5)
    assert p.status().messages_ignored == 5


def test_ack_sets_the_committed_offset_and_pauses_until_the_next_start() -> None:
    p = writing(100)
    feed(p, 100, 3)
    [flush] = p.step(EndCommit(1, 1), now=1.0)
    p.flushed(flush.flush_id, [FILE], now=1.0)  # type: ignore[union-attr]
    assert p.step(AckCommit(1, 1, 9, {KEY: 103}), now=2.0) == []
    assert (p.state, p.committed_offset) == (State.PAUSED, 103)
    assert p.step(StartCommit(1, 2, {KEY: 103}), now=3.0) == [Resume()]


def test_ack_of_a_partial_commit_without_us_closes_our_round() -> None:
    p = writing(100)
    feed(p, 100, 3)
    assert p.step(AckCommit(1, 1, 9, {KEY: 100}), now=2.0) == [Pause()]
    assert (p.state, p.committed_offset, p.position) == (State.PAUSED, 100, 103)
    assert p.step(StartCommit(1, 2, {KEY: 100}), now=3.0) == [Seek(100), Resume()]


def test_flush_failure_abandons_the_round_and_says_so() -> None:
    p = writing(100)
    [flush] = feed(p, 100, 10)
    assert p.flush_failed(flush.flush_id, "disk full", now=1.0) == [  # type: ignore[union-attr]
        Pause(),
        SendMessage(to=COORDINATOR, message=RoundLost(1, 1, KEY, "disk full")),
    ]
    assert p.state is State.PAUSED
    assert p.step(EndCommit(1, 1), now=2.0) == []  # cannot report this round
    assert p.status().last_error is not None


def test_batches_while_paused_move_the_reader_so_the_next_start_seeks() -> None:
    p = writing(100)
    [flush] = feed(p, 100, 10)
    p.flush_failed(flush.flush_id, "x", now=1.0)  # type: ignore[union-attr]
    assert feed(p, 110, 5) == []  # already on its way when the Pause was carried out
    assert p.position == 115
    assert p.step(StartCommit(1, 2, {KEY: 100}), now=3.0) == [Seek(100), Resume()]


def reported(p: Participant, txn: int = 1) -> None:
    """END and, if a flush went out, its result: the round is REPORTED."""
    for effect in p.step(EndCommit(1, txn), now=1.0):
        if isinstance(effect, Flush):
            p.flushed(effect.flush_id, [FILE], now=1.0)
    assert p.state is State.REPORTED


def test_reading_goes_on_after_end_and_the_next_round_adopts_it_without_a_seek() -> None:
    p = writing(100)
    feed(p, 100, 3)
    reported(p)
    assert p.is_reading
    assert feed(p, 103, 4) == [] and feed(p, 107, 2) == []  # read ahead, not in this round
    assert p.status().read_ahead_records == 6
    assert p.step(AckCommit(1, 1, 9, {KEY: 103}), now=2.0) == []
    assert p.step(StartCommit(1, 2, {KEY: 103}), now=3.0) == [Resume()]
    assert p.status().buffered_records == 6 and p.position == 109
    [flush] = p.step(EndCommit(1, 2), now=4.0)
    assert isinstance(flush, Flush)
    assert (flush.first_offset, flush.next_offset, flush.batches) == (
        103,
        109,
        ("batch@103", "batch@107"),
    )


def test_a_full_read_ahead_pauses_the_reader_and_the_next_start_flushes_it() -> None:
    p = writing(0)
    reported(p)
    assert feed(p, 0, 6) == []
    assert feed(p, 6, 4) == [Pause()]  # 10 records: the flush bound
    assert not p.is_reading
    [resume, flush] = p.step(StartCommit(1, 2, {KEY: 0}), now=3.0)
    assert resume == Resume() and isinstance(flush, Flush) and flush.records == 10


@pytest.mark.parametrize(
    "offsets, want",
    [
        ({KEY: 100}, [Seek(100), Resume()]),  # round 1 was discarded: read it again
        ({KEY: 50}, [Seek(50), Resume()]),
        ({}, [SeekToPolicy(), Resume()]),  # the table has no offset for us
    ],
)
def test_a_start_elsewhere_drops_the_read_ahead_and_seeks(offsets: dict, want: list) -> None:  # type: ignore[type-arg]
    """Round 1 read [100, 103) and reported; round 2 does not start at 103."""
    p = writing(100)
    feed(p, 100, 3)
    reported(p)
    feed(p, 103, 4)
    assert p.step(StartCommit(1, 2, offsets), now=2.0) == want
    assert p.status().read_ahead_records == 0 and p.status().buffered_records == 0


def test_a_batch_that_does_not_continue_the_read_ahead_drops_it() -> None:
    p = writing(100)
    reported(p)
    feed(p, 100, 3)
    assert feed(p, 90, 2) == [Pause()]  # stale: where the reader is is unknown now
    assert p.status().read_ahead_records == 0
    assert p.step(StartCommit(1, 2, {KEY: 100}), now=2.0) == [Seek(100), Resume()]


def test_an_ack_that_committed_us_elsewhere_drops_the_read_ahead() -> None:
    p = writing(100)
    feed(p, 100, 3)
    reported(p)
    feed(p, 103, 2)
    assert p.step(AckCommit(1, 1, 9, {KEY: 100}), now=2.0) == [Pause()]
    assert p.step(StartCommit(1, 2, {KEY: 100}), now=3.0) == [Seek(100), Resume()]


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.flushed(0, [], 1.0),  # never issued
        lambda p: p.flush_failed(3, "x", 1.0),
        lambda p: p.records(5, 4, 1, 1, None, 1.0),  # backwards
        lambda p: p.position_resolved(-1, 1.0),
        lambda p: p.step(RequestCommit(1, 1, KEY), 1.0),
    ],
)
def test_impossible_local_inputs_raise(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError):
        call(writing(100))


def test_the_transition_table_ignores_late_inputs_and_has_holes_that_raise() -> None:
    assert set(TRANSITIONS.rows) == set(State)
    for state, ignored in TRANSITIONS.ignored().items():
        assert {Event.STALE, Event.LATE_RESULT} <= ignored, state
    assert TRANSITIONS.ignored()[State.ENDING] == {Event.STALE, Event.LATE_RESULT, Event.END}
    for state, event in [
        (State.PAUSED, Event.END),  # no open round to end
        (State.PAUSED, Event.FLUSHED),
        (State.REPORTED, Event.FLUSHED),  # nothing is in flight once reported
        (State.REPORTED, Event.POSITION_RESOLVED),
        (State.WRITING, Event.REPORT),
    ]:
        with pytest.raises(ProtocolError):
            TRANSITIONS.move(state, event)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        CommitSettings(flush_max_records=0)


def test_commit_when_caught_up_asks_once_per_round_when_a_batch_reaches_the_end() -> None:
    p = Participant(KEY, msgspec.structs.replace(CFG, commit_when_caught_up=True))
    p.step(StartCommit(1, 1, {KEY: 0}), now=0.0)
    request = SendMessage(to=COORDINATOR, message=RequestCommit(1, 1, KEY))
    assert p.records(0, 3, 3, 30, "b0", 0.0) == []  # more to read
    assert p.records(3, 5, 2, 20, "b3", 0.0, caught_up=True) == [request]
    assert p.records(5, 6, 1, 10, "b5", 0.0, caught_up=True) == []  # once per round
    # without the setting, reaching the end asks nothing: it only reports what it drained
    q = writing(0)
    assert q.records(0, 3, 3, 30, "b0", 0.0, caught_up=True) == [drained(3, 30)]


def test_by_default_a_drained_backlog_ends_the_round_and_steady_traffic_does_not() -> None:
    """commit_when_drained (default): reaching the high watermark asks for the commit only
    after a flush's worth was read since the partition last reached it - a backlog read at
    full speed - so a backlog's last round does not wait out the interval, and a caught-up
    live partition keeps the interval."""
    request = SendMessage(to=COORDINATOR, message=RequestCommit(1, 1, KEY))
    steady = writing(0)
    assert steady.records(0, 3, 3, 30, "b0", 0.0, caught_up=True) == [drained(3, 30)]
    assert steady.records(3, 6, 3, 30, "b3", 0.0, caught_up=True) == []  # reported once
    backlog = writing(0)
    assert request not in backlog.records(0, 6, 6, 60, "b0", 0.0)
    effects = backlog.records(6, 12, 6, 60, "b6", 0.0, caught_up=True)
    assert request in effects and drained(12, 120) in effects
    assert backlog.records(12, 13, 1, 10, "b12", 0.0, caught_up=True) == []  # once
    off = Participant(KEY, msgspec.structs.replace(CFG, commit_when_drained=False))
    off.step(StartCommit(1, 1, {KEY: 0}), now=0.0)
    off.records(0, 6, 6, 60, "b0", 0.0)
    assert request not in off.records(6, 12, 6, 60, "b6", 0.0, caught_up=True)


def test_a_backlog_split_over_rounds_still_ends_the_round_it_drains_in() -> None:
    """Another partition's request ended the round while this one was behind: the rest of
    its backlog, read as read-ahead up to the high watermark, asks at the START that adopts
    it - though no single round held a flush's worth."""
    p = writing(0)
    p.records(0, 6, 6, 60, "b0", 0.0)  # behind, less than a flush
    reported(p)
    p.records(6, 11, 5, 50, "b6", 1.0, caught_up=True)  # read-ahead: 11 behind in all
    effects = p.step(StartCommit(1, 2, {KEY: 6}), now=2.0)  # round 1 committed up to 6
    assert effects[-1] == SendMessage(to=COORDINATOR, message=RequestCommit(1, 2, KEY))
    # drained now: reaching the end again after a little more is steady traffic (reported,
    # since the END started a read-ahead, but no request)
    p.step(EndCommit(1, 2), now=3.0)
    assert p.records(11, 12, 1, 10, "b11", 3.0, caught_up=True) == [drained(1, 10)]


def test_a_caught_up_read_ahead_asks_for_the_commit_at_the_next_start() -> None:
    """A backlog's last records may arrive as read-ahead: no batch follows them, so the
    START that adopts them must ask, or the round would wait out the interval."""
    p = Participant(KEY, msgspec.structs.replace(CFG, commit_when_caught_up=True))
    p.step(StartCommit(1, 1, {KEY: 0}), now=0.0)
    reported(p)
    p.records(0, 4, 4, 40, "b0", 1.0, caught_up=True)
    assert p.step(StartCommit(1, 2, {KEY: 0}), now=2.0) == [
        Resume(),
        SendMessage(to=COORDINATOR, message=RequestCommit(1, 2, KEY)),
    ]


def test_drained_is_reported_once_per_round_and_once_while_reading_ahead() -> None:
    """The coordinator judges a backlog over the whole pipeline (many small partitions):
    each participant reports how much it read between two catch-ups, at most once in a
    round and once in the read-ahead after its END - never per batch."""
    p = writing(0)
    assert p.records(0, 4, 4, 40, "b0", 0.0) == []  # behind: nothing to report yet
    assert p.records(4, 6, 2, 20, "b4", 0.0, caught_up=True) == [drained(6, 60)]
    assert p.records(6, 7, 1, 10, "b6", 0.0, caught_up=True) == []
    p.step(EndCommit(1, 1), now=1.0)
    assert p.records(7, 9, 2, 20, "b7", 1.0, caught_up=True) == [drained(2, 20)]  # read-ahead
    assert p.records(9, 10, 1, 10, "b9", 1.0, caught_up=True) == []
    p.step(StartCommit(1, 2, {KEY: 0}), now=2.0)  # not where round 1 ended: no adoption
    assert p.records(0, 1, 1, 10, "b0", 2.0) == []  # re-read: behind again
    assert p.records(1, 3, 2, 20, "b1", 2.0, caught_up=True) == [drained(3, 30)]
    caught_up_mode = Participant(KEY, msgspec.structs.replace(CFG, commit_when_caught_up=True))
    caught_up_mode.step(StartCommit(1, 1, {KEY: 0}), now=0.0)
    effects = caught_up_mode.records(0, 3, 3, 30, "b0", 0.0, caught_up=True)
    assert [e.message for e in effects if isinstance(e, SendMessage)] == [
        RequestCommit(1, 1, KEY)
    ]  # every catch-up ends the round anyway: nothing to add up


# -- liveness: a quiet round behind the log's data re-syncs the reader (issue 41) ----------


def _idle_round(p: Participant, txn: int, offset: int, now: float) -> list:  # type: ignore[type-arg]
    """START at ``offset``, nothing read, END (an empty WRITE-STATUS), ACK: the effects of
    the START."""
    ready = p.step(StartCommit(1, txn, {KEY: offset}), now=now)
    p.step(EndCommit(1, txn), now=now + CFG.commit_interval_s)
    p.step(AckCommit(1, txn, txn, {KEY: offset}), now=now + CFG.commit_interval_s)
    return ready


def _behind_at_100() -> Participant:
    """The reader delivered [100, 109) of a log whose data goes to 120, then the round that
    read it was lost (its pieces died): the table stays at 100, the reader stands at 109."""
    p = writing(100)
    p.records(100, 109, 9, 90, "piece", 0.0, high_watermark=120)
    [flush, *_] = p.step(EndCommit(1, 1), now=1.0)
    assert isinstance(flush, Flush)
    p.flush_failed(flush.flush_id, "OwnerDiedError", now=1.0)
    return p


def test_a_quiet_round_behind_the_logs_data_seeks_again_where_it_believes_the_reader_is() -> None:
    p = _behind_at_100()
    # the START seeks back to 100; say the reader then lost that seek to an older steering
    assert _idle_round(p, 2, 100, now=10.0) == [Seek(100), Resume()]
    assert p.status().idle_rounds_behind == 1 and p.status().resyncs == 1
    # so the next START seeks again, though the offsets look equal
    assert _idle_round(p, 3, 100, now=30.0) == [Seek(100), Resume()]
    # re-syncs back off: the next comes two quiet rounds later, then four
    seeks = [_idle_round(p, txn, 100, now=30.0 + 20 * txn) for txn in range(4, 12)]
    assert [s == [Seek(100), Resume()] for s in seeks] == [
        False, True, False, False, False, True, False, False,
    ]
    status = p.status()
    assert status.stalled and status.data_end == 120 and status.idle_rounds_behind == 10


def test_a_batch_ends_the_quiet_count() -> None:
    p = _behind_at_100()
    _idle_round(p, 2, 100, now=10.0)
    _idle_round(p, 3, 100, now=30.0)
    assert p.status().idle_rounds_behind == 2
    p.step(StartCommit(1, 4, {KEY: 100}), now=50.0)
    p.records(100, 120, 20, 200, "again", 51.0, caught_up=True, high_watermark=120)
    p.step(EndCommit(1, 4), now=52.0)
    assert p.status().idle_rounds_behind == 0 and not p.status().stalled


def test_a_short_round_says_nothing_about_the_reader() -> None:
    """Rounds ended early by other partitions (a drained backlog, REQUEST-COMMIT) may end
    before a healthy reader's next fetch: only a round of at least commit_interval_s
    without a batch counts."""
    p = writing(100)
    p.records(100, 110, 10, 100, "piece", 0.0, high_watermark=500)
    p.step(EndCommit(1, 1), now=0.1)
    p.step(AckCommit(1, 1, 1, {KEY: 110}), now=0.2)
    for txn in range(2, 6):
        p.step(StartCommit(1, txn, {KEY: 110}), now=0.1 * txn)
        p.step(EndCommit(1, txn), now=0.1 * txn + 0.05)
        p.step(AckCommit(1, txn, txn, {KEY: 110}), now=0.1 * txn + 0.05)
    assert p.status().idle_rounds_behind == 0 and p.status().resyncs == 0


def test_a_commit_marker_after_the_data_is_not_data() -> None:
    """A transactional topic's high watermark counts the commit marker after the last
    record; the reader says the batch is caught up (its consumer passed the marker), so
    an idle partition there is not behind."""
    p = writing(100)
    p.records(100, 109, 9, 90, "piece", 0.0, caught_up=True, high_watermark=110)
    p.step(EndCommit(1, 1), now=1.0)
    p.step(AckCommit(1, 1, 1, {KEY: 109}), now=1.0)
    for txn in range(2, 6):
        assert _idle_round(p, txn, 109, now=20.0 * txn) == [Resume()]
    assert p.status().idle_rounds_behind == 0 and p.status().data_end == 109
