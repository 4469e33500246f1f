"""The life of one exactly-once source task (KIP-618), pure.

Theory of operation
-------------------
A source task owns one transactional producer. Its life is seed 000's loop, made explicit:

1. ``start``: initialise transactions first (InitProducerId). That bumps the producer epoch
   of the task's transactional id, which fences any zombie of the same task and aborts the
   transaction it left open - so the committed offsets read next are final.
2. ``initialized``: the actor has read the committed offsets and started the user task; the
   machine asks for the first ``Poll``.
3. ``polled``: a ``PollResult`` came back: each record's source offset and the task's
   transaction requests. The machine cuts it into *segments* (a connector boundary may end
   a transaction after any record, so one poll can hold several transactions). For each
   segment: ``BeginTransaction`` if none is open, ``Send`` its records, remember its source
   offsets. When the boundary says so: ``SendOffsets`` (offsets after records, in the same
   transaction) then ``CommitTransaction`` - and the machine waits for ``committed``.
   Nothing else may happen while a commit is in flight: above all no poll (``polled`` in
   COMMITTING is a ProtocolError), because a task may only be asked to ``commit()`` up to
   what it returned from ``poll()``.
4. ``committed``: ``Acknowledge`` the transaction's records (the actor calls
   ``commit_record`` and ``commit()`` on the task), then go on with the rest of the poll's
   segments, or ``Poll`` again.
5. A record that cannot be sent (``send_failed`` with its ``Failure`` kind) interrupts its
   ``Send``: a ``BAD_RECORD`` goes to the dead-letter topic (``SendToDeadLetter``, in the
   open transaction, so it is there exactly once with its source offset) and the rest of
   the interrupted Ready follows; without a dead-letter topic the task fails for good
   (``Fail(permanent=True)``): a restart would only meet the same record again.
6. Any other failure: ``AbortTransaction`` (best effort, if one is open) and ``Fail``. The
   task is not retried in place: the actor dies, Ray restarts it, and step 1 fences the dead
   incarnation and resumes from the offsets that did commit. A ``FENCED`` failure skips the
   abort: a newer incarnation owns the transactional id, and tansu never answers a zombie's
   EndTxn.

Boundaries (``transaction_boundary``): ``poll`` - every non-empty poll is one transaction;
``interval`` - a transaction is committed at the first poll result at least
``interval_s`` after it began (time is an input: every input carries ``now``, the machine
never reads a clock); ``connector`` - the task decides through its TransactionContext; a
segment then ends with ``COMMIT`` or ``ABORT``.

Stopping: ``stop`` only sets a flag (the actor may be waiting on a poll or a commit); the
next result input finishes the job: with ``poll``/``interval`` the open transaction is
committed first; with ``connector`` it is aborted, since only the task may say where a
transaction ends (Kafka 3.3 does the same).

Every input returns a ``Ready``: the effects to carry out in order, and ``report``, the one
result the machine waits for next (``Report.NONE``: closed or failed, stop driving). The
actor's loop is: carry out a Ready, feed back the result ``report`` names, repeat.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, TypeAlias

import msgspec

from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import TransitionTable

Boundary = Literal["poll", "interval", "connector"]
BOUNDARIES: Final = ("poll", "interval", "connector")

#: how a ``Fail`` for a record without a dead-letter topic ends its reason
NO_DEAD_LETTER_TOPIC: Final = "(no dead_letter_topic: the task stops)"


class SourceTaskConfig(msgspec.Struct, frozen=True):
    """How transactions are cut (``interval_s`` is for the ``interval`` boundary only) and
    whether a record that cannot be written has a dead-letter topic to go to. No defaults
    here: they are the source pipeline's settings' (``SourceSettings``), written once."""

    boundary: Boundary
    interval_s: float
    dead_letter: bool

    def __post_init__(self) -> None:
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"transaction boundary must be one of {BOUNDARIES}")
        if self.interval_s <= 0:
            raise ValueError("transaction boundary interval must be > 0")


class End(enum.Enum):
    """How a connector-defined segment ends its transaction."""

    COMMIT = "commit"
    ABORT = "abort"


class Failure(enum.Enum):
    """What kind of failure the actor saw; the machine decides what it means."""

    ERROR = "error"  # anything else: abort (best effort) and fail; a restart resumes
    FENCED = "fenced"  # a newer incarnation took the transactional id: fail, no abort
    BAD_RECORD = "bad_record"  # this record cannot be written: dead letter, else stop


class PollResult(msgspec.Struct, frozen=True):
    """What one poll returned, as far as the machine needs it.

    ``offsets`` has one entry per record, in order: ``(encoded source partition, source
    offset)``, or None for a record without a source partition (it commits no offset).
    ``ends`` are the task's transaction requests in order (``connector`` boundary only):
    ``(End, n)`` ends the transaction after the poll's first ``n`` records.
    """

    offsets: Sequence[tuple[str, Any] | None] = ()
    ends: Sequence[tuple[End, int]] = ()


class Segment(msgspec.Struct, frozen=True):
    """Records ``[start, stop)`` of poll ``poll_id``, the newest source offset of each
    source partition among them, and whether the task asked to end the transaction after
    them."""

    poll_id: int
    start: int
    stop: int
    offsets: dict[str, Any] = {}
    end: End | None = None

    @property
    def count(self) -> int:
        return self.stop - self.start


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
    """Send records ``[start, stop)`` of poll ``poll_id`` to Kafka, in the open transaction.
    A record that cannot be sent stops the Ready there: report ``send_failed``."""

    poll_id: int
    start: int
    stop: int


class SendToDeadLetter(_Effect):
    """Send record ``index`` of poll ``poll_id`` to the dead-letter topic with ``reason``,
    in the open transaction (it stands for the record in ``commit_record``)."""

    poll_id: int
    index: int
    reason: str


class SendOffsets(_Effect):
    """Write the source offsets to the offsets topic, in the open transaction."""

    offsets: dict[str, Any]


class CommitTransaction(_Effect):
    """Wait for every send, then commit; report ``committed`` or ``commit_failed``."""

    txn: int


class AbortTransaction(_Effect):
    """Abort the open transaction. Requested (``best_effort`` False): it must work, report
    ``aborted``. On the way to a ``Fail`` (True): try briefly, ignore a failure."""

    txn: int
    best_effort: bool = False


class Acknowledge(_Effect):
    """The transaction committed: ``commit_record`` for each record sent in it, then
    ``task.commit()``; the records of ``ranges`` (``(poll_id, start, stop)``) are done."""

    ranges: tuple[tuple[int, int, int], ...]


class Discard(_Effect):
    """The transaction was aborted on the task's request: forget these records."""

    ranges: tuple[tuple[int, int, int], ...]


class Close(_Effect):
    """Stopped cleanly: stop the task and the producer."""


class Fail(_Effect):
    """Stop, and fail the task (the actor raises). ``permanent``: a record that no restart
    can get past - the actor stays up, failed, instead of being restarted into it."""

    reason: str
    permanent: bool = False


Effect: TypeAlias = (
    InitTransactions
    | Poll
    | BeginTransaction
    | Send
    | SendToDeadLetter
    | SendOffsets
    | CommitTransaction
    | AbortTransaction
    | Acknowledge
    | Discard
    | Close
    | Fail
)


class Report(enum.Enum):
    """The one result the machine waits for after a Ready (and the effect it comes from)."""

    INIT = "init"  # of InitTransactions: initialized / failed
    POLL = "poll"  # of Poll: polled / failed
    COMMIT = "commit"  # of CommitTransaction: committed / commit_failed
    ABORT = "abort"  # of a requested AbortTransaction: aborted / failed
    NONE = "none"  # closed or failed: stop driving


class Ready(msgspec.Struct):
    """Effects to carry out in order, then the result to feed back (see ``Report``)."""

    effects: list[Effect]
    report: Report


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
    SEND_FAILED = "send_failed"
    COMMITTED = "committed"
    COMMIT_FAILED = "commit_failed"
    ABORTED = "aborted"
    FAILED = "failed"
    STOP = "stop"


_S = State
_I = Input
_AFTER_RESULT = {_S.POLLING, _S.COMMITTING, _S.ABORTING, _S.CLOSED, _S.FAILED}

#: Anything not listed is impossible and raises ProtocolError: a task is driven only by its
#: own actor, so an unexpected input is a wiring bug, never a network condition. A
#: ``send_failed`` may come after any Ready that sent records: the machine either stays
#: (the record went to the dead-letter topic) or fails.
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
            _I.SEND_FAILED: {_S.POLLING, _S.FAILED},
            _I.FAILED: {_S.FAILED},
            _I.STOP: {_S.POLLING},
        },
        _S.COMMITTING: {
            _I.COMMITTED: _AFTER_RESULT - {_S.FAILED},
            _I.COMMIT_FAILED: {_S.FAILED},
            _I.SEND_FAILED: {_S.COMMITTING, _S.FAILED},
            _I.FAILED: {_S.FAILED},
            _I.STOP: {_S.COMMITTING},
        },
        _S.ABORTING: {
            _I.ABORTED: _AFTER_RESULT - {_S.FAILED},
            _I.SEND_FAILED: {_S.ABORTING, _S.FAILED},
            _I.FAILED: {_S.FAILED},
            _I.STOP: {_S.ABORTING},
        },
        _S.CLOSED: {_I.STOP: {_S.CLOSED}},
        _S.FAILED: {_I.STOP: {_S.FAILED}},
    },
    ignorable=(),
)

_REPORT: Final = {
    State.NEW: Report.NONE,
    State.INITIALIZING: Report.INIT,
    State.POLLING: Report.POLL,
    State.COMMITTING: Report.COMMIT,
    State.ABORTING: Report.ABORT,
    State.CLOSED: Report.NONE,
    State.FAILED: Report.NONE,
}


class SourceTaskStatus(msgspec.Struct, frozen=True):
    state: str
    transactions_committed: int
    transactions_aborted: int
    records_polled: int
    records_sent: int
    records_committed: int
    dead_letters: int
    polls: int
    committed_offsets: dict[str, Any]
    last_error: str | None
    #: why a record could not be written and had nowhere to go (the task stopped for good)
    bad_record: str | None


class SourceTaskMachine:
    """One task's transaction lifecycle; see the module docstring."""

    def __init__(self, config: SourceTaskConfig) -> None:
        self.config = config
        self._state = State.NEW
        self._stopping = False
        self._poll_id = -1
        self._txn = 0  # id of the open (or last) transaction
        self._txn_open = False
        self._txn_began: float = 0.0
        self._txn_ranges: list[tuple[int, int, int]] = []
        self._txn_records = 0
        self._pending_offsets: dict[str, Any] = {}
        #: segments of the current poll not yet handed out (after a mid-poll commit/abort)
        self._queue: list[Segment] = []
        #: the effects of the last Ready: a ``send_failed`` resumes what follows its Send
        self._last: list[Effect] = []
        self._committed_offsets: dict[str, Any] = {}
        self._committed = self._aborted = 0
        self._records_polled = self._records_sent = self._records_committed = 0
        self._dead_letters = 0
        self._last_error: str | None = None
        self._bad_record: str | None = None

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

    @property
    def bad_record(self) -> str | None:
        return self._bad_record

    def status(self) -> SourceTaskStatus:
        return SourceTaskStatus(
            state=self._state.value,
            transactions_committed=self._committed,
            transactions_aborted=self._aborted,
            records_polled=self._records_polled,
            records_sent=self._records_sent,
            records_committed=self._records_committed,
            dead_letters=self._dead_letters,
            polls=self._poll_id + 1,
            committed_offsets=dict(self._committed_offsets),
            last_error=self._last_error,
            bad_record=self._bad_record,
        )

    # -- inputs ----------------------------------------------------------------------------

    def start(self, now: float) -> Ready:
        def handler() -> list[Effect]:
            self._state = State.INITIALIZING
            return [InitTransactions()]

        return self._drive(_I.START, handler)

    def initialized(self, committed_offsets: dict[str, Any], now: float) -> Ready:
        """Transactions are initialised and the task started from ``committed_offsets``."""

        def handler() -> list[Effect]:
            self._committed_offsets = dict(committed_offsets)
            if self._stopping:
                self._state = State.CLOSED
                return [Close()]
            return self._poll()

        return self._drive(_I.INITIALIZED, handler)

    def polled(self, result: PollResult, now: float) -> Ready:
        """The poll came back with ``result`` (no records: nothing new)."""

        def handler() -> list[Effect]:
            if self.config.boundary != "connector" and result.ends:
                raise ProtocolError(
                    f"source task: a transaction end was requested with boundary "
                    f"{self.config.boundary!r}; only 'connector' lets the task decide"
                )
            self._records_polled += len(result.offsets)
            self._queue = _cut(self._poll_id, result)
            return self._drain(now)

        return self._drive(_I.POLLED, handler)

    def send_failed(
        self, poll_id: int, index: int, kind: Failure, reason: str, now: float
    ) -> Ready:
        """Record ``index`` of poll ``poll_id`` could not be sent; the effects after it in
        the last Ready were not carried out."""

        def handler() -> list[Effect]:
            at = self._interrupted_send(poll_id, index)
            if kind is not Failure.BAD_RECORD:
                return self._fail(reason, kind)
            if not self.config.dead_letter:
                self._bad_record = reason
                return self._fail(f"BadRecord: {reason} {NO_DEAD_LETTER_TOPIC}", kind)
            self._dead_letters += 1
            send = self._last[at]
            assert isinstance(send, Send)
            rest: list[Effect] = [SendToDeadLetter(poll_id, index, reason)]
            if index + 1 < send.stop:
                rest.append(Send(poll_id, index + 1, send.stop))
            return rest + self._last[at + 1 :]

        return self._drive(_I.SEND_FAILED, handler)

    def committed(self, now: float) -> Ready:
        def handler() -> list[Effect]:
            acked = tuple(self._txn_ranges)
            self._committed += 1
            self._records_committed += self._txn_records
            self._close_txn()
            return [Acknowledge(acked), *self._drain(now)]

        return self._drive(_I.COMMITTED, handler)

    def commit_failed(self, reason: str, now: float, kind: Failure = Failure.ERROR) -> Ready:
        """The commit did not succeed: abort and fail (seed 000: never log and move on)."""
        return self._drive(_I.COMMIT_FAILED, lambda: self._fail(f"commit failed: {reason}", kind))

    def aborted(self, now: float) -> Ready:
        """A connector-requested abort is done; its records and offsets are gone."""

        def handler() -> list[Effect]:
            dropped = tuple(self._txn_ranges)
            self._aborted += 1
            self._close_txn()
            return [Discard(dropped), *self._drain(now)]

        return self._drive(_I.ABORTED, handler)

    def failed(self, reason: str, now: float, kind: Failure = Failure.ERROR) -> Ready:
        """A poll, init, abort or other IO went wrong: abort what is open (unless fenced),
        then fail. A bad record is only known from a Send (``send_failed``)."""
        if kind is Failure.BAD_RECORD:
            raise ProtocolError("source task: a bad record is reported by send_failed")
        return self._drive(_I.FAILED, lambda: self._fail(reason, kind))

    def stop(self, now: float) -> Ready:
        """Ask to stop; acted on at the next result (or at once if nothing is in flight)."""

        def handler() -> list[Effect]:
            self._stopping = True
            if self._state is State.NEW:
                self._state = State.CLOSED
                return [Close()]
            return []

        return self._drive(_I.STOP, handler)

    # -- internals -------------------------------------------------------------------------

    def _drive(self, event: Input, handler: Callable[[], list[Effect]]) -> Ready:
        effects = TRANSITIONS.drive(self._state, event, handler, lambda: self._state, list)
        if event is not Input.STOP:
            self._last = effects
        return Ready(effects, _REPORT[self._state])

    def _interrupted_send(self, poll_id: int, index: int) -> int:
        """Where in the last Ready the Send of that record is (else: a wiring bug)."""
        for at, effect in enumerate(self._last):
            if (
                isinstance(effect, Send)
                and effect.poll_id == poll_id
                and effect.start <= index < effect.stop
            ):
                return at
        raise ProtocolError(
            f"source task: record {index} of poll {poll_id} was not sent by the last Ready"
        )

    def _poll(self) -> list[Effect]:
        self._poll_id += 1
        self._state = State.POLLING
        return [Poll(self._poll_id)]

    def _drain(self, now: float) -> list[Effect]:
        """Hand out queued segments until one ends a transaction; then poll (or stop)."""
        ready: list[Effect] = []
        while self._queue:
            seg = self._queue.pop(0)
            if seg.count > 0:
                if not self._txn_open:
                    self._txn += 1
                    self._txn_open = True
                    self._txn_began = now
                    ready.append(BeginTransaction(self._txn))
                ready.append(Send(seg.poll_id, seg.start, seg.stop))
                self._txn_ranges.append((seg.poll_id, seg.start, seg.stop))
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

    def _commit(self) -> list[Effect]:
        self._state = State.COMMITTING
        ready: list[Effect] = []
        if self._pending_offsets:
            ready.append(SendOffsets(dict(self._pending_offsets)))
        ready.append(CommitTransaction(self._txn))
        return ready

    def _close_txn(self) -> None:
        if self._state is State.COMMITTING:
            self._committed_offsets.update(self._pending_offsets)
        self._txn_open = False
        self._txn_ranges = []
        self._txn_records = 0
        self._pending_offsets = {}

    def _fail(self, reason: str, kind: Failure) -> list[Effect]:
        """Abort what is open - unless a requested abort is what failed, or the producer
        is fenced - then fail; for good if the cause is a record no restart gets past."""
        self._last_error = reason
        ready: list[Effect] = []
        if self._txn_open and self._state is not State.ABORTING and kind is not Failure.FENCED:
            ready.append(AbortTransaction(self._txn, best_effort=True))
        self._txn_open = False
        self._queue = []
        self._state = State.FAILED
        return [*ready, Fail(reason, permanent=kind is Failure.BAD_RECORD)]


def _cut(poll_id: int, result: PollResult) -> list[Segment]:
    """The poll's records as segments, one per transaction request plus the rest (a poll
    without records or requests is one empty segment)."""
    n = len(result.offsets)
    segments: list[Segment] = []
    start = 0
    for end, stop in result.ends:
        if not start <= stop <= n:
            raise ProtocolError(
                f"source task: a transaction end after record {stop} of a poll of {n}, "
                f"the previous one after {start}"
            )
        segments.append(_segment(poll_id, start, stop, result.offsets, end))
        start = stop
    if start < n or not segments:
        segments.append(_segment(poll_id, start, n, result.offsets, None))
    return segments


def _segment(
    poll_id: int,
    start: int,
    stop: int,
    offsets: Sequence[tuple[str, Any] | None],
    end: End | None,
) -> Segment:
    newest: dict[str, Any] = {}
    for i in range(start, stop):
        entry = offsets[i]
        if entry is not None:
            newest[entry[0]] = entry[1]
    return Segment(poll_id, start, stop, newest, end)


def describe() -> str:
    """The transition table as text (for docs and debugging)."""
    return TRANSITIONS.describe()
