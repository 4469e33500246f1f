"""The pure source task machine: seed 000's lifecycle, each boundary, each failure kind,
stopping - and a property over random runs (with restarts) that nothing is committed twice,
nothing is lost, and offsets commit with exactly their records."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.source_task import (
    TRANSITIONS,
    AbortTransaction,
    Acknowledge,
    BeginTransaction,
    Close,
    CommitTransaction,
    Discard,
    End,
    Event,
    Fail,
    Failure,
    InitTransactions,
    Poll,
    PollResult,
    ProduceSegment,
    Ready,
    Report,
    SendOffsets,
    SendToDeadLetter,
    SourceTaskConfig,
    SourceTaskMachine,
    State,
    describe,
)

#: the default settings: a transaction per poll, no dead-letter topic
POLL = SourceTaskConfig("poll", 1.0, False)


def started(
    boundary: str = "poll", interval_s: float = 1.0, dead_letter: bool = False
) -> SourceTaskMachine:
    m = SourceTaskMachine(SourceTaskConfig(boundary, interval_s, dead_letter))  # type: ignore[arg-type]
    assert m.start(0.0) == Ready([InitTransactions()], Report.INIT)
    assert m.initialized({"p": 1}, 0.0) == Ready([Poll(0)], Report.POLL)
    return m


def result(*offsets: Any, ends: tuple[tuple[End, int], ...] = ()) -> PollResult:
    """A poll result: each argument is one record's source offset in partition "p" (a
    ``(partition, offset)`` pair for another partition, None for none)."""
    return PollResult([o if o is None or isinstance(o, tuple) else ("p", o) for o in offsets], ends)


def test_init_transactions_comes_first() -> None:
    m = SourceTaskMachine(POLL)
    with pytest.raises(ProtocolError):
        m.polled(result(1), 0.0)
    assert m.start(0.0) == Ready([InitTransactions()], Report.INIT)
    with pytest.raises(ProtocolError):  # still initialising: no poll yet
        m.polled(result(1), 0.0)


def test_poll_boundary_records_then_offsets_then_commit() -> None:
    m = started("poll")
    ready = m.polled(result(2, 3, 4), 1.0)
    assert ready == Ready(
        [BeginTransaction(1), ProduceSegment(0, 0, 3), SendOffsets({"p": 4}), CommitTransaction(1)],
        Report.COMMIT,
    )
    assert m.state is State.COMMITTING
    assert m.committed(1.1) == Ready([Acknowledge(((0, 0, 3),)), Poll(1)], Report.POLL)
    s = m.status()
    assert (s.transactions_committed, s.records_committed, s.committed_offsets) == (1, 3, {"p": 4})
    assert (s.records_polled, s.records_sent) == (3, 3)


def test_offsets_are_the_newest_per_source_partition_and_records_without_one_commit_none() -> None:
    m = started("poll")
    ready = m.polled(result(5, ("q", {"line": 2}), None, 6, ("q", {"line": 3})), 1.0)
    assert SendOffsets({"p": 6, "q": {"line": 3}}) in ready.effects
    m = started("poll")
    assert m.polled(result(None, None), 1.0).effects == [
        BeginTransaction(1),
        ProduceSegment(0, 0, 2),
        CommitTransaction(1),  # no offsets to write
    ]


def test_never_poll_while_a_commit_is_in_flight() -> None:
    m = started("poll")
    m.polled(result(1), 1.0)
    with pytest.raises(ProtocolError):
        m.polled(result(2), 1.0)


def test_empty_poll_polls_again_without_a_transaction() -> None:
    m = started("poll")
    assert m.polled(result(), 1.0) == Ready([Poll(1)], Report.POLL)
    assert not m.in_transaction


def test_interval_boundary_uses_time_as_input() -> None:
    m = started("interval", 5.0)
    assert m.polled(result(1), 10.0).effects == [
        BeginTransaction(1),
        ProduceSegment(0, 0, 1),
        Poll(1),
    ]
    assert m.polled(result(2), 12.0).effects == [ProduceSegment(1, 0, 1), Poll(2)]
    assert m.polled(result(), 14.9).effects == [Poll(3)]
    assert m.polled(result(), 15.0) == Ready(
        [SendOffsets({"p": 2}), CommitTransaction(1)], Report.COMMIT
    )
    assert m.committed(15.1).effects == [Acknowledge(((0, 0, 1), (1, 0, 1))), Poll(4)]


def test_connector_boundary_commit_and_abort_mid_poll() -> None:
    m = started("connector")
    poll = PollResult([("a", 1), ("a", 1), ("a", 2), ("a", 3)], [(End.COMMIT, 2), (End.ABORT, 3)])
    assert m.polled(poll, 1.0) == Ready(
        [BeginTransaction(1), ProduceSegment(0, 0, 2), SendOffsets({"a": 1}), CommitTransaction(1)],
        Report.COMMIT,
    )
    assert m.committed(1.1) == Ready(
        [
            Acknowledge(((0, 0, 2),)),
            BeginTransaction(2),
            ProduceSegment(0, 2, 3),
            AbortTransaction(2),
        ],
        Report.ABORT,
    )
    assert m.state is State.ABORTING
    assert m.aborted(1.2) == Ready(
        [Discard(((0, 2, 3),)), BeginTransaction(3), ProduceSegment(0, 3, 4), Poll(1)], Report.POLL
    )
    s = m.status()
    assert (s.transactions_committed, s.transactions_aborted) == (1, 1)
    assert s.committed_offsets == {"p": 1, "a": 1}  # read at start + the committed one


def test_connector_ends_out_of_order_or_past_the_poll_are_refused() -> None:
    m = started("connector")
    with pytest.raises(ProtocolError):
        m.polled(PollResult([("a", 1)], [(End.COMMIT, 2)]), 1.0)
    with pytest.raises(ProtocolError):
        m.polled(PollResult([("a", 1), ("a", 2)], [(End.COMMIT, 2), (End.ABORT, 1)]), 1.0)


def test_transaction_end_requests_need_the_connector_boundary() -> None:
    m = started("poll")
    with pytest.raises(ProtocolError):
        m.polled(result(1, ends=((End.COMMIT, 1),)), 1.0)


# -- failure kinds -----------------------------------------------------------------------------


def test_failed_commit_aborts_and_fails() -> None:
    m = started("poll")
    m.polled(result(1, 1), 1.0)
    assert m.commit_failed("timeout", 2.0) == Ready(
        [AbortTransaction(1, best_effort=True), Fail("commit failed: timeout")], Report.NONE
    )
    assert m.state is State.FAILED
    assert m.status().committed_offsets == {"p": 1}  # only what was read at start
    with pytest.raises(ProtocolError):
        m.committed(3.0)


def test_a_fenced_commit_fails_without_an_abort() -> None:
    m = started("poll")
    m.polled(result(1, 1), 1.0)
    ready = m.commit_failed("ProducerFenced: epoch", 2.0, Failure.FENCED)
    assert ready == Ready([Fail("commit failed: ProducerFenced: epoch")], Report.NONE)


def test_a_fenced_send_fails_without_an_abort() -> None:
    m = started("interval", 10.0)
    m.polled(result(1, 2), 1.0)
    assert m.send_failed(0, 1, Failure.FENCED, "fenced", 1.5) == Ready(
        [Fail("fenced")], Report.NONE
    )


def test_any_other_send_error_aborts_the_open_transaction_and_fails() -> None:
    m = started("interval", 10.0)
    m.polled(result(1, 2), 1.0)
    assert m.send_failed(0, 0, Failure.ERROR, "KafkaTimeoutError", 1.5).effects == [
        AbortTransaction(1, best_effort=True),
        Fail("KafkaTimeoutError"),
    ]


def test_failure_without_a_transaction_just_fails() -> None:
    m = SourceTaskMachine(POLL)
    m.start(0.0)
    assert m.failed("no broker", 1.0) == Ready([Fail("no broker")], Report.NONE)


def test_a_fence_seen_outside_a_send_skips_the_abort() -> None:
    m = started("interval", 10.0)
    m.polled(result(1), 1.0)
    assert m.failed("ProducerFenced", 2.0, Failure.FENCED).effects == [Fail("ProducerFenced")]
    with pytest.raises(ProtocolError):  # a bad record is only known from a ProduceSegment
        started("poll").failed("bad", 1.0, Failure.BAD_RECORD)


def test_a_failed_requested_abort_fails_without_a_second_abort() -> None:
    m = started("connector")
    m.polled(PollResult([("a", 1)], [(End.ABORT, 1)]), 1.0)
    assert m.failed("abort timed out", 2.0).effects == [Fail("abort timed out")]


def test_a_bad_record_goes_to_the_dead_letter_topic_and_the_ready_goes_on() -> None:
    m = started("poll", dead_letter=True)
    m.polled(result(1, 2, 3, 4), 1.0)
    assert m.send_failed(0, 1, Failure.BAD_RECORD, "too large", 1.1) == Ready(
        [
            SendToDeadLetter(0, 1, "too large"),
            ProduceSegment(0, 2, 4),
            SendOffsets({"p": 4}),  # its offset commits with its neighbours
            CommitTransaction(1),
        ],
        Report.COMMIT,
    )
    # a second bad record in the resumed ProduceSegment, the last one of it
    assert m.send_failed(0, 3, Failure.BAD_RECORD, "bad json", 1.2).effects == [
        SendToDeadLetter(0, 3, "bad json"),
        SendOffsets({"p": 4}),
        CommitTransaction(1),
    ]
    assert m.committed(1.3).effects == [Acknowledge(((0, 0, 4),)), Poll(1)]
    s = m.status()
    assert (s.dead_letters, s.records_committed, s.bad_record) == (2, 4, None)


def test_a_bad_record_without_a_dead_letter_topic_stops_the_task_for_good() -> None:
    m = started("poll")
    m.polled(result(1, 2), 1.0)
    reason = "MessageSizeTooLargeError"
    assert m.send_failed(0, 1, Failure.BAD_RECORD, reason, 1.1) == Ready(
        [
            AbortTransaction(1, best_effort=True),
            Fail(f"BadRecord: {reason} (no dead_letter_topic: the task stops)", permanent=True),
        ],
        Report.NONE,
    )
    assert m.bad_record == reason and m.status().records_committed == 0


def test_a_send_failure_must_name_a_record_the_last_ready_sent() -> None:
    m = started("poll", dead_letter=True)
    m.polled(result(1, 2), 1.0)
    with pytest.raises(ProtocolError):
        m.send_failed(0, 2, Failure.BAD_RECORD, "x", 1.1)
    with pytest.raises(ProtocolError):
        m.send_failed(1, 0, Failure.BAD_RECORD, "x", 1.1)


# -- stopping --------------------------------------------------------------------------------


def test_stop_commits_the_open_transaction_for_poll_and_interval() -> None:
    m = started("interval", 100.0)
    m.polled(result(1), 1.0)
    assert m.stop(2.0) == Ready([], Report.POLL)  # a poll is in flight: acted on at its result
    assert m.polled(result(2), 2.0).effects == [
        ProduceSegment(1, 0, 1),
        SendOffsets({"p": 2}),
        CommitTransaction(1),
    ]
    assert m.committed(2.1) == Ready([Acknowledge(((0, 0, 1), (1, 0, 1))), Close()], Report.NONE)
    assert m.state is State.CLOSED


def test_stop_aborts_the_open_transaction_for_connector() -> None:
    m = started("connector")
    m.polled(result(1), 1.0)
    m.stop(2.0)
    assert m.polled(result(), 2.0) == Ready([AbortTransaction(1)], Report.ABORT)
    assert m.aborted(2.1) == Ready([Discard(((0, 0, 1),)), Close()], Report.NONE)


def test_stop_before_start_and_during_init() -> None:
    m = SourceTaskMachine(POLL)
    assert m.stop(0.0) == Ready([Close()], Report.NONE)
    m = SourceTaskMachine(POLL)
    m.start(0.0)
    assert m.stop(0.1) == Ready([], Report.INIT)
    assert m.initialized({}, 0.2) == Ready([Close()], Report.NONE)


# -- the table -------------------------------------------------------------------------------


def in_state(state: State) -> SourceTaskMachine:
    """A machine driven into ``state`` through its inputs."""
    if state is State.NEW:
        return SourceTaskMachine(POLL)
    if state is State.INITIALIZING:
        m = SourceTaskMachine(POLL)
        m.start(0.0)
        return m
    if state is State.ABORTING:
        m = started("connector")
        m.polled(PollResult([("a", 1)], [(End.ABORT, 1)]), 1.0)
        return m
    m = started("poll")
    if state is State.COMMITTING:
        m.polled(result(1), 1.0)
    elif state is State.CLOSED:
        m.stop(1.0)
        m.polled(result(), 1.0)
    elif state is State.FAILED:
        m.failed("poll", 1.0)
    assert m.state is state
    return m


#: every input but ``stop`` (never a hole) and ``send_failed`` (tested below)
INPUTS: dict[str, Any] = {
    "start": lambda m: m.start(2.0),
    "initialized": lambda m: m.initialized({}, 2.0),
    "polled": lambda m: m.polled(result(), 2.0),
    "committed": lambda m: m.committed(2.0),
    "commit_failed": lambda m: m.commit_failed("x", 2.0),
    "aborted": lambda m: m.aborted(2.0),
    "failed": lambda m: m.failed("x", 2.0),
}
ACCEPTED: dict[State, set[str]] = {
    State.NEW: {"start"},
    State.INITIALIZING: {"initialized", "failed"},
    State.POLLING: {"polled", "failed"},
    State.COMMITTING: {"committed", "commit_failed", "failed"},
    State.ABORTING: {"aborted", "failed"},
    State.CLOSED: set(),
    State.FAILED: set(),
}


@pytest.mark.parametrize("state", list(State))
def test_an_input_the_state_does_not_wait_for_raises_and_moves_nothing(state: State) -> None:
    for name, feed in INPUTS.items():
        m = in_state(state)
        before = m.status()
        if name in ACCEPTED[state]:
            feed(m)
            continue
        with pytest.raises(ProtocolError, match=f"source task: .* in state {state.name}"):
            feed(m)
        assert (m.state, m.status()) == (state, before), name


def test_every_missing_cell_raises() -> None:
    assert set(TRANSITIONS.rows) == set(State)
    holes = [(state, ev) for state in State for ev in Event if ev not in TRANSITIONS.rows[state]]
    assert (State.COMMITTING, Event.POLLED) in holes  # never poll while a commit is in flight
    assert (State.INITIALIZING, Event.SEND_FAILED) in holes
    assert (State.INITIALIZING, Event.COMMIT) in holes
    for state, ev in holes:
        with pytest.raises(ProtocolError):
            TRANSITIONS.move(state, ev)


def test_a_send_failure_before_anything_was_sent_raises() -> None:
    for state in (State.NEW, State.INITIALIZING, State.CLOSED, State.FAILED):
        m = in_state(state)
        with pytest.raises(ProtocolError):
            m.send_failed(0, 0, Failure.ERROR, "x", 2.0)
        assert m.state is state


def test_a_stop_once_closed_or_failed_is_the_only_ignored_cell() -> None:
    assert {s: e for s, e in TRANSITIONS.ignored().items() if e} == {
        State.CLOSED: {Event.STOP},
        State.FAILED: {Event.STOP},
    }
    for state in (State.CLOSED, State.FAILED):
        m = in_state(state)
        before = m.status()
        assert m.stop(3.0) == Ready([], Report.NONE)
        assert m.stop(3.1) == Ready([], Report.NONE)
        assert (m.state, m.status()) == (state, before)
    assert "COMMITTING  --POLL--> POLLING" in describe()


# -- the property ------------------------------------------------------------------------------

PARTITIONS = ("a", "b")
#: how a reported effect turns out: mostly fine, sometimes an error, a fence, or a stop
OUTCOMES = ("ok",) * 7 + ("error", "fenced", "stop")
_REPORTED: dict[Report, type] = {
    Report.INIT: InitTransactions,
    Report.POLL: Poll,
    Report.COMMIT: CommitTransaction,
    Report.ABORT: AbortTransaction,
}


class World:
    """A source of numbered records per partition, a Kafka that keeps what commits, and
    the driver between them and one machine incarnation after another (a Fail restarts
    from the committed offsets, as Ray restarts the actor)."""

    def __init__(self, data: st.DataObject, boundary: str, dead_letter: bool) -> None:
        self.data, self.boundary, self.dead_letter = data, boundary, dead_letter
        self.now = 0.0
        self.committed: dict[str, int] = {}  # the offsets topic (read_committed)
        self.visible: list[tuple[str, int]] = []  # target + dead-letter topics, committed
        self.dropped: set[tuple[str, int]] = set()  # aborted at the task's request
        self.permanent = False
        self.incarnations = 0

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def tick(self) -> float:
        """Time passes between inputs; the machine sees it only as ``now``."""
        self.now += self.draw(st.sampled_from([0.0, 0.1, 0.4, 1.0]))
        return self.now

    def run_incarnation(self, steps: int) -> int:
        self.incarnations += 1
        m = SourceTaskMachine(SourceTaskConfig(self.boundary, 0.5, self.dead_letter))  # type: ignore[arg-type]
        next_seq = {p: self.committed.get(p, -1) + 1 for p in PARTITIONS}
        polls: dict[int, list[tuple[str, int]]] = {}
        bad: set[tuple[str, int]] = set()
        txn: list[tuple[str, int]] = []  # sent in the open transaction
        txn_offsets: dict[str, int] = {}
        ready = m.start(self.tick())
        while steps > 0:
            steps -= 1
            if ready.report is not Report.NONE:  # the explicit field names a listed effect
                assert any(isinstance(e, _REPORTED[ready.report]) for e in ready.effects)
            for i, effect in enumerate(ready.effects):
                if isinstance(effect, SendOffsets):  # offsets go with records, then commit
                    assert isinstance(ready.effects[i + 1], CommitTransaction)
                if isinstance(effect, Poll):
                    assert i == len(ready.effects) - 1 and m.state is State.POLLING
            interrupted: Ready | None = None
            for effect in ready.effects:
                if isinstance(effect, BeginTransaction):
                    assert not txn and not txn_offsets
                elif isinstance(effect, ProduceSegment):
                    for index in range(effect.start, effect.stop):
                        if polls[effect.poll_id][index] in bad:
                            interrupted = m.send_failed(
                                effect.poll_id, index, Failure.BAD_RECORD, "bad", self.tick()
                            )
                            break
                        txn.append(polls[effect.poll_id][index])
                    if interrupted is not None:
                        break
                elif isinstance(effect, SendToDeadLetter):
                    event("dead letter")
                    txn.append(polls[effect.poll_id][effect.index])
                elif isinstance(effect, SendOffsets):
                    txn_offsets.update(effect.offsets)
                elif isinstance(effect, Discard):
                    assert not txn  # the abort dropped them
                elif isinstance(effect, Fail):
                    assert m.state is State.FAILED
                    self.permanent = effect.permanent
                    event(f"fail permanent={effect.permanent}")
                    return steps
                elif isinstance(effect, Close):
                    return 0
            if interrupted is not None:
                ready = interrupted
                continue
            outcome = self.draw(st.sampled_from(OUTCOMES))
            if outcome == "stop":
                assert m.stop(self.now).effects == []
                outcome = "ok"
            kind = Failure.FENCED if outcome == "fenced" else Failure.ERROR
            now = self.tick()
            if ready.report is Report.INIT:
                ready = (
                    m.initialized({p: o for p, o in self.committed.items()}, now)
                    if outcome == "ok"
                    else m.failed("init", now, kind)
                )
            elif ready.report is Report.POLL:
                if outcome != "ok":
                    ready = m.failed("poll", now, kind)
                    continue
                records = [self._next(next_seq) for _ in range(self.draw(st.integers(0, 4)))]
                bad |= {r for r in records if self.draw(st.integers(0, 9)) == 0}
                polls[m.status().polls - 1] = records
                ready = m.polled(PollResult(records, self._ends(len(records))), now)
            elif ready.report is Report.COMMIT:
                if outcome != "ok":  # the transaction is gone: Kafka aborts it
                    txn, txn_offsets = [], {}
                    ready = m.commit_failed("commit", now, kind)
                    continue
                # offsets commit with exactly their records: each partition's newest
                newest: dict[str, int] = {}
                for p, seq in txn:
                    newest[p] = max(seq, newest.get(p, -1))
                assert txn_offsets == newest
                self.visible += txn
                self.committed.update(txn_offsets)
                txn, txn_offsets = [], {}
                ready = m.committed(now)
            elif ready.report is Report.ABORT:
                if outcome != "ok":
                    txn, txn_offsets = [], {}
                    ready = m.failed("abort", now, kind)
                    continue
                self.dropped |= set(txn)
                txn, txn_offsets = [], {}
                ready = m.aborted(now)
        return 0

    def _next(self, next_seq: dict[str, int]) -> tuple[str, int]:
        p = self.draw(st.sampled_from(PARTITIONS))
        next_seq[p] += 1
        return (p, next_seq[p] - 1)

    def _ends(self, n: int) -> list[tuple[End, int]]:
        if self.boundary != "connector":
            return []
        cuts = sorted(self.draw(st.lists(st.integers(0, n), max_size=2)))
        return [(self.draw(st.sampled_from(list(End))), c) for c in cuts]


@settings(max_examples=300, deadline=None)
@given(
    boundary=st.sampled_from(["poll", "interval", "connector"]),
    dead_letter=st.booleans(),
    data=st.data(),
)
def test_random_runs_commit_each_record_once_lose_none_and_commit_offsets_with_records(
    boundary: str, dead_letter: bool, data: st.DataObject
) -> None:
    """Random polls, time between inputs, bad records, errors, fences and stops, over
    restarts: no record is visible twice; every record up to a committed offset is
    visible (or was dropped at the task's own request); no record is visible beyond its
    partition's committed offset."""
    world = World(data, boundary, dead_letter)
    steps = 60
    while steps > 0 and not world.permanent:
        steps = world.run_incarnation(steps)
    counts = Counter(world.visible)
    event(f"incarnations: {min(world.incarnations, 3)}")
    event(f"visible: {'some' if world.visible else 'none'}")
    event(f"dropped: {'some' if world.dropped else 'none'}")
    assert all(n == 1 for n in counts.values()), counts
    for p in PARTITIONS:
        upto = world.committed.get(p, -1)
        expected = {(p, seq) for seq in range(upto + 1)}
        got = {r for r in counts if r[0] == p}
        assert got <= expected  # nothing visible past the committed offset
        assert expected - got <= world.dropped  # nothing lost
