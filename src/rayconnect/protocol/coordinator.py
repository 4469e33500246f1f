"""The commit coordinator (Hudi RFC-32 TransactionCoordinator) as a pure state machine.

Theory of operation
-------------------
One coordinator per pipeline runs numbered rounds ``(epoch, txn_id)``. ``epoch`` is claimed
in the table by the actor before ``recover`` (the table keeps it as a fence: once a newer
epoch is claimed, commits of older epochs fail in the table). ``txn_id`` counts rounds
within the epoch, from 1, and never goes back, not even after a failed commit.

A round: START-COMMIT (broadcast with the table's offsets) -> ``commit_interval_s`` after
the previous round's END (participants read ahead from there; after a discarded round or
at start-up: after the START) or on a REQUEST-COMMIT -> END-COMMIT -> WRITE-STATUS from every partition -> ``CommitTable``
(one table version, compare-and-set on the offsets the round started from) -> on
``commit_succeeded`` ACK-COMMIT and, in the same step, START-COMMIT of the next round.

Rules
-----
- The table is the only truth (I2). START offsets are the table's offsets; after a failed
  commit the coordinator reloads them (``ReloadTable`` -> ``table_reloaded``) rather than
  guessing whether the commit landed.
- A partition the table has no offset for is left out of START's offsets; its participant
  seeks by its starting-offset policy and reports where it started. Such a partition's
  first commit expects "no offset" in the table (``expected[key] = None``).
- Statuses are validated (see commit_state.py); a rejected one counts as not reported.
- Slow or dead participants hold nobody back for more than ``write_timeout_s``: on timeout
  the partitions that reported are committed (a *partial* commit, Iceberg style) if any of
  them has data; otherwise the round is discarded and the table reloaded (a coordinator
  whose participants all follow a newer epoch learns so that it is fenced). Either way the
  partitions that did not report start the next round from their old offsets.
- A full round in which no partition moved is not committed (no empty table versions); the
  next round starts at once. It is counted as ``rounds_empty``.
- Partitions may change at run time (``set_partitions``): new ones join at the next START;
  retired ones leave the current round at once, so it never waits for them.
- A participant that cannot report (ROUND-LOST after a failed flush, or a fresh one after
  END: PARTICIPANT-STARTED) is not waited for: the round commits the others at once, and it
  starts the next round from its old offset. A fresh participant in a running round is sent
  that round's START again and simply joins it.
- Messages from the network that do not fit (another epoch or txn, a duplicate, an unknown
  partition, a message in a state that does not expect it) are ignored and counted. Local
  inputs that do not fit the table (a second ``recover``, a commit result with no commit
  pending) raise ``ProtocolError``: they are bugs in the actor.
- Time is an input (``now`` in seconds, any monotonic clock); ``next_deadline()`` says when
  the actor should call ``tick`` next.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import msgspec

from rayconnect.protocol.commit_state import CommitState
from rayconnect.protocol.effects import (
    Broadcast,
    CommitTable,
    Fenced,
    Ready,
    ReloadTable,
    Send,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import TransitionTable
from rayconnect.protocol.messages import (
    AckCommit,
    EndCommit,
    Message,
    ParticipantStarted,
    RequestCommit,
    RoundLost,
    StartCommit,
    WriteStatus,
)
from rayconnect.protocol.settings import CommitSettings


class State(enum.Enum):
    IDLE = "idle"  # created; waits for recover()
    STARTED = "started"  # START sent; participants write
    ENDED = "ended"  # END sent; collecting WRITE-STATUS
    COMMITTING = "committing"  # CommitTable handed to the actor
    RELOADING = "reloading"  # commit failed; ReloadTable handed to the actor
    FENCED = "fenced"  # a newer epoch exists; this coordinator is finished


class Input(enum.Enum):
    RECOVER = "recover"
    TICK = "tick"
    WRITE_STATUS = "write_status"
    REQUEST_COMMIT = "request_commit"
    COMMIT_SUCCEEDED = "commit_succeeded"
    COMMIT_FAILED = "commit_failed"
    TABLE_RELOADED = "table_reloaded"
    SET_PARTITIONS = "set_partitions"
    ROUND_LOST = "round_lost"
    PARTICIPANT_STARTED = "participant_started"


_S = State
_I = Input

#: ACKED is not a resting state: commit_succeeded sends ACK and the next START in one step.
TRANSITIONS: Final = TransitionTable[State, Input](
    "coordinator",
    {
        _S.IDLE: {
            _I.RECOVER: {_S.STARTED},
            _I.TICK: {_S.IDLE},
            _I.SET_PARTITIONS: {_S.IDLE},
        },
        _S.STARTED: {
            # ENDED, or STARTED again when a round with no partitions ends vacuously
            _I.TICK: {_S.STARTED, _S.ENDED},
            _I.REQUEST_COMMIT: {_S.STARTED, _S.ENDED},
            _I.SET_PARTITIONS: {_S.STARTED},
            _I.ROUND_LOST: {_S.STARTED},  # noted; END will not wait for it
            _I.PARTICIPANT_STARTED: {_S.STARTED},  # it gets this round's START again
        },
        _S.ENDED: {
            # still waiting | commit (full or partial) | empty: next START |
            # timed out with no data: discard and reload the table
            _I.WRITE_STATUS: {_S.ENDED, _S.COMMITTING, _S.STARTED, _S.RELOADING},
            _I.TICK: {_S.ENDED, _S.COMMITTING, _S.STARTED, _S.RELOADING},
            _I.SET_PARTITIONS: {_S.ENDED, _S.COMMITTING, _S.STARTED, _S.RELOADING},
            # the last one awaited will never report: evaluate as if it had
            _I.ROUND_LOST: {_S.ENDED, _S.COMMITTING, _S.STARTED, _S.RELOADING},
            _I.PARTICIPANT_STARTED: {_S.ENDED, _S.COMMITTING, _S.STARTED, _S.RELOADING},
        },
        _S.COMMITTING: {
            _I.COMMIT_SUCCEEDED: {_S.STARTED},
            _I.COMMIT_FAILED: {_S.RELOADING},
            _I.TICK: {_S.COMMITTING},
            _I.SET_PARTITIONS: {_S.COMMITTING},
        },
        _S.RELOADING: {
            _I.TABLE_RELOADED: {_S.STARTED, _S.FENCED},
            _I.TICK: {_S.RELOADING},
            _I.SET_PARTITIONS: {_S.RELOADING},
        },
        _S.FENCED: {
            _I.TICK: {_S.FENCED},
            _I.SET_PARTITIONS: {_S.FENCED},
        },
    },
    ignorable={_I.WRITE_STATUS, _I.REQUEST_COMMIT, _I.ROUND_LOST, _I.PARTICIPANT_STARTED},
)


class CoordinatorStatus(msgspec.Struct, frozen=True):
    """What the dashboard shows; ``offsets`` are the committed offsets as last known."""

    pipeline: str
    state: str
    epoch: int
    txn_id: int
    partitions: tuple[str, ...]
    waiting_for: tuple[str, ...]
    offsets: dict[str, int]
    rounds_committed: int
    rounds_partial: int
    rounds_discarded: int
    rounds_empty: int
    rounds_requested: int  # rounds ended early by a REQUEST-COMMIT (KIP-89)
    statuses_rejected: int
    messages_ignored: int
    last_round_duration_s: float | None
    #: END of the last finished round to the START of the next: writing, WRITE-STATUS and
    #: the commit - the protocol's own cost of a round (participants read on meanwhile).
    last_end_to_start_s: float | None
    last_error: str | None


class Coordinator:
    """Drives the rounds of one pipeline; see the module docstring for the rules."""

    def __init__(
        self,
        pipeline: str,
        partitions: Iterable[str],
        config: CommitSettings | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.config = config or CommitSettings()
        self._partitions: frozenset[str] = frozenset(partitions)
        self._state = State.IDLE
        self._epoch = 0
        self._txn_id = 0
        self._offsets: dict[str, int] = {}
        self._round: CommitState | None = None
        self._pending: CommitTable | None = None
        self._committed = self._partial = self._discarded = self._empty = 0
        self._rejected = self._ignored = self._requested = 0
        self._last_duration: float | None = None
        self._last_end_to_start: float | None = None
        self._last_error: str | None = None

    # -- read-only views -------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def txn_id(self) -> int:
        return self._txn_id

    @property
    def offsets(self) -> dict[str, int]:
        """The committed offsets as the coordinator last learnt them from the table."""
        return dict(self._offsets)

    @property
    def round(self) -> CommitState | None:
        """The current round's bookkeeping (read it, do not change it)."""
        return self._round

    def next_deadline(self) -> float | None:
        """The time at which ``tick`` has something to do, or None."""
        if self._state in (State.STARTED, State.ENDED) and self._round is not None:
            return self._round.deadline()
        return None

    def status(self) -> CoordinatorStatus:
        rnd = self._round
        return CoordinatorStatus(
            pipeline=self.pipeline,
            state=self._state.value,
            epoch=self._epoch,
            txn_id=self._txn_id,
            partitions=tuple(sorted(self._partitions)),
            waiting_for=tuple(sorted(rnd.missing())) if rnd and rnd.is_ended else (),
            offsets=dict(self._offsets),
            rounds_committed=self._committed,
            rounds_partial=self._partial,
            rounds_discarded=self._discarded,
            rounds_empty=self._empty,
            rounds_requested=self._requested,
            statuses_rejected=self._rejected,
            messages_ignored=self._ignored,
            last_round_duration_s=self._last_duration,
            last_end_to_start_s=self._last_end_to_start,
            last_error=self._last_error,
        )

    # -- inputs ----------------------------------------------------------------------------

    def recover(self, epoch: int, table_offsets: Mapping[str, int], now: float) -> Ready:
        """The actor claimed ``epoch`` in the table and read its offsets: start round 1."""

        def handle() -> Ready:
            self._epoch = epoch
            self._offsets = dict(table_offsets)
            return self._start(now)

        return self._drive(Input.RECOVER, handle)

    def step(self, message: Message, now: float) -> Ready:
        """A message from a participant: WRITE-STATUS, REQUEST-COMMIT, ROUND-LOST or
        PARTICIPANT-STARTED."""
        if isinstance(message, WriteStatus):
            return self._drive(Input.WRITE_STATUS, lambda: self._on_status(message, now))
        if isinstance(message, RequestCommit):
            return self._drive(Input.REQUEST_COMMIT, lambda: self._on_request(message, now))
        if isinstance(message, RoundLost):
            return self._drive(Input.ROUND_LOST, lambda: self._on_lost(message, now))
        if isinstance(message, ParticipantStarted):
            return self._drive(
                Input.PARTICIPANT_STARTED, lambda: self._on_participant_started(message, now)
            )
        raise ProtocolError(f"coordinator does not take {type(message).__name__} messages")

    def tick(self, now: float) -> Ready:
        """Time passed: end the round, or give up waiting for WRITE-STATUS."""
        return self._drive(Input.TICK, lambda: self._on_tick(now))

    def commit_succeeded(self, version: int, now: float) -> Ready:
        """The ``CommitTable`` landed as table ``version``: ACK, then the next START."""

        def handle() -> Ready:
            commit, rnd = self._pending, self._round
            assert commit is not None and rnd is not None
            self._pending = None
            self._offsets.update(commit.offsets)
            self._committed += 1
            self._partial += int(commit.metadata["rayconnect.partial"] == "true")
            self._last_duration = now - rnd.started_at
            ack = AckCommit(
                epoch=self._epoch,
                txn_id=rnd.txn_id,
                version=version,
                offsets={k: v for k, v in self._offsets.items() if k in rnd.partitions},
            )
            ack_all = Broadcast(to=tuple(sorted(rnd.partitions)), message=ack)
            return [ack_all, *self._start(now, interval_from=rnd.ended_at)]

        return self._drive(Input.COMMIT_SUCCEEDED, handle)

    def commit_failed(self, reason: str, now: float) -> Ready:
        """The commit failed or timed out (whether it landed is unknown): reload the table."""

        def handle() -> Ready:
            self._pending = None
            self._discarded += 1
            self._last_error = reason
            self._state = State.RELOADING
            return [ReloadTable()]

        return self._drive(Input.COMMIT_FAILED, handle)

    def table_reloaded(
        self, table_offsets: Mapping[str, int], now: float, table_epoch: int | None = None
    ) -> Ready:
        """The table's offsets (and epoch, if the actor read it) after a failed commit.

        A ``table_epoch`` newer than ours means we are a zombie: emit ``Fenced`` and stop.
        """

        def handle() -> Ready:
            if table_epoch is not None and table_epoch > self._epoch:
                self._state = State.FENCED
                self._last_error = f"fenced by epoch {table_epoch}"
                return [Fenced(epoch=self._epoch, table_epoch=table_epoch)]
            self._offsets = dict(table_offsets)
            return self._start(now)

        return self._drive(Input.TABLE_RELOADED, handle)

    def set_partitions(self, keys: Iterable[str], now: float) -> Ready:
        """The pipeline's partitions now are ``keys``: new ones join at the next START,
        retired ones leave the current round now (which may complete it)."""

        def handle() -> Ready:
            self._partitions = frozenset(keys)
            rnd = self._round
            if rnd is None or self._state not in (State.STARTED, State.ENDED):
                return []
            rnd.retire(rnd.partitions - self._partitions)
            return self._evaluate(now) if self._state is State.ENDED else []

        return self._drive(Input.SET_PARTITIONS, handle)

    # -- handlers --------------------------------------------------------------------------

    def _drive(self, event: Input, handler: Callable[[], Ready]) -> Ready:
        return TRANSITIONS.drive(self._state, event, handler, lambda: self._state, self._ignore)

    def _ignore(self) -> Ready:
        self._ignored += 1
        return []

    def _on_status(self, status: WriteStatus, now: float) -> Ready:
        rnd = self._round
        assert rnd is not None
        if not rnd.is_current(status.epoch, status.txn_id):
            return self._ignore()
        reason = rnd.add_status(status)
        if reason == "duplicate":
            return self._ignore()
        if reason is not None:
            self._rejected += 1
            self._last_error = f"WRITE-STATUS of {status.partition} rejected: {reason}"
            return []
        return self._evaluate(now)

    def _on_lost(self, message: RoundLost, now: float) -> Ready:
        rnd = self._round
        assert rnd is not None
        if not rnd.is_current(message.epoch, message.txn_id) or not rnd.mark_lost(
            message.partition
        ):
            return self._ignore()
        self._last_error = f"txn {rnd.txn_id}: {message.partition} lost: {message.reason}"
        return self._evaluate(now) if self._state is State.ENDED else []

    def _on_participant_started(self, message: ParticipantStarted, now: float) -> Ready:
        """A fresh participant knows no round. While the round runs it can still join it
        (the START's offsets are the table's); once END went out it cannot report, so the
        round stops waiting for it."""
        rnd = self._round
        assert rnd is not None
        key = message.partition
        if key not in rnd.partitions:
            return self._ignore()
        if self._state is State.STARTED:
            start = StartCommit(epoch=self._epoch, txn_id=rnd.txn_id, offsets=rnd.start_offsets)
            return [Send(to=key, message=start)]
        if not rnd.mark_lost(key):
            return self._ignore()
        return self._evaluate(now)

    def _on_request(self, message: RequestCommit, now: float) -> Ready:
        rnd = self._round
        assert rnd is not None
        if not rnd.request_commit(message):
            return self._ignore()
        self._requested += 1
        return self._end(now)

    def _on_tick(self, now: float) -> Ready:
        rnd = self._round
        if self._state is State.STARTED and rnd is not None and rnd.should_end(now):
            return self._end(now)
        if self._state is State.ENDED:
            return self._evaluate(now)
        return []

    # -- the round ---------------------------------------------------------------------------

    def _start(self, now: float, interval_from: float | None = None) -> Ready:
        if interval_from is not None:
            self._last_end_to_start = now - interval_from
        self._txn_id += 1
        rnd = CommitState(
            epoch=self._epoch,
            txn_id=self._txn_id,
            partitions=self._partitions,
            start_offsets=self._offsets,
            started_at=now,
            interval_from=interval_from,
            commit_interval_s=self.config.commit_interval_s,
            write_timeout_s=self.config.write_timeout_s,
        )
        self._round = rnd
        self._state = State.STARTED
        start = StartCommit(epoch=self._epoch, txn_id=self._txn_id, offsets=rnd.start_offsets)
        return [Broadcast(to=tuple(sorted(rnd.partitions)), message=start)]

    def _end(self, now: float) -> Ready:
        rnd = self._round
        assert rnd is not None
        rnd.end(now)
        self._state = State.ENDED
        end = EndCommit(epoch=self._epoch, txn_id=rnd.txn_id)
        return [Broadcast(to=tuple(sorted(rnd.partitions)), message=end), *self._evaluate(now)]

    def _evaluate(self, now: float) -> Ready:
        """In ENDED: commit when everyone reported or time is up; else keep waiting."""
        rnd = self._round
        assert rnd is not None
        if not rnd.is_commit_ready() and not rnd.is_commit_timed_out(now):
            return []
        if rnd.has_data():
            self._pending = rnd.commit_table(self.pipeline)
            self._state = State.COMMITTING
            return [self._pending]
        if rnd.is_commit_ready():
            self._empty += 1
            return self._start(now, interval_from=rnd.ended_at)
        # Timed out with nothing to commit: discard, and start again *from the table*
        # (design.md step 4). Reloading is also how a coordinator whose participants all
        # follow a newer epoch learns that it has been fenced.
        self._discarded += 1
        self._last_error = f"txn {rnd.txn_id}: no data from {sorted(rnd.statuses)}, " + (
            f"timed out waiting for {sorted(rnd.missing())}"
        )
        self._state = State.RELOADING
        return [ReloadTable()]
