"""The pure source task machine: seed 000's lifecycle, each boundary, failures, stopping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.source_task import (
    AbortTransaction,
    Acknowledge,
    BeginTransaction,
    Close,
    CommitTransaction,
    Discard,
    End,
    Fail,
    InitTransactions,
    Poll,
    Segment,
    Send,
    SendOffsets,
    SourceTaskConfig,
    SourceTaskMachine,
    State,
)


def started(boundary: str = "poll", interval_s: float = 1.0) -> SourceTaskMachine:
    m = SourceTaskMachine(SourceTaskConfig(boundary, interval_s))  # type: ignore[arg-type]
    assert m.start(0.0) == [InitTransactions()]
    assert m.initialized({"p": 1}, 0.0) == [Poll(0)]
    return m


def test_init_transactions_comes_first() -> None:
    m = SourceTaskMachine()
    with pytest.raises(ProtocolError):
        m.polled([Segment(1, {"p": 1})], 0.0)
    assert m.start(0.0) == [InitTransactions()]
    with pytest.raises(ProtocolError):  # still initialising: no poll yet
        m.polled([Segment(1, {"p": 1})], 0.0)


def test_poll_boundary_records_then_offsets_then_commit() -> None:
    m = started("poll")
    ready = m.polled([Segment(3, {"p": 4})], 1.0)
    assert ready == [
        BeginTransaction(1),
        Send(0, 0),
        SendOffsets({"p": 4}),
        CommitTransaction(1),
    ]
    assert m.state is State.COMMITTING
    assert m.committed(1.1) == [Acknowledge(((0, 0),)), Poll(1)]
    s = m.status()
    assert (s.transactions_committed, s.records_committed, s.committed_offsets) == (1, 3, {"p": 4})


def test_never_poll_while_a_commit_is_in_flight() -> None:
    m = started("poll")
    m.polled([Segment(1, {"p": 1})], 1.0)
    with pytest.raises(ProtocolError):
        m.polled([Segment(1, {"p": 2})], 1.0)


def test_empty_poll_polls_again_without_a_transaction() -> None:
    m = started("poll")
    assert m.polled([], 1.0) == [Poll(1)]
    assert not m.in_transaction


def test_failed_commit_aborts_and_fails() -> None:
    m = started("poll")
    m.polled([Segment(2, {"p": 1})], 1.0)
    assert m.commit_failed("timeout", 2.0) == [AbortTransaction(1), Fail("commit failed: timeout")]
    assert m.state is State.FAILED
    assert m.status().committed_offsets == {"p": 1}  # only what was read at start
    with pytest.raises(ProtocolError):
        m.committed(3.0)


def test_failed_send_aborts_open_transaction_and_fails() -> None:
    m = started("interval", 10.0)
    m.polled([Segment(2, {"p": 1})], 1.0)
    assert m.failed("fenced", 1.5) == [AbortTransaction(1), Fail("fenced")]


def test_failure_without_a_transaction_just_fails() -> None:
    m = SourceTaskMachine()
    m.start(0.0)
    assert m.failed("no broker", 1.0) == [Fail("no broker")]


def test_interval_boundary_uses_time_as_input() -> None:
    m = started("interval", 5.0)
    assert m.polled([Segment(1, {"p": 1})], 10.0) == [BeginTransaction(1), Send(0, 0), Poll(1)]
    assert m.polled([Segment(1, {"p": 2})], 12.0) == [Send(1, 0), Poll(2)]
    assert m.polled([], 14.9) == [Poll(3)]
    assert m.polled([], 15.0) == [SendOffsets({"p": 2}), CommitTransaction(1)]
    assert m.committed(15.1) == [Acknowledge(((0, 0), (1, 0))), Poll(4)]


def test_connector_boundary_commit_and_abort_mid_poll() -> None:
    m = started("connector")
    segs = [Segment(2, {"a": 1}, End.COMMIT), Segment(1, {"a": 2}, End.ABORT), Segment(1, {"a": 3})]
    assert m.polled(segs, 1.0) == [
        BeginTransaction(1),
        Send(0, 0),
        SendOffsets({"a": 1}),
        CommitTransaction(1),
    ]
    assert m.committed(1.1) == [
        Acknowledge(((0, 0),)),
        BeginTransaction(2),
        Send(0, 1),
        AbortTransaction(2),
    ]
    assert m.state is State.ABORTING
    assert m.aborted(1.2) == [Discard(((0, 1),)), BeginTransaction(3), Send(0, 2), Poll(1)]
    s = m.status()
    assert (s.transactions_committed, s.transactions_aborted) == (1, 1)
    assert s.committed_offsets == {"p": 1, "a": 1}  # read at start + the committed one


def test_transaction_end_requests_need_the_connector_boundary() -> None:
    m = started("poll")
    with pytest.raises(ProtocolError):
        m.polled([Segment(1, {"p": 1}, End.COMMIT)], 1.0)


def test_stop_commits_the_open_transaction_for_poll_and_interval() -> None:
    m = started("interval", 100.0)
    m.polled([Segment(1, {"p": 1})], 1.0)
    assert m.stop(2.0) == []  # a poll is in flight: acted on at its result
    assert m.polled([Segment(1, {"p": 2})], 2.0) == [
        Send(1, 0),
        SendOffsets({"p": 2}),
        CommitTransaction(1),
    ]
    assert m.committed(2.1) == [Acknowledge(((0, 0), (1, 0))), Close()]
    assert m.state is State.CLOSED


def test_stop_aborts_the_open_transaction_for_connector() -> None:
    m = started("connector")
    m.polled([Segment(1, {"p": 1})], 1.0)
    m.stop(2.0)
    assert m.polled([], 2.0) == [AbortTransaction(1)]
    assert m.aborted(2.1) == [Discard(((0, 0),)), Close()]


def test_stop_before_start_and_during_init() -> None:
    m = SourceTaskMachine()
    assert m.stop(0.0) == [Close()]
    m = SourceTaskMachine()
    m.start(0.0)
    assert m.stop(0.1) == []
    assert m.initialized({}, 0.2) == [Close()]


_inputs = st.lists(
    st.tuples(
        st.sampled_from(["poll", "commit_ok", "commit_bad", "stop", "fail"]), st.integers(0, 3)
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(boundary=st.sampled_from(["poll", "interval", "connector"]), steps=_inputs)
def test_invariants_under_any_allowed_sequence(boundary: str, steps: list[tuple[str, int]]) -> None:
    """Whatever happens: offsets are sent only inside a transaction, right before its commit;
    no Poll is issued while a commit is in flight; committed offsets only grow by committed
    transactions' offsets."""
    m = started(boundary, 0.5)
    now, seq = 0.0, 0
    for kind, n in steps:
        now += 0.3
        try:
            if kind == "poll" and m.state is State.POLLING:
                segs = []
                for _ in range(n):
                    seq += 1
                    end = End.COMMIT if boundary == "connector" and seq % 2 else None
                    segs.append(Segment(1, {"p": seq}, end))
                ready = m.polled(segs, now)
            elif kind == "commit_ok" and m.state is State.COMMITTING:
                ready = m.committed(now)
            elif kind == "commit_bad" and m.state is State.COMMITTING:
                ready = m.commit_failed("x", now)
            elif kind == "stop":
                ready = m.stop(now)
            elif kind == "fail" and m.state in (State.POLLING, State.COMMITTING):
                ready = m.failed("x", now)
            else:
                continue
        except ProtocolError:
            pytest.fail(f"allowed input raised in {m.state}")
        for i, effect in enumerate(ready):
            if isinstance(effect, SendOffsets):
                assert isinstance(ready[i + 1], CommitTransaction)
            if isinstance(effect, (Poll, CommitTransaction, Close, Fail)):
                assert i == len(ready) - 1 or (
                    isinstance(effect, AbortTransaction) and isinstance(ready[-1], Fail)
                )
        if any(isinstance(e, Poll) for e in ready):
            assert m.state is State.POLLING
        if m.state in (State.CLOSED, State.FAILED):
            break
