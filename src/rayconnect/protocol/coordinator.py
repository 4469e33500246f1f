"""The commit coordinator (Hudi RFC-32 TransactionCoordinator) as a pure state machine.

Theory of operation
-------------------
One coordinator per pipeline runs numbered rounds ``(epoch, txn_id)``. ``epoch`` is claimed
in the table by the actor before ``recover`` (the table keeps it as a fence: once a newer
epoch is claimed, commits of older epochs fail in the table). ``txn_id`` counts rounds
within the epoch, from 1, and never goes back, not even after a failed commit.

A round: START-COMMIT (broadcast with the table's offsets) -> ``commit_interval_s`` after
the previous round's END (participants read ahead from there; after a discarded round or
at start-up: after the START), on a REQUEST-COMMIT, or when the pipeline drained a backlog
(DRAINED reports adding up to a flush's worth, ``commit_when_drained``) -> END-COMMIT ->
WRITE-STATUS from every partition -> ``CommitTable``
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
- Partitions may change at run time. New ones (``add_partitions``) join at the next START.
  Retired ones (``retire_partitions``, FLIP-246: they left the metadata) stay in the rounds
  until a round whose END goes out after the request has finished - committed, or found
  empty - so what they read is committed first; then ``PartitionsRetired`` says they are
  in no further round (their participants can stop). A round found empty touched no table,
  so before letting partitions go after one the machine reads the table (``ReloadTable``):
  only a coordinator the table shows to be the newest epoch ends participants - a zombie
  learns it is fenced instead. Adding a key back before that cancels
  its retirement. No partition ever leaves a round in progress: what it read since the
  last commit would otherwise be read again later, from the table.
- A stop (``stop``) is an input like any other. ``commit=True``: a running round is ended
  now, an ended or committing one is finished, and instead of the next START the machine
  emits ``Stopped`` (a discarded round, or a stop while reloading, stops without one more
  round). ``commit=False``: ``Stopped`` at once; results of a commit under way are ignored.
- A participant that cannot report (ROUND-LOST after a failed flush, or a fresh one after
  END: PARTICIPANT-STARTED) is not waited for: the round commits the others at once, and it
  starts the next round from its old offset. A fresh participant in a running round is sent
  that round's START again and simply joins it.
- The machine works out what an input means (an *event*: a WRITE-STATUS of the round, a
  STALE message of another round or partition, a round that turned out empty ...) and the
  table (``TRANSITIONS``) makes the move. Messages from the network that do not fit are
  deliberately ``IGNORED`` cells (and counted): STALE everywhere, statuses, requests and
  lost-notes that arrive after the round moved on. Local inputs that do not fit have no
  cell and raise ``ProtocolError`` (a second ``recover``, a commit result with no commit
  pending): they are bugs in the actor.
- Pacing is not exactly-once: DRAINED reports are never validated, only added up
  (protocol/drain_window.py). A report that completes a flush's worth ends a running round;
  one that comes while a round is being written ends the next round right after its START.
- How each round ended is an effect: ``RoundFinished`` (committed, or found empty) or
  ``RoundDiscarded`` (with the reason), emitted before whatever follows from it, so the actor
  learns outcomes without comparing statuses.
- A partition whose table offset lies outside its log (``offsets_out_of_range``, a
  reader's report: the topic was re-created, the log lost) is never left silent
  (``protocol/offset_range.py``): by the policy the pipeline gives up (``GiveUp``, the
  default) or the partition starts over at the log's start or end - its next START says
  where, and the commit that lands it expects the stale offset and records the reset.
- Time is an input (``now`` in seconds, any monotonic clock); ``next_deadline()`` says when
  the actor should call ``tick`` next.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from rayconnect.protocol.commit_state import CommitState, Rejection, RejectionKind
from rayconnect.protocol.cut_marks import cut_floor, next_cut
from rayconnect.protocol.drain_window import DrainWindow
from rayconnect.protocol.effects import (
    Broadcast,
    CommitTable,
    Fenced,
    GiveUp,
    PartitionsRetired,
    Ready,
    ReloadTable,
    RoundDiscarded,
    RoundFinished,
    SendMessage,
    Stopped,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import IGNORED, Ignored, MoveTable, TableMachine
from rayconnect.protocol.messages import (
    AckCommit,
    Drained,
    EndCommit,
    HostWriteStatus,
    Message,
    ParticipantStarted,
    RequestCommit,
    RoundLost,
    StartCommit,
    WriteStatus,
)
from rayconnect.protocol.offset_range import OffsetResets, OffsetsOutOfRange, OutOfRangePolicy
from rayconnect.protocol.settings import CommitSettings


class State(enum.Enum):
    IDLE = "idle"  # created; waits for recover()
    STARTED = "started"  # START sent; participants write
    ENDED = "ended"  # END sent; collecting WRITE-STATUS
    COMMITTING = "committing"  # CommitTable handed to the actor
    RELOADING = "reloading"  # commit failed; ReloadTable handed to the actor
    FENCED = "fenced"  # a newer epoch exists; this coordinator is finished
    LAST_ENDED = "last-ended"  # ENDED, and a stop waits for this round
    LAST_COMMITTING = "last-committing"  # COMMITTING, and a stop waits for this commit
    STOPPED = "stopped"  # the stop is done: no further round


class Event(enum.Enum):
    """What an input turned out to mean; the table moves the machine on it."""

    RECOVER = "recover"
    TICK = "tick"
    INTERVAL_PASSED = "interval_passed"  # time to END the running round
    REQUEST_COMMIT = "request_commit"  # a REQUEST-COMMIT that can end the running round
    BACKLOG_DRAINED = "backlog_drained"  # DRAINED reports add up to a backlog: END now
    DRAINED = "drained"  # a DRAINED report, added up (pacing only)
    STATUS = "status"  # a WRITE-STATUS of the round (valid or rejected)
    STATUS_DUPLICATE = "status_duplicate"  # that partition already reported
    ROUND_LOST = "round_lost"  # a partition the round awaits will not report
    PARTICIPANT_STARTED = "participant_started"  # a fresh participant the round knows
    STALE = "stale"  # a message of another round or partition, or with nothing new
    ROUND_HAS_DATA = "round_has_data"  # all reported (or time is up) and there is data
    ROUND_EMPTY = "round_empty"  # all reported and nobody moved: nothing to commit
    # ...and partitions retire after it: an empty round touched no table, so the epoch is
    # confirmed (the table read) before their participants are ended.
    ROUND_EMPTY_RETIRING = "round_empty_retiring"
    # time is up and who reported has no data, or all of it is in files shared with
    # partitions that did not report
    ROUND_ABANDONED = "round_abandoned"
    COMMIT_SUCCEEDED = "commit_succeeded"
    COMMIT_FAILED = "commit_failed"
    TABLE_RELOADED = "table_reloaded"
    TABLE_FENCED = "table_fenced"  # the reload found a newer epoch
    PARTITIONS = "partitions"  # add or retire partitions
    STOP = "stop"  # stop after the round in progress (commit it)
    STOP_NOW = "stop_now"  # stop without committing
    OUT_OF_RANGE = "out_of_range"  # a partition's table offset lies outside its log


_S = State
_E = Event
_IGNORED = IGNORED
_ENDED: Final = (_S.ENDED, _S.LAST_ENDED)
_Row = dict[Event, State | Ignored]

#: Stateless cells every state shares: TICK and partition changes are always welcome,
#: STALE messages always ignored.
_ALWAYS: Final[dict[Event, State | Ignored | None]] = {
    _E.TICK: None,
    _E.PARTITIONS: None,
    _E.DRAINED: None,
    _E.OUT_OF_RANGE: None,
    _E.STALE: _IGNORED,
}
#: A round that moved on: what its participants still send is late, not wrong.
_LATE: Final[_Row] = {
    _E.STATUS: _IGNORED,
    _E.STATUS_DUPLICATE: _IGNORED,
    _E.ROUND_LOST: _IGNORED,
    _E.PARTICIPANT_STARTED: _IGNORED,
}


def _row(state: State, cells: _Row) -> _Row:
    """``cells`` plus the shared ones; a shared ``None`` cell is a self-loop."""
    row: _Row = {e: state if t is None else t for e, t in _ALWAYS.items()}
    row.update(cells)
    return row


def _ended(state: State, committing: State, done: State, abandoned: State) -> _Row:
    """ENDED and LAST_ENDED differ only in where a finished round leads."""
    return _row(
        state,
        {
            _E.STATUS: state,
            _E.STATUS_DUPLICATE: _IGNORED,
            _E.ROUND_LOST: state,
            _E.PARTICIPANT_STARTED: state,  # it cannot report: stop waiting for it
            _E.ROUND_HAS_DATA: committing,
            _E.ROUND_EMPTY: done,
            _E.ROUND_EMPTY_RETIRING: _S.RELOADING if done is _S.STARTED else done,
            _E.ROUND_ABANDONED: abandoned,
            _E.STOP: _S.LAST_ENDED,
            _E.STOP_NOW: _S.STOPPED,
        },
    )


#: ``TRANSITIONS.describe()`` prints it. ACKED is not a resting state: ``commit_succeeded``
#: sends ACK and the next START (or ``Stopped``) in one step.
TRANSITIONS: Final = MoveTable[State, Event](
    "coordinator",
    {
        _S.IDLE: _row(  # no round yet: every message is STALE
            _S.IDLE,
            {_E.RECOVER: _S.STARTED, _E.STOP: _S.STOPPED, _E.STOP_NOW: _S.STOPPED},
        ),
        _S.STARTED: _row(
            _S.STARTED,
            {
                _E.INTERVAL_PASSED: _S.ENDED,
                _E.REQUEST_COMMIT: _S.ENDED,
                _E.BACKLOG_DRAINED: _S.ENDED,
                _E.STATUS: _IGNORED,  # before END: it cannot be complete
                _E.ROUND_LOST: _S.STARTED,  # noted; END will not wait for it
                _E.PARTICIPANT_STARTED: _S.STARTED,  # it gets this round's START again
                _E.STOP: _S.LAST_ENDED,  # END now
                _E.STOP_NOW: _S.STOPPED,
            },
        ),
        _S.ENDED: _ended(_S.ENDED, _S.COMMITTING, _S.STARTED, _S.RELOADING),
        _S.LAST_ENDED: _ended(_S.LAST_ENDED, _S.LAST_COMMITTING, _S.STOPPED, _S.STOPPED),
        _S.COMMITTING: _row(
            _S.COMMITTING,
            {
                **_LATE,
                _E.COMMIT_SUCCEEDED: _S.STARTED,
                _E.COMMIT_FAILED: _S.RELOADING,
                _E.STOP: _S.LAST_COMMITTING,
                _E.STOP_NOW: _S.STOPPED,
            },
        ),
        _S.LAST_COMMITTING: _row(
            _S.LAST_COMMITTING,
            {
                **_LATE,
                _E.COMMIT_SUCCEEDED: _S.STOPPED,
                _E.COMMIT_FAILED: _S.STOPPED,  # discarded; the next start reads the table
                _E.STOP: _S.LAST_COMMITTING,
                _E.STOP_NOW: _S.STOPPED,
            },
        ),
        _S.RELOADING: _row(
            _S.RELOADING,
            {
                **_LATE,
                _E.TABLE_RELOADED: _S.STARTED,
                _E.TABLE_FENCED: _S.FENCED,
                _E.STOP: _S.STOPPED,  # the round is discarded already: nothing to finish
                _E.STOP_NOW: _S.STOPPED,
            },
        ),
        _S.FENCED: _row(_S.FENCED, {**_LATE, _E.STOP: _S.FENCED, _E.STOP_NOW: _S.FENCED}),
        _S.STOPPED: _row(
            _S.STOPPED,
            {
                **_LATE,
                _E.REQUEST_COMMIT: _IGNORED,  # a round a STOP_NOW left running
                # IO that was under way when the stop came: its result changes nothing
                _E.RECOVER: _IGNORED,
                _E.COMMIT_SUCCEEDED: _IGNORED,
                _E.COMMIT_FAILED: _IGNORED,
                _E.TABLE_RELOADED: _IGNORED,
                _E.TABLE_FENCED: _IGNORED,
                _E.STOP: _S.STOPPED,
                _E.STOP_NOW: _S.STOPPED,
            },
        ),
    },
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
    retiring: tuple[str, ...] = ()  # partitions that leave once a round has finished
    #: rounds ended early because the pipeline drained a backlog (``commit_when_drained``)
    rounds_drained: int = 0
    #: partitions whose table offset lies outside their log, as a reader reported them
    #: (until a commit moves them on: with a reset policy, they start over)
    out_of_range: dict[str, OffsetsOutOfRange] = {}
    #: consistent cuts: the cut of the last version committed whole, as last learnt from
    #: the table or a commit (None: none known)
    committed_cut: int | None = None


class Coordinator(TableMachine[State, Event]):
    """Drives the rounds of one pipeline; see the module docstring for the rules."""

    TRANSITIONS = TRANSITIONS

    def __init__(
        self,
        pipeline: str,
        partitions: Iterable[str],
        config: CommitSettings | None = None,
        offsets_out_of_range: OutOfRangePolicy = "fail",
    ) -> None:
        super().__init__(State.IDLE)
        self.pipeline = pipeline
        self.config = config or CommitSettings()
        self._resets = OffsetResets(offsets_out_of_range)
        self._partitions: frozenset[str] = frozenset(partitions)
        #: ``_partitions`` sorted, the recipients of every round's messages: one tuple while
        #: the partitions stay (hosts group it once, ``protocol.host_rounds``)
        self._recipients: tuple[str, ...] | None = None
        #: Partitions leaving: key -> the first txn whose finishing lets it go.
        self._retiring: dict[str, int] = {}
        # The empty round whose retirements wait for the table read that confirms the epoch.
        self._retire_after_reload: int | None = None
        self._epoch = 0
        self._txn_id = 0
        self._offsets: dict[str, int] = {}
        self._round: CommitState | None = None
        self._pending: CommitTable | None = None
        self._committed = self._partial = self._discarded = self._empty = 0
        self._rejected = self._requested = self._drained = 0
        cfg = self.config
        self._window = DrainWindow(
            cfg.commit_interval_s, cfg.flush_max_records, cfg.flush_max_bytes
        )
        self._last_duration: float | None = None
        self._last_end_to_start: float | None = None
        self._last_error: str | None = None
        #: consistent cuts: the cut of the last version committed whole (None: unknown)
        self._committed_cut: int | None = None
        #: consistent cuts: the open round's ``StartCommit.floor``
        self._cut_floor: int | None = None

    # -- read-only views -------------------------------------------------------------------

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
        if self._state in (State.STARTED, *_ENDED) and self._round is not None:
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
            retiring=tuple(sorted(self._retiring)),
            rounds_drained=self._drained,
            out_of_range=dict(self._resets.reports),
            committed_cut=self._committed_cut,
        )

    # -- inputs ----------------------------------------------------------------------------

    def recover(
        self,
        epoch: int,
        table_offsets: Mapping[str, int],
        now: float,
        committed_cut: int | None = None,
    ) -> Ready:
        """The actor claimed ``epoch`` in the table and read its offsets: start round 1.
        ``committed_cut``: the newest ``rayconnect.cut_lsn`` in the table (consistent cuts:
        no later cut may be at or below it - a partition that is not in the rounds now, e.g.
        retired, may hold transactions up to it)."""
        if not self._fire(Event.RECOVER):
            return []
        self._epoch = epoch
        self._offsets = dict(table_offsets)
        self._committed_cut = committed_cut
        confirmed, self._retire_after_reload = self._retire_after_reload, None
        retired = self._retire(confirmed) if confirmed is not None else []
        return [*retired, *self._start(now)]

    def step(self, message: Message, now: float) -> Ready:
        """A message from a participant: WRITE-STATUS, REQUEST-COMMIT, ROUND-LOST or
        PARTICIPANT-STARTED."""
        if isinstance(message, WriteStatus):
            return self._on_status(message, now)
        if isinstance(message, HostWriteStatus):
            return self._on_host_status(message, now)
        if isinstance(message, RequestCommit):
            return self._on_request(message, now)
        if isinstance(message, Drained):
            return self._on_drained(message, now)
        if isinstance(message, RoundLost):
            return self._on_lost(message, now)
        if isinstance(message, ParticipantStarted):
            return self._on_participant_started(message, now)
        raise ProtocolError(f"coordinator does not take {type(message).__name__} messages")

    def tick(self, now: float) -> Ready:
        """Time passed: end the round, or give up waiting for WRITE-STATUS."""
        self._fire(Event.TICK)
        rnd = self._round
        if self._state is State.STARTED and rnd is not None and rnd.should_end(now):
            self._fire(Event.INTERVAL_PASSED)
            return self._end(now)
        return self._evaluate(now) if self._state in _ENDED else []

    def commit_succeeded(self, version: int, now: float) -> Ready:
        """The ``CommitTable`` landed as table ``version``: ACK, then the next START."""
        if not self._fire(Event.COMMIT_SUCCEEDED):
            return []
        commit, rnd = self._pending, self._round
        assert commit is not None and rnd is not None
        self._pending = None
        self._resets.landed(commit.resets)
        self._offsets.update(commit.offsets)
        self._committed += 1
        self._partial += int(commit.metadata.partial)
        if commit.metadata.cut_lsn is not None:
            self._committed_cut = commit.metadata.cut_lsn
        self._last_duration = now - rnd.started_at
        ack = AckCommit(
            epoch=self._epoch,
            txn_id=rnd.txn_id,
            version=version,
            offsets={k: v for k, v in self._offsets.items() if k in rnd.partitions},
        )
        return [
            Broadcast(to=self._to(rnd), message=ack),
            *self._finished(now, version, len(commit.files), self._last_duration),
        ]

    def commit_failed(self, reason: str, now: float) -> Ready:
        """The commit failed or timed out (whether it landed is unknown): reload the table."""
        if not self._fire(Event.COMMIT_FAILED):
            return []
        self._pending = None
        self._last_error = reason
        return self._discard(reason)

    def table_reloaded(
        self,
        table_offsets: Mapping[str, int],
        now: float,
        table_epoch: int | None = None,
        committed_cut: int | None = None,
    ) -> Ready:
        """The table's offsets (and epoch, if the actor read it) after a failed commit;
        ``committed_cut`` as in ``recover`` (a commit reported failed may have landed).

        A ``table_epoch`` newer than ours means we are a zombie: emit ``Fenced`` and stop.
        """
        fenced = table_epoch is not None and table_epoch > self._epoch
        if not self._fire(Event.TABLE_FENCED if fenced else Event.TABLE_RELOADED):
            return []
        if fenced:
            self._last_error = f"fenced by epoch {table_epoch}"
            return [Fenced(epoch=self._epoch, table_epoch=table_epoch or 0)]
        self._offsets = dict(table_offsets)
        self._resets.reloaded(self._offsets)
        if committed_cut is not None:
            self._committed_cut = max(committed_cut, self._committed_cut or committed_cut)
        confirmed, self._retire_after_reload = self._retire_after_reload, None
        retired = self._retire(confirmed) if confirmed is not None else []
        return [*retired, *self._start(now)]

    def add_partitions(self, keys: Iterable[str], now: float) -> Ready:
        """Partitions join (their participants exist): they are in the next START. A key
        still waiting to retire simply stays."""
        self._fire(Event.PARTITIONS)
        added = frozenset(keys)
        for key in added:
            self._retiring.pop(key, None)
        self._partitions |= added
        self._recipients = None
        return []

    def offsets_out_of_range(self, report: OffsetsOutOfRange, now: float) -> Ready:
        """A reader found a partition's committed offset outside its log: give up, or start
        the partition over at the next START (the policy; ``protocol/offset_range.py``)."""
        live = self._state not in (State.IDLE, State.STOPPED, State.FENCED)
        news = live and self._resets.judge(report, self._offsets.get(report.partition))
        if not self._fire(Event.OUT_OF_RANGE if news else Event.STALE):
            return []
        policy = self._resets.policy
        if policy == "fail":
            self._last_error = (
                f"{report.describe()}; giving up (offsets_out_of_range: fail - set it to "
                "earliest or latest to start such a partition over)"
            )
            return [GiveUp(self._last_error)]
        start = self._resets.pending[report.partition].start
        self._last_error = (
            f"{report.describe()}; starting it over at {start:,} (offsets_out_of_range: {policy})"
        )
        return []

    @property
    def resetting(self) -> frozenset[str]:
        """Partitions starting over: their table offset may go down (the actor's reload
        check must allow it)."""
        return frozenset(self._resets.pending)

    def retire_partitions(self, keys: Iterable[str], now: float) -> Ready:
        """Partitions left the metadata: they leave once a round whose END goes out after
        now has finished (``PartitionsRetired``), so what they read is committed first."""
        self._fire(Event.PARTITIONS)
        running = self._state is State.STARTED  # its END has not gone out yet
        first_txn = self._txn_id if running else self._txn_id + 1
        for key in keys:
            if key in self._partitions:
                self._retiring.setdefault(key, first_txn)
        return []

    def stop(self, commit: bool, now: float) -> Ready:
        """Stop: with ``commit``, after the round in progress is finished (a running one is
        ended now); else at once. ``Stopped`` says when it is done."""
        before = self._state
        if not self._fire(Event.STOP if commit else Event.STOP_NOW):
            return []
        if self._state in (State.STOPPED, State.FENCED):
            return [Stopped()]
        return self._end(now) if before is State.STARTED else []

    # -- handlers --------------------------------------------------------------------------

    def _on_status(self, status: WriteStatus, now: float) -> Ready:
        rnd = self._round
        if rnd is None or not rnd.is_current(status.epoch, status.txn_id):
            self._fire(Event.STALE)
            return []
        rejection = rnd.rejection(status)
        duplicate = rejection is not None and rejection.kind is RejectionKind.DUPLICATE
        if not self._fire(Event.STATUS_DUPLICATE if duplicate else Event.STATUS):
            return []
        if rejection is not None:
            self._rejected += 1
            self._last_error = f"WRITE-STATUS of {status.partition} rejected: {rejection}"
            return []
        rnd.record(status)
        return self._evaluate(now)

    def _on_host_status(self, message: HostWriteStatus, now: float) -> Ready:
        """A host's statuses of one round. Each partition's status is judged by itself, as
        if it came alone (``CommitState.rejection``: validated, rejected or a duplicate;
        counted per partition), but the table is asked once per kind of event and the round
        is evaluated once, after all of them: a host's report costs the machine a few moves,
        not a few per partition. (A STATUS never changes the state by itself - it is a
        self-loop or ignored in every row - so one move stands for each of them.)"""
        rnd = self._round
        n = len(message.partitions)
        if rnd is None or not rnd.is_current(message.epoch, message.txn_id):
            self._fire_many(Event.STALE, n)
            return []
        valid: list[WriteStatus] = []
        rejected: list[tuple[WriteStatus, Rejection]] = []
        duplicates = 0
        for status in message.statuses():
            rejection = rnd.rejection(status)
            if rejection is None:
                valid.append(status)
            elif rejection.kind is RejectionKind.DUPLICATE:
                duplicates += 1
            else:
                rejected.append((status, rejection))
        self._fire_many(Event.STATUS_DUPLICATE, duplicates)
        if not self._fire_many(Event.STATUS, len(valid) + len(rejected)):
            return []
        for status in valid:
            rnd.record(status)
        if rejected:
            self._rejected += len(rejected)
            status, rejection = rejected[-1]
            self._last_error = f"WRITE-STATUS of {status.partition} rejected: {rejection}"
        return self._evaluate(now)

    def _fire_many(self, event: Event, count: int) -> bool:
        """``count`` inputs of one ``event`` that cannot change the state: one move, and the
        count of ignored messages as if each had come alone. False if they are ignored (or
        there are none)."""
        if count == 0:
            return False
        if self._fire(event):
            return True
        self._ignored += count - 1
        return False

    def _on_lost(self, message: RoundLost, now: float) -> Ready:
        rnd = self._round
        news = (
            rnd is not None
            and rnd.is_current(message.epoch, message.txn_id)
            and message.partition in rnd.missing()
        )
        if not self._fire(Event.ROUND_LOST if news else Event.STALE):
            return []
        assert rnd is not None and rnd.mark_lost(message.partition)
        self._last_error = f"txn {rnd.txn_id}: {message.partition} lost: {message.reason}"
        return self._evaluate(now) if self._state in _ENDED else []

    def _on_participant_started(self, message: ParticipantStarted, now: float) -> Ready:
        """A fresh participant knows no round. While the round runs it can still join it
        (the START's offsets are the table's); once END went out it cannot report, so the
        round stops waiting for it."""
        rnd = self._round
        key = message.partition
        news = rnd is not None and rnd.restart_matters(key)
        if not self._fire(Event.PARTICIPANT_STARTED if news else Event.STALE):
            return []
        assert rnd is not None
        if self._state is State.STARTED:
            start = StartCommit(
                epoch=self._epoch,
                txn_id=rnd.txn_id,
                offsets=rnd.start_offsets,
                cut=rnd.cut,
                floor=self._cut_floor,
            )
            return [SendMessage(to=key, message=start)]
        rnd.mark_lost(key)
        return self._evaluate(now)

    def _on_request(self, message: RequestCommit, now: float) -> Ready:
        rnd = self._round
        counts = rnd is not None and rnd.counts_request(message)
        if not self._fire(Event.REQUEST_COMMIT if counts else Event.STALE):
            return []
        self._requested += 1
        return self._end(now)

    def _on_drained(self, message: Drained, now: float) -> Ready:
        if not self._fire(Event.DRAINED if message.partition in self._partitions else Event.STALE):
            return []
        self._window.drained(message.records, message.nbytes, now)
        return self._end_if_drained(now)

    def _end_if_drained(self, now: float) -> Ready:
        """END a running round now if the pipeline just drained a backlog."""
        if self._state is not State.STARTED or not self._window.ends_round(now):
            return []
        self._fire(Event.BACKLOG_DRAINED)
        self._drained += 1
        return self._end(now)

    # -- the round ---------------------------------------------------------------------------

    def _start(self, now: float, interval_from: float | None = None) -> Ready:
        """START the next round (the table already moved to STARTED)."""
        if interval_from is not None:
            self._last_end_to_start = now - interval_from
        self._txn_id += 1
        rnd = self._round
        cut = floor = None
        if self.config.consistent_cuts and rnd is not None:
            seen = {k: s.cut_seen for k, s in rnd.statuses.items()}
            first = {k: s.cut_first for k, s in rnd.statuses.items() if k in self._partitions}
            cut = next_cut(self._partitions, seen, self._committed_cut, first)
            floor = cut_floor(first)
        self._cut_floor = floor
        rnd = CommitState(
            epoch=self._epoch,
            txn_id=self._txn_id,
            partitions=self._partitions,
            start_offsets=self._resets.starts(self._offsets),
            table_offsets=self._offsets,
            started_at=now,
            interval_from=interval_from,
            commit_interval_s=self.config.commit_interval_s,
            write_timeout_s=self.config.write_timeout_s,
            cut=cut,
        )
        self._round = rnd
        start = StartCommit(
            epoch=self._epoch, txn_id=self._txn_id, offsets=rnd.start_offsets, cut=cut, floor=floor
        )
        # reports that came while the last round was written may end this one at once,
        # whichever way that round ended (committed, empty or discarded)
        return [
            Broadcast(to=self._to(rnd), message=start),
            *self._end_if_drained(now),
        ]

    def _end(self, now: float) -> Ready:
        """END the running round (the table already moved to an ended state)."""
        rnd = self._round
        assert rnd is not None
        rnd.end(now)
        self._window.round_ended()
        end = EndCommit(epoch=self._epoch, txn_id=rnd.txn_id)
        return [Broadcast(to=self._to(rnd), message=end), *self._evaluate(now)]

    def _evaluate(self, now: float) -> Ready:
        """In an ended state: commit when everyone reported or time is up; else wait."""
        rnd = self._round
        assert rnd is not None
        if not rnd.is_commit_ready() and not rnd.is_commit_timed_out(now):
            return []
        if rnd.has_data():
            self._fire(Event.ROUND_HAS_DATA)
            self._pending = rnd.commit_table(self.pipeline)
            return [self._pending]
        if rnd.is_commit_ready() and not rnd.reported_data():
            self._empty += 1
            if self._due(rnd.txn_id):
                # Only the newest epoch may end participants: a zombie coordinator that
                # learned nothing from an empty round would end those the newest one uses.
                # The table says who is newest; a stop ends every participant anyway.
                self._fire(Event.ROUND_EMPTY_RETIRING)
                empty = RoundFinished(rnd.txn_id, None, 0, None, None)
                if self._state is State.STOPPED:
                    return [empty, Stopped()]
                self._retire_after_reload = rnd.txn_id
                return [empty, ReloadTable()]
            self._fire(Event.ROUND_EMPTY)
            return self._finished(now, None, 0, None)
        # Timed out with nothing to commit: discard, and start again *from the table*
        # (docs/design.md step 4). Reloading is also how a coordinator whose participants all
        # follow a newer epoch learns that it has been fenced.
        self._fire(Event.ROUND_ABANDONED)
        if rnd.reported_data():  # all of it in files shared with partitions left out
            self._last_error = (
                f"txn {rnd.txn_id}: the data of {sorted(rnd.statuses)} is in files shared with "
                f"partitions that did not report ({sorted(rnd.partitions - rnd.committable())})"
            )
        else:
            self._last_error = f"txn {rnd.txn_id}: no data from {sorted(rnd.statuses)}, " + (
                f"timed out waiting for {sorted(rnd.missing())}"
            )
        return self._discard(self._last_error)

    def _finished(
        self, now: float, version: int | None, files: int, duration: float | None
    ) -> Ready:
        """The round finished (committed as ``version``, or empty): say so, retire who
        waited for it, then START the next round, or report that the stop is done."""
        rnd = self._round
        assert rnd is not None and rnd.ended_at is not None
        retired = self._retire(rnd.txn_id)
        if self._state is State.STOPPED:
            return [RoundFinished(rnd.txn_id, version, files, duration, None), *retired, Stopped()]
        done = RoundFinished(rnd.txn_id, version, files, duration, now - rnd.ended_at)
        return [done, *retired, *self._start(now, interval_from=rnd.ended_at)]

    def _to(self, rnd: CommitState) -> tuple[str, ...]:
        """The round's partitions, sorted: the same tuple while the partitions stay."""
        if rnd.partitions is not self._partitions:  # a round before partitions changed
            return tuple(sorted(rnd.partitions))
        if self._recipients is None:
            self._recipients = tuple(sorted(self._partitions))
        return self._recipients

    def _due(self, txn_id: int) -> list[str]:
        """Partitions whose retirement waited for round ``txn_id`` (or an earlier one)."""
        return sorted(k for k, txn in self._retiring.items() if txn <= txn_id)

    def _retire(self, txn_id: int) -> Ready:
        due = self._due(txn_id)
        if not due:
            return []
        for key in due:
            del self._retiring[key]
        self._partitions -= frozenset(due)
        self._recipients = None
        return [PartitionsRetired(tuple(due))]

    def _discard(self, reason: str) -> Ready:
        """A discarded round: the table says where to go on; or, when stopping, nowhere."""
        rnd = self._round
        assert rnd is not None
        self._discarded += 1
        then = Stopped() if self._state is State.STOPPED else ReloadTable()
        return [RoundDiscarded(rnd.txn_id, reason), then]
