"""The life of one exactly-once source task (KIP-618), pure.

Theory of operation
-------------------
A source task owns one transactional producer. Its life is seed 000's loop, made explicit:

1. ``start``: initialise transactions first (InitProducerId). That bumps the producer epoch
   of the task's transactional id, which fences any zombie of the same task and aborts the
   transaction it left open - so the committed offsets read next are final.
2. ``initialized``: the actor has read the committed offsets and started the user task; the
   machine asks for the first ``Poll``.
3. ``polled``: records came back, split into *segments* (a connector boundary may end a
   transaction after any record, so one poll can hold several transactions). For each
   segment: ``BeginTransaction`` if none is open, ``Send`` its records, remember its source
   offsets. When the boundary says so: ``SendOffsets`` (offsets after records, in the same
   transaction) then ``CommitTransaction`` - and the machine waits for ``committed``.
   Nothing else may happen while a commit is in flight: above all no poll (``polled`` in
   COMMITTING is a ProtocolError), because a task may only be asked to ``commit()`` up to
   what it returned from ``poll()``.
4. ``committed``: ``Acknowledge`` the transaction's segments (the actor calls
   ``commit_record`` and ``commit()`` on the task), then go on with the rest of the poll's
   segments, or ``Poll`` again.
5. A failed send or commit: ``AbortTransaction`` (if one is open) and ``Fail``. The task is
   not retried in place: the actor dies, Ray restarts it, and step 1 fences the dead
   incarnation and resumes from the offsets that did commit.

Boundaries (``transaction_boundary``): ``poll`` - every non-empty poll is one transaction;
``interval`` - a transaction is committed at the first poll result at least
``interval_s`` after it began (time is an input: ``now``); ``connector`` - the task decides
through its TransactionContext; a segment then ends with ``COMMIT`` or ``ABORT``.

Stopping: ``stop`` only sets a flag (the actor may be waiting on a poll or a commit); the
next result input finishes the job: with ``poll``/``interval`` the open transaction is
committed first; with ``connector`` it is aborted, since only the task may say where a
transaction ends (Kafka 3.3 does the same).

Every effect that the actor must report back on (InitTransactions, Poll,
CommitTransaction, AbortTransaction) is the last effect of its Ready, so the actor's loop
is: carry out a Ready in order, feed the one result back, repeat.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final, Literal, TypeAlias

import msgspec

from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import TransitionTable

Boundary = Literal["poll", "interval", "connector"]
BOUNDARIES: Final = ("poll", "interval", "connector")


class SourceTaskConfig(msgspec.Struct, frozen=True):
    """How transactions are cut; ``interval_s`` is used by the ``interval`` boundary only."""

    boundary: Boundary = "poll"
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"transaction boundary must be one of {BOUNDARIES}")
        if self.interval_s <= 0:
            raise ValueError("transaction boundary interval must be > 0")


class End(enum.Enum):
    """How a connector-defined segment ends its transaction."""

    COMMIT = "commit"
    ABORT = "abort"


class Segment(msgspec.Struct, frozen=True):
    """A run of a poll's records: their count, the newest source offset of each source
    partition among them (keys are encoded partitions, values opaque), and whether the
    task asked to end the transaction after the segment's last record."""

    count: int
    offsets: dict[str, Any] = {}
    end: End | None = None


# -- effects ------------------------------------------------------------------------------


class _Effect(msgspec.Struct, frozen=True, tag=True):
    pass


class InitTransactions(_Effect):
    """Initialise the producer (fences zombies); report ``initialized`` or ``failed``."""


class Poll(_Effect):
    """Call ``task.poll()``; report ``polled`` (or ``failed``). ``poll_id`` numbers polls."""

    poll_id: int


class BeginTransaction(_Effect):
    txn: int


class Send(_Effect):
    """Send segment ``segment`` of poll ``poll_id`` to Kafka (in the open transaction)."""

    poll_id: int
    segment: int


class SendOffsets(_Effect):
    """Write the source offsets to the offsets topic, in the open transaction."""

    offsets: dict[str, Any]


class CommitTransaction(_Effect):
    """Wait for every send, then commit; report ``committed`` or ``commit_failed``."""

    txn: int


class AbortTransaction(_Effect):
    """Abort the open transaction; report ``aborted`` (or ``failed``) unless followed by Fail."""

    txn: int


class Acknowledge(_Effect):
    """The transaction committed: ``commit_record`` for each record of these
    ``(poll_id, segment)`` pairs, then ``task.commit()``."""

    segments: tuple[tuple[int, int], ...]


class Discard(_Effect):
    """The transaction was aborted on the task's request: forget these segments' records."""

    segments: tuple[tuple[int, int], ...]


class Close(_Effect):
    """Stopped cleanly: stop the task and the producer."""


class Fail(_Effect):
    """Stop, and fail the task (the actor raises; Ray restarts it)."""

    reason: str


Effect: TypeAlias = (
    InitTransactions
    | Poll
    | BeginTransaction
    | Send
    | SendOffsets
    | CommitTransaction
    | AbortTransaction
    | Acknowledge
    | Discard
    | Close
    | Fail
)
Ready: TypeAlias = list[Effect]


# -- states and the transition table --------------------------------------------------------


class State(enum.Enum):
    NEW = "new"
    INITIALIZING = "initializing"  # InitTransactions in flight
    POLLING = "polling"  # a poll in flight
    COMMITTING = "committing"  # a commit in flight: no poll
    ABORTING = "aborting"  # a connector-requested abort in flight: no poll
    CLOSED = "closed"
    FAILED = "failed"


class Input(enum.Enum):
    START = "start"
    INITIALIZED = "initialized"
    POLLED = "polled"
    COMMITTED = "committed"
    COMMIT_FAILED = "commit_failed"
    ABORTED = "aborted"
    FAILED = "failed"
    STOP = "stop"


_S = State
_I = Input
_AFTER_RESULT = {_S.POLLING, _S.COMMITTING, _S.ABORTING, _S.CLOSED, _S.FAILED}

#: Anything not listed is impossible and raises ProtocolError: a task is driven only by its
#: own actor, so an unexpected input is a wiring bug, never a network condition.
TRANSITIONS: Final = TransitionTable[State, Input](
    "source task",
    {
        _S.NEW: {_I.START: {_S.INITIALIZING}, _I.STOP: {_S.CLOSED}},
        _S.INITIALIZING: {
            _I.INITIALIZED: {_S.POLLING, _S.CLOSED},
            _I.FAILED: {_S.FAILED},
            _I.STOP: {_S.INITIALIZING},
        },
        _S.POLLING: {
            _I.POLLED: _AFTER_RESULT - {_S.FAILED},
            _I.FAILED: {_S.FAILED},
            _I.STOP: {_S.POLLING},
        },
        _S.COMMITTING: {
            _I.COMMITTED: _AFTER_RESULT - {_S.FAILED},
            _I.COMMIT_FAILED: {_S.FAILED},
            _I.FAILED: {_S.FAILED},
            _I.STOP: {_S.COMMITTING},
        },
        _S.ABORTING: {
            _I.ABORTED: _AFTER_RESULT - {_S.FAILED},
            _I.FAILED: {_S.FAILED},
            _I.STOP: {_S.ABORTING},
        },
        _S.CLOSED: {_I.STOP: {_S.CLOSED}},
        _S.FAILED: {_I.STOP: {_S.FAILED}},
    },
    ignorable=(),
)


class SourceTaskStatus(msgspec.Struct, frozen=True):
    state: str
    transactions_committed: int
    transactions_aborted: int
    records_sent: int
    records_committed: int
    polls: int
    committed_offsets: dict[str, Any]
    last_error: str | None


class SourceTaskMachine:
    """One task's transaction lifecycle; see the module docstring."""

    def __init__(self, config: SourceTaskConfig | None = None) -> None:
        self.config = config or SourceTaskConfig()
        self._state = State.NEW
        self._stopping = False
        self._poll_id = -1
        self._txn = 0  # id of the open (or last) transaction
        self._txn_open = False
        self._txn_began: float = 0.0
        self._txn_segments: list[tuple[int, int]] = []
        self._txn_records = 0
        self._pending_offsets: dict[str, Any] = {}
        #: segments of the current poll not yet handed out (after a mid-poll commit/abort)
        self._queue: list[tuple[int, int, Segment]] = []
        self._committed_offsets: dict[str, Any] = {}
        self._committed = self._aborted = 0
        self._records_sent = self._records_committed = 0
        self._last_error: str | None = None

    # -- read-only views -----------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def in_transaction(self) -> bool:
        return self._txn_open

    @property
    def stopping(self) -> bool:
        return self._stopping

    def status(self) -> SourceTaskStatus:
        return SourceTaskStatus(
            state=self._state.value,
            transactions_committed=self._committed,
            transactions_aborted=self._aborted,
            records_sent=self._records_sent,
            records_committed=self._records_committed,
            polls=self._poll_id + 1,
            committed_offsets=dict(self._committed_offsets),
            last_error=self._last_error,
        )

    # -- inputs ----------------------------------------------------------------------------

    def start(self, now: float) -> Ready:
        def handler() -> Ready:
            self._state = State.INITIALIZING
            return [InitTransactions()]

        return self._drive(_I.START, handler)

    def initialized(self, committed_offsets: dict[str, Any], now: float) -> Ready:
        """Transactions are initialised and the task started from ``committed_offsets``."""

        def handler() -> Ready:
            self._committed_offsets = dict(committed_offsets)
            if self._stopping:
                self._state = State.CLOSED
                return [Close()]
            return self._poll()

        return self._drive(_I.INITIALIZED, handler)

    def polled(self, segments: list[Segment] | tuple[Segment, ...], now: float) -> Ready:
        """The poll came back with ``segments`` (empty: nothing new)."""

        def handler() -> Ready:
            if self.config.boundary != "connector" and any(s.end for s in segments):
                raise ProtocolError(
                    f"source task: a transaction end was requested with boundary "
                    f"{self.config.boundary!r}; only 'connector' lets the task decide"
                )
            self._queue = [(self._poll_id, i, s) for i, s in enumerate(segments)]
            return self._drain(now)

        return self._drive(_I.POLLED, handler)

    def committed(self, now: float) -> Ready:
        def handler() -> Ready:
            acked = tuple(self._txn_segments)
            self._committed += 1
            self._records_committed += self._txn_records
            self._close_txn()
            return [Acknowledge(acked), *self._drain(now)]

        return self._drive(_I.COMMITTED, handler)

    def commit_failed(self, reason: str, now: float) -> Ready:
        """The commit did not succeed: abort and fail (seed 000: never log and move on)."""

        def handler() -> Ready:
            return self._fail(f"commit failed: {reason}")

        return self._drive(_I.COMMIT_FAILED, handler)

    def aborted(self, now: float) -> Ready:
        """A connector-requested abort is done; its records and offsets are gone."""

        def handler() -> Ready:
            dropped = tuple(self._txn_segments)
            self._aborted += 1
            self._close_txn()
            return [Discard(dropped), *self._drain(now)]

        return self._drive(_I.ABORTED, handler)

    def failed(self, reason: str, now: float) -> Ready:
        """A send, poll, init or abort went wrong: abort what is open, then fail."""
        return self._drive(_I.FAILED, lambda: self._fail(reason))

    def stop(self, now: float) -> Ready:
        """Ask to stop; acted on at the next result (or at once if nothing is in flight)."""

        def handler() -> Ready:
            self._stopping = True
            if self._state is State.NEW:
                self._state = State.CLOSED
                return [Close()]
            return []

        return self._drive(_I.STOP, handler)

    # -- internals -------------------------------------------------------------------------

    def _drive(self, event: Input, handler: Callable[[], Ready]) -> Ready:
        return TRANSITIONS.drive(self._state, event, handler, lambda: self._state, list)

    def _poll(self) -> Ready:
        self._poll_id += 1
        self._state = State.POLLING
        return [Poll(self._poll_id)]

    def _drain(self, now: float) -> Ready:
        """Hand out queued segments until one ends a transaction; then poll (or stop)."""
        ready: Ready = []
        while self._queue:
            poll_id, index, seg = self._queue.pop(0)
            if seg.count > 0:
                if not self._txn_open:
                    self._txn += 1
                    self._txn_open = True
                    self._txn_began = now
                    ready.append(BeginTransaction(self._txn))
                ready.append(Send(poll_id, index))
                self._txn_segments.append((poll_id, index))
                self._txn_records += seg.count
                self._records_sent += seg.count
                self._pending_offsets.update(seg.offsets)
            if seg.end is End.COMMIT and self._txn_open:
                return ready + self._commit()
            if seg.end is End.ABORT and self._txn_open:
                self._state = State.ABORTING
                return ready + [AbortTransaction(self._txn)]
        if self._txn_open and (self._stopping or self._boundary_reached(now)):
            if self._stopping and self.config.boundary == "connector":
                self._state = State.ABORTING
                return ready + [AbortTransaction(self._txn)]
            return ready + self._commit()
        if self._stopping:
            self._state = State.CLOSED
            return ready + [Close()]
        return ready + self._poll()

    def _boundary_reached(self, now: float) -> bool:
        if self.config.boundary == "poll":
            return True
        if self.config.boundary == "interval":
            return now - self._txn_began >= self.config.interval_s
        return False

    def _commit(self) -> Ready:
        self._state = State.COMMITTING
        ready: Ready = []
        if self._pending_offsets:
            ready.append(SendOffsets(dict(self._pending_offsets)))
        ready.append(CommitTransaction(self._txn))
        return ready

    def _close_txn(self) -> None:
        if self._state is State.COMMITTING:
            self._committed_offsets.update(self._pending_offsets)
        self._txn_open = False
        self._txn_segments = []
        self._txn_records = 0
        self._pending_offsets = {}

    def _fail(self, reason: str) -> Ready:
        self._last_error = reason
        ready: Ready = []
        if self._txn_open and self._state is not State.ABORTING:
            ready.append(AbortTransaction(self._txn))
        self._txn_open = False
        self._queue = []
        self._state = State.FAILED
        return [*ready, Fail(reason)]


def describe() -> str:
    """The transition table as text (for docs and debugging)."""
    return TRANSITIONS.describe()
