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
   segment: ``BeginTransaction`` if none is open, ``ProduceSegment`` (send its records),
   remember its source offsets. When the boundary says so: ``SendOffsets`` (offsets after
   records, in the same transaction) then ``CommitTransaction`` - and the machine waits for
   ``committed``. Nothing else may happen while a commit is in flight: above all no poll
   (``polled`` in COMMITTING is a ProtocolError), because a task may only be asked to
   ``commit()`` up to what it returned from ``poll()``.
4. ``committed``: ``Acknowledge`` the transaction's records (the actor calls
   ``commit_record`` and ``commit()`` on the task), then go on with the rest of the poll's
   segments, or ``Poll`` again.
5. A record that cannot be sent (``send_failed`` with its ``Failure`` kind) interrupts its
   ``ProduceSegment``: a ``BAD_RECORD`` goes to the dead-letter topic
   (``SendToDeadLetter``, in the open transaction, so it is there exactly once with its
   source offset) and the rest of the interrupted Ready follows; without a dead-letter
   topic the task fails for good (``Fail(permanent=True)``): a restart would only meet the
   same record again.
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

The table (``TRANSITIONS``, a ``MoveTable``) makes every move: an input is first an *event*
(a result accepted in the one state that waits for it, then what goes in flight next: POLL,
COMMIT, ABORT or CLOSE; a failed send becomes DEAD_LETTER or SEND_FAILED). A missing cell
raises ``ProtocolError``; the only ``IGNORED`` cells are a stop once closed or failed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final, Literal, TypeAlias

import msgspec

from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import IGNORED, Ignored, MoveTable, TableMachine

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


# Subclasses say frozen=True again: msgspec inherits it, mypy (dataclass_transform) does not.
class _Effect(msgspec.Struct, frozen=True, tag=True):
    pass


class InitTransactions(_Effect, frozen=True):
    """Initialise the producer (fences zombies); report ``initialized`` or ``failed``."""


class Poll(_Effect, frozen=True):
    """Call ``task.poll()``; report ``polled`` (or ``failed``). ``poll_id`` numbers polls."""

    poll_id: int


class BeginTransaction(_Effect, frozen=True):
    txn: int


class ProduceSegment(_Effect, frozen=True):
    """Send records ``[start, stop)`` of poll ``poll_id`` to Kafka, in the open transaction.
    A record that cannot be sent stops the Ready there: report ``send_failed``."""

    poll_id: int
    start: int
    stop: int


class SendToDeadLetter(_Effect, frozen=True):
    """Send record ``index`` of poll ``poll_id`` to the dead-letter topic with ``reason``,
    in the open transaction (it stands for the record in ``commit_record``)."""

    poll_id: int
    index: int
    reason: str


class SendOffsets(_Effect, frozen=True):
    """Write the source offsets to the offsets topic, in the open transaction."""

    offsets: dict[str, Any]


class CommitTransaction(_Effect, frozen=True):
    """Wait for every send, then commit; report ``committed`` or ``commit_failed``."""

    txn: int


class AbortTransaction(_Effect, frozen=True):
    """Abort the open transaction. Requested (``best_effort`` False): it must work, report
    ``aborted``. On the way to a ``Fail`` (True): try briefly, ignore a failure."""

    txn: int
    best_effort: bool = False


class Acknowledge(_Effect, frozen=True):
    """The transaction committed: ``commit_record`` for each record sent in it, then
    ``task.commit()``; the records of ``ranges`` (``(poll_id, start, stop)``) are done."""

    ranges: tuple[tuple[int, int, int], ...]


class Discard(_Effect, frozen=True):
    """The transaction was aborted on the task's request: forget these records."""

    ranges: tuple[tuple[int, int, int], ...]


class Close(_Effect, frozen=True):
    """Stopped cleanly: stop the task and the producer."""


class Fail(_Effect, frozen=True):
    """Stop, and fail the task (the actor raises). ``permanent``: a record that no restart
    can get past - the actor stays up, failed, instead of being restarted into it."""

    reason: str
    permanent: bool = False


Effect: TypeAlias = (
    InitTransactions
    | Poll
    | BeginTransaction
    | ProduceSegment
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


class Event(enum.Enum):
    """What an input turned out to mean; the table moves the machine on it. A result
    (INITIALIZED, POLLED, COMMITTED, ABORTED) is accepted in the one state that waits for
    it; what the machine then puts in flight is a second event (POLL, COMMIT, ABORT,
    CLOSE), as the coordinator does with a round's last WRITE-STATUS."""

    START = "start"
    INITIALIZED = "initialized"  # the producer is ready and the task started
    POLLED = "polled"  # the poll in flight came back
    COMMITTED = "committed"  # the commit in flight succeeded
    ABORTED = "aborted"  # the requested abort in flight succeeded
    POLL = "poll"  # next: a poll
    COMMIT = "commit"  # next: commit the open transaction
    ABORT = "abort"  # next: abort it (the task asked, or it stops with ``connector``)
    CLOSE = "close"  # next: nothing, stopped cleanly
    DEAD_LETTER = "dead_letter"  # a bad record went to the dead-letter topic; the Ready goes on
    SEND_FAILED = "send_failed"  # a record could not be sent, and has nowhere else to go
    COMMIT_FAILED = "commit_failed"
    FAILED = "failed"  # init, poll, abort or other IO failed
    STOP = "stop"


_S = State
_E = Event
_IGNORED = IGNORED
#: A result was handed on: what the machine puts in flight next.
_NEXT: Final = {_E.POLL: _S.POLLING, _E.COMMIT: _S.COMMITTING, _E.ABORT: _S.ABORTING}


def _in_flight(state: State, *cells: dict[Event, State]) -> dict[Event, State | Ignored]:
    """A state with something in flight: its own cells, then FAILED and a STOP noted for
    the next result (the state stays)."""
    row: dict[Event, State | Ignored] = {}
    for part in cells:
        row.update(part)
    row.update({_E.FAILED: _S.FAILED, _E.STOP: state})
    return row


def _sending(state: State, result: Event) -> dict[Event, State | Ignored]:
    """A state whose Ready may have sent records: its ``result`` hands on to what comes next
    (or a clean close); a failed send either dead-letters the record (the state stays) or
    fails."""
    return _in_flight(
        state,
        {result: state, **_NEXT, _E.CLOSE: _S.CLOSED},
        {_E.DEAD_LETTER: state, _E.SEND_FAILED: _S.FAILED},
    )


#: A missing cell raises ``ProtocolError``: a task is driven only by its own actor, so an
#: unexpected input is a wiring bug, never a network condition - above all a ``polled``
#: while a commit or abort is in flight. The only deliberate no-op is a STOP once the task
#: is closed or failed.
TRANSITIONS: Final = MoveTable[State, Event](
    "source task",
    {
        _S.NEW: {_E.START: _S.INITIALIZING, _E.STOP: _S.CLOSED},  # nothing to wait for
        _S.INITIALIZING: _in_flight(
            _S.INITIALIZING,
            {_E.INITIALIZED: _S.INITIALIZING, _E.POLL: _S.POLLING, _E.CLOSE: _S.CLOSED},
        ),
        _S.POLLING: _sending(_S.POLLING, _E.POLLED),
        _S.COMMITTING: {
            **_sending(_S.COMMITTING, _E.COMMITTED),
            _E.COMMIT_FAILED: _S.FAILED,
        },
        _S.ABORTING: _sending(_S.ABORTING, _E.ABORTED),
        _S.CLOSED: {_E.STOP: _IGNORED},
        _S.FAILED: {_E.STOP: _IGNORED},
    },
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


class SourceTaskMachine(TableMachine[State, Event]):
    """One task's transaction lifecycle; see the module docstring."""

    TRANSITIONS = TRANSITIONS

    def __init__(self, config: SourceTaskConfig) -> None:
        super().__init__(State.NEW)
        self.config = config
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
        #: the effects of the last Ready: a ``send_failed`` resumes what follows its ProduceSegment
        self._last: list[Effect] = []
        self._committed_offsets: dict[str, Any] = {}
        self._committed = self._aborted = 0
        self._records_polled = self._records_sent = self._records_committed = 0
        self._dead_letters = 0
        self._last_error: str | None = None
        self._bad_record: str | None = None

    # -- read-only views -----------------------------------------------------------------

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
        self._fire(Event.START)
        return self._ready([InitTransactions()])

    def initialized(self, committed_offsets: dict[str, Any], now: float) -> Ready:
        """Transactions are initialised and the task started from ``committed_offsets``."""
        self._fire(Event.INITIALIZED)
        self._committed_offsets = dict(committed_offsets)
        if self._stopping:
            self._fire(Event.CLOSE)
            return self._ready([Close()])
        return self._ready(self._poll())

    def polled(self, result: PollResult, now: float) -> Ready:
        """The poll came back with ``result`` (no records: nothing new)."""
        self._fire(Event.POLLED)
        if self.config.boundary != "connector" and result.ends:
            raise ProtocolError(
                f"source task: a transaction end was requested with boundary "
                f"{self.config.boundary!r}; only 'connector' lets the task decide"
            )
        self._records_polled += len(result.offsets)
        self._queue = _cut(self._poll_id, result)
        return self._ready(self._drain(now))

    def send_failed(
        self, poll_id: int, index: int, kind: Failure, reason: str, now: float
    ) -> Ready:
        """Record ``index`` of poll ``poll_id`` could not be sent; the effects after it in
        the last Ready were not carried out."""
        at = self._interrupted_send(poll_id, index)  # before any move: a wiring bug moves none
        if kind is not Failure.BAD_RECORD:
            return self._ready(self._fail(Event.SEND_FAILED, reason, kind))
        if not self.config.dead_letter:
            why = f"BadRecord: {reason} {NO_DEAD_LETTER_TOPIC}"
            failed = self._fail(Event.SEND_FAILED, why, kind)
            self._bad_record = reason
            return self._ready(failed)
        self._fire(Event.DEAD_LETTER)
        self._dead_letters += 1
        send = self._last[at]
        assert isinstance(send, ProduceSegment)
        rest: list[Effect] = [SendToDeadLetter(poll_id, index, reason)]
        if index + 1 < send.stop:
            rest.append(ProduceSegment(poll_id, index + 1, send.stop))
        return self._ready(rest + self._last[at + 1 :])

    def committed(self, now: float) -> Ready:
        self._fire(Event.COMMITTED)
        acked = tuple(self._txn_ranges)
        self._committed += 1
        self._records_committed += self._txn_records
        self._close_txn()
        return self._ready([Acknowledge(acked), *self._drain(now)])

    def commit_failed(self, reason: str, now: float, kind: Failure = Failure.ERROR) -> Ready:
        """The commit did not succeed: abort and fail (seed 000: never log and move on)."""
        return self._ready(self._fail(Event.COMMIT_FAILED, f"commit failed: {reason}", kind))

    def aborted(self, now: float) -> Ready:
        """A connector-requested abort is done; its records and offsets are gone."""
        self._fire(Event.ABORTED)
        dropped = tuple(self._txn_ranges)
        self._aborted += 1
        self._close_txn()
        return self._ready([Discard(dropped), *self._drain(now)])

    def failed(self, reason: str, now: float, kind: Failure = Failure.ERROR) -> Ready:
        """A poll, init, abort or other IO went wrong: abort what is open (unless fenced),
        then fail. A bad record is only known from a ProduceSegment (``send_failed``)."""
        if kind is Failure.BAD_RECORD:
            raise ProtocolError("source task: a bad record is reported by send_failed")
        return self._ready(self._fail(Event.FAILED, reason, kind))

    def stop(self, now: float) -> Ready:
        """Ask to stop; acted on at the next result (or at once if nothing is in flight).
        Not a result: the last Ready stays the one a ``send_failed`` refers to."""
        self._stopping = True
        closed = self._fire(Event.STOP) and self._state is State.CLOSED
        return Ready([Close()] if closed else [], _REPORT[self._state])

    # -- internals -------------------------------------------------------------------------

    def _ready(self, effects: list[Effect]) -> Ready:
        self._last = effects
        return Ready(effects, _REPORT[self._state])

    def _interrupted_send(self, poll_id: int, index: int) -> int:
        """Where in the last Ready the ProduceSegment of that record is (else: a wiring
        bug)."""
        for at, effect in enumerate(self._last):
            if (
                isinstance(effect, ProduceSegment)
                and effect.poll_id == poll_id
                and effect.start <= index < effect.stop
            ):
                return at
        raise ProtocolError(
            f"source task: record {index} of poll {poll_id} was not sent by the last Ready"
        )

    def _poll(self) -> list[Effect]:
        self._fire(Event.POLL)
        self._poll_id += 1
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
                ready.append(ProduceSegment(seg.poll_id, seg.start, seg.stop))
                self._txn_ranges.append((seg.poll_id, seg.start, seg.stop))
                self._txn_records += seg.count
                self._records_sent += seg.count
                self._pending_offsets.update(seg.offsets)
            if seg.end is End.COMMIT and self._txn_open:
                return ready + self._commit()
            if seg.end is End.ABORT and self._txn_open:
                return ready + self._abort()
        if self._txn_open and (self._stopping or self._boundary_reached(now)):
            if self._stopping and self.config.boundary == "connector":
                return ready + self._abort()
            return ready + self._commit()
        if self._stopping:
            self._fire(Event.CLOSE)
            return ready + [Close()]
        return ready + self._poll()

    def _boundary_reached(self, now: float) -> bool:
        if self.config.boundary == "poll":
            return True
        if self.config.boundary == "interval":
            return now - self._txn_began >= self.config.interval_s
        return False

    def _commit(self) -> list[Effect]:
        self._fire(Event.COMMIT)
        ready: list[Effect] = []
        if self._pending_offsets:
            ready.append(SendOffsets(dict(self._pending_offsets)))
        ready.append(CommitTransaction(self._txn))
        return ready

    def _abort(self) -> list[Effect]:
        self._fire(Event.ABORT)
        return [AbortTransaction(self._txn)]

    def _close_txn(self) -> None:
        if self._state is State.COMMITTING:
            self._committed_offsets.update(self._pending_offsets)
        self._txn_open = False
        self._txn_ranges = []
        self._txn_records = 0
        self._pending_offsets = {}

    def _fail(self, event: Event, reason: str, kind: Failure) -> list[Effect]:
        """Move on ``event``, abort what is open - unless a requested abort is what failed,
        or the producer is fenced - then fail; for good if the cause is a record no restart
        gets past."""
        abort = self._txn_open and self._state is not State.ABORTING
        self._fire(event)
        self._last_error = reason
        ready: list[Effect] = []
        if abort and kind is not Failure.FENCED:
            ready.append(AbortTransaction(self._txn, best_effort=True))
        self._txn_open = False
        self._queue = []
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
