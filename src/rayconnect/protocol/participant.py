"""The commit participant of one partition (Hudi RFC-32 TransactionParticipant), pure.

Theory of operation
-------------------
A participant owns one Kafka partition. It is PAUSED until a START-COMMIT tells it where the
round starts; then it is WRITING: the reader hands it contiguous batches, it buffers them
and flushes them to the writer by size or age (KIP-89: flushing is decoupled from
committing). On END-COMMIT it flushes the rest, waits for its flushes (ENDING) and sends
WRITE-STATUS (REPORTED). ACK-COMMIT or a newer START-COMMIT closes the round.

Reading does not stop at END: what arrives after it is *read ahead* for the next round
(``ReadAhead``, bounded by the flush settings, the reader paused past them), so the reader
works while Spark writes and the coordinator commits. The next START adopts the read-ahead
when it starts where the reported round ended - the normal case, a committed round -
and drops it otherwise (a discarded round, a partial commit without us), seeking as usual.

Rules
-----
- Rounds are ordered by ``(epoch, txn_id)``. A START older than or equal to the newest one
  seen is ignored (I3); a newer START discards whatever the open round had - buffer,
  flushes in flight, files: none of it is ever reported, so none of it is ever committed
  (I4; vacuum removes the files). END and ACK count only for the round of the newest START.
- The START's offset for this partition is the truth (I2). When it differs from where the
  reader is (or the reader's position is unknown) the participant emits ``Seek``. When the
  START has no offset (the table never committed this partition) it emits ``SeekToPolicy``
  and waits for ``position_resolved(offset)``, on EVERY such START: going back to the
  policy is the only way to re-read what an uncommitted round already consumed.
- A batch is accepted only while WRITING and only if it starts exactly where the accepted
  data ends. Later than that is a gap (a batch was lost): ``Seek`` back, once. Earlier is a
  stale batch from before a seek: dropped. A dropped batch that starts where the reader
  was moves the participant's idea of the reader on; any other dropped batch makes that
  idea unreliable, and the next START (or policy resolution) seeks even if the offsets
  look equal - otherwise a quiet partition could leave read-but-dropped records unread
  until new data arrives. Hence the reader must report ``first_offset`` as its position
  before the batch, not the first record's offset: compaction and transaction markers
  leave holes in offsets, and a hole would look like a lost batch (Seek, forever).
- Read-ahead is accepted only if it continues exactly where the ended round stopped; any
  other batch drops the read-ahead, pauses the reader and makes the next START seek. A START
  with no offset (policy), a failed flush or an ACK that committed us elsewhere drop it too.
- An idle partition reports at once on END, with no files: it never stalls a round.
- Steering can miss the reader (no reader to send it to, or the call failed): the actor
  says so (``reader_lost``) and the participant steers again once the reader is found, to
  what it wants by then (``protocol/reader_link.py``: a tick asks for ``FindReader``, the
  answer is ``reader_found`` or ``reader_not_found``). A reader that (re)starts asks where
  to begin (``reader_attached``). Until then the reader may deliver anything: batches are
  judged by their offsets alone, as always.
- Liveness: a partition must never sit behind its log for ever. The reader says with each
  batch how far the log's data goes (``data_end``: the batch's end when it reached the high
  watermark, else the high watermark). A round that ends with nothing read for at least
  ``commit_interval_s`` while the participant believes its reader is before ``data_end``
  (a quiet round: a short round ended by others says nothing) means the belief and the reader
  parted (a steering that landed out of order, a reader restarted with its pieces): the
  next START seeks even if the offsets look equal (a *re-sync*). Re-syncs back off (after
  1, then 2, 4 ... up to ``MAX_RESYNC_GAP`` idle rounds), so a partition whose log truly
  ends earlier than it said (a topic re-created) costs a seek now and then, not one a
  round. ``STALL_ROUNDS`` such rounds in a row show the partition as ``stalled`` (status).
- Consistent cuts (``commit.consistent_cuts``, ``protocol/cut_marks.py``): the START
  names a cut LSN; the round takes exactly the records up to this partition's marker of it.
  Batches are *held* (in the read-ahead) as they come, and the held ones that end at or
  before the cut's end move into the round (``_promote``) once that end is known - a marker
  at or past the cut read. An END before the round reached its end waits for it (the
  marker is in the log: the coordinator only names cuts every partition has read).
  WRITE-STATUS says the highest marker read past the round's end (``cut_seen``), from which
  the coordinator names the next cut. The reader ends every batch at a marker at most.
- A failed flush loses data that the round accepted: the round cannot be reported. The
  participant pauses, tells the coordinator (ROUND-LOST, so the round does not wait for it)
  and waits for the next START.
- After ``request_commit_after_flushes`` size-triggered flushes in one round the buffer is
  "staying full": REQUEST-COMMIT once per round, so the coordinator ends the round early.
  With ``commit_when_caught_up`` a batch that reaches the high watermark asks the same; with
  ``commit_when_drained`` (default) it does so only when at least a flush's worth was read
  since the partition last reached the high watermark (over rounds) - a backlog, drained: it
  lands at read speed, and steady traffic keeps the interval's pacing. A backlog spread over
  many small partitions is judged pipeline-wide: at its first catch-up in a round (and in a
  read-ahead) the participant tells the coordinator how much it read since the one before
  (DRAINED), and the coordinator adds those up (protocol/drain_window.py).

Error versus ignore: the machine first works out what an input means - an *event* - and the
table (``TRANSITIONS``) makes the move. Late and duplicated inputs are events of their own:
``STALE`` (a message of another round) and ``LATE_RESULT`` (a flush result or policy offset of
a round that is gone) are deliberately ``IGNORED`` in every state, a duplicate END while the
flushes finish is ignored in ENDING, and all of them are counted. A cell the table lacks is
an event that cannot happen in that state (a flush result of the open round after it
reported, an END of an open round while PAUSED): ``ProtocolError``, like a flush id that was
never issued, an offset range that goes backwards or a message a participant never receives.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

import msgspec

from rayconnect.protocol.cut_marks import CutMarks
from rayconnect.protocol.effects import (
    COORDINATOR,
    FindReader,
    Flush,
    Pause,
    Ready,
    Resume,
    Seek,
    SeekToPolicy,
    SendMessage,
    Steer,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import IGNORED, MoveTable, TableMachine
from rayconnect.protocol.messages import (
    AckCommit,
    Drained,
    EndCommit,
    Message,
    RequestCommit,
    RoundLost,
    StartCommit,
)
from rayconnect.protocol.reader_link import LinkEvent, LinkState, ReaderLink
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile
from rayconnect.protocol.write_state import Batch, ReadAhead, WriteState


class State(enum.Enum):
    PAUSED = "paused"  # no open round: waits for START
    WRITING = "writing"  # reading, buffering, flushing
    ENDING = "ending"  # END seen, paused; waits for flushes (or the policy offset)
    REPORTED = "reported"  # WRITE-STATUS sent; waits for ACK or a newer START


class Event(enum.Enum):
    """What an input turned out to mean; the table moves the machine on it."""

    START = "start"  # START of a round newer than any seen
    END = "end"  # END of the open round
    ACK = "ack"  # ACK of the newest round
    STALE = "stale"  # START, END or ACK of another round: late, duplicated or reordered
    RECORDS = "records"  # a batch from the reader (accepted, read ahead or dropped)
    FLUSHED = "flushed"  # a flush of the open round wrote its files
    FLUSH_FAILED = "flush_failed"  # a flush of the open round failed: the round is lost
    POSITION_RESOLVED = "position_resolved"  # the open round's starting-offset policy offset
    LATE_RESULT = "late_result"  # a flush result or policy offset of a round that is gone
    TICK = "tick"
    REPORT = "report"  # everything the round accepted is in files: WRITE-STATUS


_S = State
_E = Event
_IGNORED = IGNORED

#: Every state ignores STALE and LATE_RESULT; a missing cell raises ``ProtocolError``.
TRANSITIONS: Final = MoveTable[State, Event](
    "participant",
    {
        _S.PAUSED: {  # no open round (so END, flush results and REPORT cannot be its own)
            _E.START: _S.WRITING,
            _E.ACK: _S.PAUSED,  # the newest round committed without us: note the offset
            _E.RECORDS: _S.PAUSED,  # read ahead, or in flight when the Pause went out
            _E.TICK: _S.PAUSED,
            _E.STALE: _IGNORED,
            _E.LATE_RESULT: _IGNORED,
        },
        _S.WRITING: {
            _E.START: _S.WRITING,  # a newer round: the open one is discarded
            _E.END: _S.ENDING,
            _E.ACK: _S.PAUSED,  # committed without us (a partial commit)
            _E.RECORDS: _S.WRITING,
            _E.FLUSHED: _S.WRITING,
            _E.FLUSH_FAILED: _S.PAUSED,
            _E.POSITION_RESOLVED: _S.WRITING,
            _E.TICK: _S.WRITING,
            _E.STALE: _IGNORED,
            _E.LATE_RESULT: _IGNORED,
        },
        _S.ENDING: {
            _E.START: _S.WRITING,
            _E.END: _IGNORED,  # a duplicate END while the flushes finish
            _E.ACK: _S.PAUSED,
            _E.RECORDS: _S.ENDING,
            _E.FLUSHED: _S.ENDING,
            _E.FLUSH_FAILED: _S.PAUSED,
            _E.POSITION_RESOLVED: _S.ENDING,
            _E.TICK: _S.ENDING,
            _E.REPORT: _S.REPORTED,
            _E.STALE: _IGNORED,
            _E.LATE_RESULT: _IGNORED,
        },
        _S.REPORTED: {  # nothing in flight and the start known: no flush or policy results
            _E.START: _S.WRITING,
            _E.END: _S.REPORTED,  # a duplicate END: send the same WRITE-STATUS again
            _E.ACK: _S.PAUSED,
            _E.RECORDS: _S.REPORTED,
            _E.TICK: _S.REPORTED,
            _E.STALE: _IGNORED,
            _E.LATE_RESULT: _IGNORED,
        },
    },
)


#: idle rounds behind the log's data after which a partition counts as stalled (status)
STALL_ROUNDS = 3
#: the most idle rounds between two re-syncs of a partition that stays behind
MAX_RESYNC_GAP = 32


class ParticipantStatus(msgspec.Struct, frozen=True):
    key: str
    state: str
    epoch: int | None
    txn_id: int | None
    position: int | None
    committed_offset: int | None
    buffered_records: int
    flushes_in_flight: int
    files: int
    read_ahead_records: int
    batches_dropped: int
    messages_ignored: int
    last_error: str | None
    #: whether its steering reached the reader: synced, lost or finding (reader_link.py)
    reader: str = LinkState.SYNCED.value
    #: rounds in a row that ended with nothing read while the log had data past the reader
    idle_rounds_behind: int = 0
    #: how often the reader was sought again because of that (the liveness rule)
    resyncs: int = 0
    #: where the log's data ends, as the reader last said (None: not heard yet)
    data_end: int | None = None
    #: consistent cuts: rounds in a row that ended holding records with no cut marker read
    #: past them (the source writes none?)
    unmarked_rounds: int = 0

    @property
    def stalled(self) -> bool:
        """Behind the log with nothing read for ``STALL_ROUNDS`` rounds in a row."""
        return self.idle_rounds_behind >= STALL_ROUNDS

    @property
    def unmarked(self) -> bool:
        """Consistent cuts: holding records with no cut marker after them for
        ``STALL_ROUNDS`` rounds in a row (``last_error`` says so)."""
        return self.unmarked_rounds >= STALL_ROUNDS


class Participant(TableMachine[State, Event]):
    """One partition's side of the commit protocol; see the module docstring."""

    TRANSITIONS = TRANSITIONS

    def __init__(self, key: str, config: CommitSettings | None = None) -> None:
        super().__init__(State.PAUSED)
        self.key = key
        self.config = config or CommitSettings()
        self._round: tuple[int, int] | None = None
        self._txn: WriteState | None = None
        self._ahead: ReadAhead | None = None
        self._reader_at: int | None = None
        self._committed: int | None = None
        #: True when a dropped batch, or steering found or attached while the position was
        #: unknown, leaves us unsure where the reader is: seek before trusting ``_reader_at``
        #: again (else a quiet partition could sit on unread records forever).
        self._reader_lost = False
        self._gap_seek: int | None = None
        #: records and bytes read since the partition last reached its high watermark, over
        #: rounds: a backlog once they pass a flush's worth (``commit_when_drained``)
        self._behind_records = 0
        self._behind_bytes = 0
        #: DRAINED went out in this round (or this read-ahead): once is enough for pacing
        self._drain_told = False
        self._next_flush_id = 0
        self._dropped = 0
        self._last_error: str | None = None
        self._link = ReaderLink()
        #: the liveness rule (module docstring): where the log's data ends, as last heard,
        #: and the idle rounds behind it, with the round at which the next re-sync is due
        self._data_end: int | None = None
        self._idle_behind = 0
        self._resync_at = 1
        self._resyncs = 0
        self._progress_at: float | None = None  # when a batch was last accepted
        #: consistent cuts: the markers read past the committed offset, the open round's cut
        self._cuts = self.config.consistent_cuts
        self._marks = CutMarks()
        self._cut: int | None = None
        #: rounds in a row that ended holding records with no marker read past them, and
        #: what ``last_error`` said of it
        self._unmarked_rounds = 0
        self._unmarked: str | None = None
        self._floor: int | None = None  # StartCommit.floor

    # -- read-only views -------------------------------------------------------------------

    @property
    def round(self) -> tuple[int, int] | None:
        """``(epoch, txn_id)`` of the newest START seen."""
        return self._round

    @property
    def position(self) -> int | None:
        """The offset the reader delivers next, as far as this participant knows."""
        return self._reader_at

    @property
    def is_reading(self) -> bool:
        """Whether the reader should be delivering (a round is open, or reading ahead)."""
        ahead = self._ahead
        return self._state is State.WRITING or (ahead is not None and not ahead.full)

    @property
    def committed_offset(self) -> int | None:
        """The partition's committed offset as last heard (START or ACK)."""
        return self._committed

    @property
    def idle_rounds_behind(self) -> int:
        """Rounds in a row that read nothing while the log had data past the reader."""
        return self._idle_behind

    @property
    def reader_synced(self) -> bool:
        """Whether every steering effect so far reached the reader, as far as is known."""
        return self._link.state is LinkState.SYNCED

    def next_deadline(self) -> float | None:
        """When ``tick`` would flush by age or look for a reader it lost, or None."""
        txn = self._txn
        deadlines = [self._link.lost_at]
        if self._state is State.WRITING and txn is not None and txn.oldest_at is not None:
            deadlines.append(txn.oldest_at + self.config.flush_max_age_s)
        return min((d for d in deadlines if d is not None), default=None)

    def status(self) -> ParticipantStatus:
        txn = self._txn
        return ParticipantStatus(
            key=self.key,
            state=self._state.value,
            epoch=self._round[0] if self._round else None,
            txn_id=self._round[1] if self._round else None,
            position=self._reader_at,
            committed_offset=self._committed,
            buffered_records=txn.buffered_records if txn else 0,
            flushes_in_flight=len(txn.in_flight) if txn else 0,
            files=len(txn.files) if txn else 0,
            read_ahead_records=self._ahead.records if self._ahead else 0,
            batches_dropped=self._dropped,
            messages_ignored=self._ignored,
            last_error=self._last_error,
            reader=self._link.state.value,
            idle_rounds_behind=self._idle_behind,
            resyncs=self._resyncs,
            data_end=self._data_end,
            unmarked_rounds=self._unmarked_rounds,
        )

    # -- inputs ----------------------------------------------------------------------------

    def step(self, message: Message, now: float) -> Ready:
        """A message from the coordinator: START-COMMIT, END-COMMIT or ACK-COMMIT."""
        if isinstance(message, StartCommit):
            return self._on_start(message)
        if isinstance(message, EndCommit):
            return self._on_end(message, now)
        if isinstance(message, AckCommit):
            return self._on_ack(message)
        raise ProtocolError(f"participant does not take {type(message).__name__} messages")

    def records(
        self,
        first_offset: int,
        next_offset: int,
        count: int,
        nbytes: int,
        handle: object,
        now: float,
        *,
        caught_up: bool = False,
        high_watermark: int | None = None,
        cut_lsn: int | None = None,
    ) -> Ready:
        """The reader delivers offsets ``[first_offset, next_offset)`` as ``handle``;
        ``caught_up``: they end at the partition's high watermark (nothing more to read);
        ``high_watermark``: the partition's, as the reader saw it (the liveness rule);
        ``cut_lsn``: the batch ends with a cut marker of this LSN (consistent cuts)."""
        if next_offset < first_offset or first_offset < 0 or count < 0 or nbytes < 0:
            raise ProtocolError(
                f"{self.key}: bad batch [{first_offset}, {next_offset}) "
                f"count={count} nbytes={nbytes}"
            )
        self._fire(Event.RECORDS)
        if caught_up:  # the reader judged the end (a commit marker may follow the data)
            self._data_end = next_offset
        elif high_watermark is not None:
            self._data_end = max(high_watermark, next_offset)
        return self._on_records(
            Batch(first_offset, next_offset, count, nbytes, handle, now, cut_lsn), caught_up
        )

    def flushed(self, flush_id: int, files: Iterable[DataFile], now: float) -> Ready:
        """Flush ``flush_id`` wrote ``files``."""
        self._check_flush_id(flush_id)
        return self._on_flushed(flush_id, files)

    def flush_failed(self, flush_id: int, reason: str, now: float) -> Ready:
        """Flush ``flush_id`` failed: its round can no longer be reported."""
        self._check_flush_id(flush_id)
        return self._on_flush_failed(flush_id, reason)

    def position_resolved(self, offset: int, now: float) -> Ready:
        """The actor carried out ``SeekToPolicy``: the reader now starts at ``offset``."""
        if offset < 0:
            raise ProtocolError(f"{self.key}: negative offset {offset}")
        return self._on_resolved(offset)

    def tick(self, now: float) -> Ready:
        """Time passed: flush a buffer older than ``flush_max_age_s``; look for a reader
        that steering missed."""
        self._fire(Event.TICK)
        effects = self._on_tick(now)
        if self._link.lookup_due and self._link.fire(LinkEvent.FIND, now):
            effects.append(FindReader())
        return effects

    def reader_lost(self, now: float) -> Ready:
        """A steering effect did not reach the reader (none was found, or the call failed),
        or this participant is fresh and a reader may have lived on: the next ``tick``
        asks for the reader to be found."""
        self._link.fire(LinkEvent.STEER_LOST, now)
        return []

    def reader_found(self, now: float) -> Ready:
        """The actor carried out ``FindReader`` and found the reader: steer it to what this
        participant wants now - its position, reading or paused."""
        if not self._link.fire(LinkEvent.FOUND, now):
            return []
        return [*self._reader_start(), Resume() if self.is_reading else Pause()]

    def reader_not_found(self, now: float) -> Ready:
        """The actor carried out ``FindReader`` and found no reader: a later tick asks again."""
        self._link.fire(LinkEvent.NOT_FOUND, now)
        return []

    def reader_attached(self, now: float) -> Ready:
        """A reader (new, or restarted) serves this partition: steer it where to begin and
        whether to read (a new split is paused until told to resume). The host carries this
        out through the same ordered steering as every other Ready, so no older wish can
        land after a newer one."""
        self._link.fire(LinkEvent.ATTACHED, now)
        start: Ready = list(self._reader_start())
        return [*start, Resume()] if start and self.is_reading else start

    def _reader_start(self) -> list[Steer]:
        """Where the reader must deliver from, if known. Unknown (a starting position still
        being resolved, whose seek may be the steering that was lost): whoever learns the
        position must seek the reader there (``_reader_lost``), or a resumed reader would
        read from nowhere for ever."""
        if self._reader_at is None:
            self._reader_lost = True
            return []
        return [Seek(self._reader_at)]

    # -- handlers --------------------------------------------------------------------------

    def _current(self, epoch: int, txn_id: int) -> WriteState | None:
        """The open round, if the message is for it."""
        txn = self._txn
        return txn if txn is not None and txn.is_current(epoch, txn_id) else None

    def _on_start(self, msg: StartCommit) -> Ready:
        newer = self._round is None or (msg.epoch, msg.txn_id) > self._round
        if not self._fire(Event.START if newer else Event.STALE):
            return []
        self._round = (msg.epoch, msg.txn_id)
        self._drain_told = False
        offset = msg.offsets.get(self.key)
        self._committed = offset
        txn = self._txn = WriteState(msg.epoch, msg.txn_id, first_offset=offset)
        self._gap_seek = None
        ahead, self._ahead = self._ahead, None
        if self._cuts:
            self._floor = msg.floor
            return self._start_cut(msg.cut, txn, ahead)
        if ahead is not None and offset == ahead.first_offset and not self._reader_lost:
            txn.adopt(ahead)  # the reader is at ahead.next_offset already: no seek
            effects = [Resume(), *self._after_append(txn)]
            if ahead.records and ahead.ends_round:
                effects += self._request_commit(txn)  # no more batches may ever come
            return effects
        if offset is None:
            self._reader_at, self._reader_lost = None, False
            return [SeekToPolicy(), Resume()]
        if offset != self._reader_at or self._reader_lost:
            return [self._seek(offset), Resume()]
        return [Resume()]

    def _start_cut(self, cut: int | None, txn: WriteState, ahead: ReadAhead | None) -> Ready:
        """START with consistent cuts: what was held stays held if it starts where the
        round does, and the cut takes its part of it."""
        offset = txn.first_offset
        self._cut = cut
        self._marks.forget_through(offset)
        effects: Ready = [Resume()]
        if ahead is None or offset != ahead.first_offset or self._reader_lost:
            ahead = None
            if offset is None:
                self._reader_at, self._reader_lost = None, False
                effects = [SeekToPolicy(), Resume()]
            elif offset != self._reader_at or self._reader_lost:
                effects = [self._seek(offset), Resume()]
        self._ahead = ahead if ahead is not None or offset is None else ReadAhead(offset)
        if self._ahead is not None:
            self._ahead.full = False
        return effects + self._promote()

    def _cut_end(self, txn: WriteState) -> int | None:
        """Where the open round ends for its cut (None: not known yet)."""
        if txn.first_offset is None:
            return None
        return self._marks.end_for(self._cut, txn.first_offset)

    def _promote(self) -> Ready:
        """Consistent cuts: move the held batches the cut takes into the open round; at
        the round's end after END, flush the rest and report."""
        txn, ahead = self._txn, self._ahead
        if txn is None or ahead is None or self._state not in (State.WRITING, State.ENDING):
            return []
        end = self._cut_end(txn)
        if end is None:
            return []
        effects: Ready = []
        for batch in ahead.take_through(end):
            txn.append(batch)
            effects += self._after_append(txn)
        if self._state is State.ENDING and txn.next_offset == end:
            if txn.has_buffer:
                effects.append(self._flush(txn))
            effects += self._maybe_report()
        return effects

    def _hold(self, ahead: ReadAhead, batch: Batch, caught_up: bool) -> Ready:
        """Consistent cuts, a round open: hold the batch (contiguous, as a round's batches
        are: a gap seeks back once, a stale batch is dropped), then let the cut take."""
        first = batch.first_offset
        if first > ahead.next_offset and self._gap_seek != ahead.next_offset:
            self._gap_seek = ahead.next_offset
            self._dropped += 1
            return [self._seek(ahead.next_offset)]
        if first != ahead.next_offset:
            return self._drop(first, batch.next_offset)
        self._gap_seek = None
        effects = self._read_ahead(ahead, batch, caught_up, bounded=False) + self._promote()
        # Bounded only once all held lies past the cut's end and a marker past that end, at
        # or past the START's floor, was read: the round needs what comes up to its end, and
        # the next cut such a marker (``next_cut``) - pausing the reader short of either
        # stalls the cuts (for good, or a batch a round).
        txn = self._txn
        end = None if txn is None else self._cut_end(txn)
        seen = None if end is None else self._marks.highest(end)
        if (
            end is not None
            and self._ahead is ahead
            and ahead.first_offset >= end
            and seen is not None
            and (self._floor is None or seen >= self._floor)
        ):
            effects += self._bound(ahead)
        return effects

    def _on_end(self, msg: EndCommit, now: float) -> Ready:
        txn = self._current(msg.epoch, msg.txn_id)
        before = self._state
        if not self._fire(Event.STALE if txn is None else Event.END):
            return []
        assert txn is not None
        if before is State.REPORTED:
            assert txn.reported is not None
            return [SendMessage(to=COORDINATOR, message=txn.reported)]
        effects: Ready = []
        self._drain_told = False  # what is read from here on is the next round's
        self._judge_idle(txn, now)
        if self._cuts:
            self._judge_unmarked(txn)
        if self._cuts and (self._ahead is not None or txn.first_offset is None):
            pass  # held batches stay held: the round may still need some
        elif txn.next_offset is not None and not self._reader_lost:
            self._ahead = ReadAhead(txn.next_offset)  # keep reading for the next round
        else:
            effects.append(Pause())  # the start is unknown: nothing to continue from
        if txn.has_buffer:
            effects.append(self._flush(txn))
        return effects + self._maybe_report()

    def _on_ack(self, msg: AckCommit) -> Ready:
        before = self._state
        if not self._fire(Event.ACK if self._round == (msg.epoch, msg.txn_id) else Event.STALE):
            return []
        effects: Ready = [Pause()] if before is State.WRITING else []
        self._committed = msg.offsets.get(self.key)
        self._marks.forget_through(self._committed)
        ahead = self._ahead
        if ahead is not None and self._committed != ahead.first_offset:
            effects += self._drop_read_ahead()  # committed without us: START will seek back
        self._close()
        return effects

    def _on_records(self, batch: Batch, caught_up: bool) -> Ready:
        txn = self._txn
        first, next_ = batch.first_offset, batch.next_offset
        if first == next_:
            return []
        open_round = self._state in (State.WRITING, State.ENDING)
        if self._cuts and open_round and self._ahead is not None:
            return self._hold(self._ahead, batch, caught_up)
        if self._state is not State.WRITING and self._ahead is not None:
            return self._read_ahead(self._ahead, batch, caught_up)
        if self._state is not State.WRITING or txn is None or txn.next_offset is None:
            return self._drop(first, next_)
        if first > txn.next_offset and self._gap_seek != txn.next_offset:
            # a gap: a batch got lost; read again from where the accepted data ends, once
            self._gap_seek = txn.next_offset
            self._dropped += 1
            return [self._seek(txn.next_offset)]
        if first != txn.next_offset:  # from before a seek, or a gap already being re-read
            return self._drop(first, next_)
        txn.append(batch)
        self._progress_at = batch.received_at
        self._reader_at = next_
        self._gap_seek = None
        effects = self._after_append(txn)
        ends, told = self._reached_end(batch, caught_up)
        if ends:
            effects += self._request_commit(txn)
        return effects + told

    def _reached_end(self, batch: Batch, caught_up: bool) -> tuple[bool, Ready]:
        """Whether this batch ends the round: it reaches the high watermark, and either
        ``commit_when_caught_up`` or (``commit_when_drained``) at least a flush's worth was
        read since the partition last reached it - a backlog, drained, whatever rounds other
        partitions ended meanwhile (a round's buffer is no measure: rounds split backlogs).
        With it, DRAINED for the coordinator's pipeline-wide judgement, if due."""
        self._behind_records += batch.count
        self._behind_bytes += batch.nbytes
        if not caught_up:
            return False, []
        cfg = self.config
        records, nbytes = self._behind_records, self._behind_bytes
        self._behind_records = self._behind_bytes = 0
        backlog = records >= cfg.flush_max_records or nbytes >= cfg.flush_max_bytes
        told: Ready = []
        due = cfg.commit_when_drained and not cfg.commit_when_caught_up
        if due and records and not self._drain_told:
            self._drain_told = True
            drained = Drained(partition=self.key, records=records, nbytes=nbytes)
            told = [SendMessage(to=COORDINATOR, message=drained)]
        return cfg.commit_when_caught_up or (cfg.commit_when_drained and backlog), told

    def _judge_idle(self, txn: WriteState, now: float) -> None:
        """At END: a quiet round that read nothing while the log had data past the reader
        counts as idle-behind; when a re-sync is due, the next START seeks (module
        docstring)."""
        # with cuts the reader runs ahead of the round (held batches): judge where it is
        at, end = (self._reader_at if self._cuts else txn.next_offset), self._data_end
        if txn.records or txn.next_offset != txn.first_offset:
            self._idle_behind, self._resync_at = 0, 1
            return
        if at is None or end is None or end <= at:
            self._idle_behind = 0
            return
        if self._progress_at is None:
            self._progress_at = now
        if now - self._progress_at < self.config.commit_interval_s:
            return
        self._idle_behind += 1
        if self._idle_behind >= self._resync_at:
            self._reader_lost = True  # the next START seeks, even to where we think it is
            self._resyncs += 1
            self._resync_at = self._idle_behind + min(2**self._resyncs, MAX_RESYNC_GAP)

    def _judge_unmarked(self, txn: WriteState) -> None:
        """Consistent cuts: records held round after round with no cut marker read past
        them never reach the table - the source writes no markers (``cut_markers``).
        Said in the status (``last_error``) after ``STALL_ROUNDS`` such rounds, never
        silently."""
        held = self._ahead.records if self._ahead is not None else 0
        if not held or self._marks.highest(txn.next_offset) is not None:
            if self._unmarked_rounds >= STALL_ROUNDS and self._last_error == self._unmarked:
                self._last_error = None  # markers came after all: no longer true
            self._unmarked_rounds = 0
            return
        self._unmarked_rounds += 1
        if self._unmarked_rounds >= STALL_ROUNDS:
            self._last_error = self._unmarked = (
                f"consistent cuts: {held} records held past offset {txn.next_offset} and no "
                f"cut marker read after them for {self._unmarked_rounds} rounds - does the "
                "source write cut markers (the Postgres source's cut_markers: true)?"
            )

    def _read_ahead(
        self, ahead: ReadAhead, batch: Batch, caught_up: bool, bounded: bool = True
    ) -> Ready:
        if batch.first_offset != ahead.next_offset:
            self._dropped += 1
            self._reader_lost = True  # stale or a gap: the next START seeks
            return self._drop_read_ahead()
        ahead.append(batch)
        if batch.cut_lsn is not None:
            # Only from a batch taken in order: the marks must hold EVERY marker from the
            # round's start on (``CutMarks.end_for``) - one from a batch past a gap would
            # make a cut end before the markers in the gap.
            self._marks.seen(batch.next_offset, batch.cut_lsn)
        self._progress_at = batch.received_at
        ends, told = self._reached_end(batch, caught_up)
        ahead.ends_round = ends or ahead.ends_round
        self._reader_at = batch.next_offset
        return [*told, *self._bound(ahead)] if bounded else told

    def _bound(self, ahead: ReadAhead) -> Ready:
        """Past the flush bounds the read-ahead pauses the reader: wait for the next START."""
        cfg = self.config
        if not ahead.full and (
            ahead.records >= cfg.flush_max_records or ahead.nbytes >= cfg.flush_max_bytes
        ):
            ahead.full = True
            return [Pause()]
        return []

    def _drop_read_ahead(self) -> Ready:
        ahead, self._ahead = self._ahead, None
        return [Pause()] if ahead is not None and not ahead.full else []

    def _after_append(self, txn: WriteState) -> Ready:
        """Flush a buffer that reached the flush bounds; ask for an early commit when the
        buffer keeps filling up (KIP-89)."""
        cfg = self.config
        if (
            txn.buffered_records < cfg.flush_max_records
            and txn.buffered_bytes < cfg.flush_max_bytes
        ):
            return []
        effects: Ready = [self._flush(txn)]
        txn.size_flushes += 1
        wanted = cfg.request_commit_after_flushes
        if wanted and txn.size_flushes >= wanted:
            effects += self._request_commit(txn)
        return effects

    def _request_commit(self, txn: WriteState) -> Ready:
        """REQUEST-COMMIT, once per round (KIP-89: the buffer keeps filling up; or, with
        ``commit_when_caught_up``, there is nothing more to read)."""
        if txn.commit_requested:
            return []
        txn.commit_requested = True
        request = RequestCommit(epoch=txn.epoch, txn_id=txn.txn_id, partition=self.key)
        return [SendMessage(to=COORDINATOR, message=request)]

    def _on_flushed(self, flush_id: int, files: Iterable[DataFile]) -> Ready:
        txn = self._txn
        ours = txn is not None and flush_id in txn.in_flight
        if not self._fire(Event.FLUSHED if ours else Event.LATE_RESULT):
            return []
        assert txn is not None and txn.flushed(flush_id, files)
        return self._maybe_report() if self._state is State.ENDING else []

    def _on_flush_failed(self, flush_id: int, reason: str) -> Ready:
        txn = self._txn
        before = self._state
        ours = txn is not None and flush_id in txn.in_flight
        if not self._fire(Event.FLUSH_FAILED if ours else Event.LATE_RESULT):
            return []
        assert txn is not None
        self._last_error = f"flush {flush_id} of txn {txn.txn_id} failed: {reason}"
        effects: Ready = [Pause()] if before is State.WRITING else self._drop_read_ahead()
        if self._cuts:
            self._ahead = None  # held batches follow a round that is gone: read again
        # Tell the coordinator now, so the round does not wait write_timeout_s for us.
        lost = RoundLost(epoch=txn.epoch, txn_id=txn.txn_id, partition=self.key, reason=reason)
        effects.append(SendMessage(to=COORDINATOR, message=lost))
        self._close()
        return effects

    def _on_resolved(self, offset: int) -> Ready:
        txn = self._txn
        awaited = txn is not None and txn.first_offset is None
        if not self._fire(Event.POSITION_RESOLVED if awaited else Event.LATE_RESULT):
            return []
        assert txn is not None
        txn.resolve(offset)
        effects: Ready = []
        if self._reader_lost:  # the reader's steering was lost or it attached meanwhile
            effects = [self._seek(offset), Resume()] if self.is_reading else [self._seek(offset)]
        self._reader_at = offset
        if self._cuts:
            self._ahead = ReadAhead(offset)  # batches before now came from nowhere known
            return effects + self._promote()
        return effects + (self._maybe_report() if self._state is State.ENDING else [])

    def _on_tick(self, now: float) -> Ready:
        txn = self._txn
        aged = txn is not None and txn.is_aged(now, self.config.flush_max_age_s)
        return [self._flush(txn)] if self._state is State.WRITING and txn and aged else []

    # -- helpers ---------------------------------------------------------------------------

    def _flush(self, txn: WriteState) -> Flush:
        flush_id = self._next_flush_id
        self._next_flush_id += 1
        return txn.take_flush(flush_id)

    def _maybe_report(self) -> Ready:
        txn = self._txn
        if txn is None or not txn.can_report():
            return []
        cut_seen = cut_first = None
        if self._cuts:
            if txn.next_offset != self._cut_end(txn):
                return []  # the cut's end is still to be read
            cut_seen = self._marks.highest(txn.next_offset)
            cut_first = self._marks.lowest(txn.next_offset)
        self._fire(Event.REPORT)
        status = txn.write_status(self.key, cut_seen, cut_first)
        return [SendMessage(to=COORDINATOR, message=status)]

    def _close(self) -> None:
        """Forget the open round (its flushes' late results will be ignored)."""
        self._txn = None

    def _seek(self, offset: int) -> Seek:
        self._reader_at, self._reader_lost = offset, False
        return Seek(offset)

    def _drop(self, first: int, next_: int) -> Ready:
        """Drop a batch; if it starts where the reader was, the reader is now past it."""
        self._dropped += 1
        if first == self._reader_at:
            self._reader_at = next_
        else:
            self._reader_lost = True
        return []

    def _check_flush_id(self, flush_id: int) -> None:
        if not 0 <= flush_id < self._next_flush_id:
            raise ProtocolError(f"{self.key}: flush {flush_id} was never issued")
