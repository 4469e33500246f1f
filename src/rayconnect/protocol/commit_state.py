"""One commit round's bookkeeping for the coordinator, apart from IO and from transitions.

Like Iceberg Kafka Connect's ``CommitState``: the coordinator asks readable questions
(``should_end(now)``, ``is_commit_ready()``, ``is_commit_timed_out(now)``) and this class
answers them from what the round has seen. Time is always an argument; nothing here reads a
clock, so a test decides exactly when a timeout fires.

A round is identified by ``(epoch, txn_id)`` and starts from ``start_offsets``: the table's
committed offsets for those of its ``partitions`` the table knows (a partition the table has
never committed is absent and starts wherever its participant's starting-offset policy says).

Validation of a WRITE-STATUS is where exactly-once is decided, so it is strict: a status
counts only if it is for this round, from one of its partitions, the first from that
partition, starts exactly at the round's starting offset (when the table has one) and does
not go backwards. Anything else is rejected and the partition is treated as not reported.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import msgspec

from rayconnect.protocol.effects import CommitTable, RoundMetadata
from rayconnect.protocol.messages import RequestCommit, WriteStatus


class RejectionKind(enum.Enum):
    """Why a WRITE-STATUS cannot count; the coordinator decides by kind, never by text."""

    ANOTHER_ROUND = "another round"
    NOT_ENDED = "round not ended"
    UNKNOWN_PARTITION = "partition not in the round"
    DUPLICATE = "duplicate"  # the partition already reported: a duplicated message
    LOST = "lost"
    WRONG_START = "wrong start"
    BAD_RANGE = "bad range"
    NEGATIVE_COUNT = "negative record count"


class Rejection(msgspec.Struct, frozen=True):
    """A rejected WRITE-STATUS: ``kind`` to decide on, ``detail`` for people."""

    kind: RejectionKind
    detail: str = ""

    def __str__(self) -> str:
        return self.detail or self.kind.value


class CommitState:
    """The statuses and clocks of one round ``(epoch, txn_id)``."""

    def __init__(
        self,
        *,
        epoch: int,
        txn_id: int,
        partitions: Iterable[str],
        start_offsets: Mapping[str, int],
        started_at: float,
        commit_interval_s: float,
        write_timeout_s: float,
        interval_from: float | None = None,
        table_offsets: Mapping[str, int] | None = None,
        cut: int | None = None,
    ) -> None:
        self.epoch = epoch
        #: consistent cuts: the LSN every partition of the round ends at (StartCommit.cut)
        self.cut = cut
        self.txn_id = txn_id
        self.partitions: frozenset[str] = frozenset(partitions)
        self.start_offsets: dict[str, int] = {
            k: v for k, v in start_offsets.items() if k in self.partitions
        }
        #: partitions starting over (``protocol.offset_range``) -> the table's stale offset,
        #: which the commit's compare-and-set expects instead of the START's
        self.starting_over: dict[str, int] = {
            k: v
            for k, v in (table_offsets or {}).items()
            if k in self.start_offsets and self.start_offsets[k] != v
        }
        self.started_at = started_at
        #: The commit interval counts from here: the previous round's END when that round
        #: finished, because participants read ahead from that END on; else the START.
        self.interval_from = started_at if interval_from is None else interval_from
        self.ended_at: float | None = None
        self.commit_interval_s = commit_interval_s
        self.write_timeout_s = write_timeout_s
        self.statuses: dict[str, WriteStatus] = {}
        # Partitions that told us they cannot report (ROUND-LOST, or restarted after END):
        # not waited for; their offsets stay where the round started.
        self.lost: set[str] = set()
        # ``committable()`` until the next status or loss: a round's evaluation asks it
        # twice (``has_data``, ``commit_table``), and at 10,000 partitions each costs ms
        self._committable: frozenset[str] | None = None

    # -- inputs ----------------------------------------------------------------------------

    def is_current(self, epoch: int, txn_id: int) -> bool:
        return (epoch, txn_id) == (self.epoch, self.txn_id)

    def counts_request(self, message: RequestCommit) -> bool:
        """Whether a participant's request to end early (KIP-89) can end this round."""
        return (
            self.is_current(message.epoch, message.txn_id)
            and message.partition in self.partitions
            and self.ended_at is None
        )

    def restart_matters(self, key: str) -> bool:
        """Whether a fresh participant of ``key`` changes this round: it can rejoin a running
        round, or an ended round must stop waiting for it."""
        return key in self.partitions and (not self.is_ended or key in self.missing())

    def end(self, now: float) -> None:
        self.ended_at = now

    def rejection(self, status: WriteStatus) -> Rejection | None:
        """Why ``status`` cannot count for this round, or None if it can."""
        key = status.partition
        if not self.is_current(status.epoch, status.txn_id):
            return Rejection(RejectionKind.ANOTHER_ROUND)
        if self.ended_at is None:
            return Rejection(RejectionKind.NOT_ENDED)
        if key not in self.partitions:
            return Rejection(RejectionKind.UNKNOWN_PARTITION)
        if key in self.statuses:
            return Rejection(RejectionKind.DUPLICATE)
        if key in self.lost:
            return Rejection(RejectionKind.LOST)
        start = self.start_offsets.get(key)
        if start is not None and status.first_offset != start:
            detail = f"first_offset {status.first_offset} != round start {start}"
            return Rejection(RejectionKind.WRONG_START, detail)
        if status.first_offset < 0 or status.next_offset < status.first_offset:
            detail = f"bad range [{status.first_offset}, {status.next_offset})"
            return Rejection(RejectionKind.BAD_RANGE, detail)
        if status.records < 0:
            return Rejection(RejectionKind.NEGATIVE_COUNT)
        return None

    def add_status(self, status: WriteStatus) -> Rejection | None:
        """Record ``status`` unless it is rejected; returns the rejection reason, if any."""
        reason = self.rejection(status)
        if reason is None:
            self.record(status)
        return reason

    def record(self, status: WriteStatus) -> None:
        """Record a status ``rejection`` already passed (the coordinator asks it first, to
        pick its event): the check once per status, not twice, at 10,000 a round."""
        self.statuses[status.partition] = status
        self._committable = None

    def mark_lost(self, key: str) -> bool:
        """``key`` will not report this round; True if that changes anything."""
        if key not in self.partitions or key in self.statuses or key in self.lost:
            return False
        self.lost.add(key)
        self._committable = None
        return True

    # -- predicates ------------------------------------------------------------------------

    @property
    def is_ended(self) -> bool:
        return self.ended_at is not None

    def should_end(self, now: float) -> bool:
        """Time to send END-COMMIT: the commit interval passed (a REQUEST-COMMIT ends the
        round at once, without waiting for a tick)."""
        return not self.is_ended and now >= self.interval_from + self.commit_interval_s

    def missing(self) -> frozenset[str]:
        """Partitions of the round still awaited: not (validly) reported, not lost."""
        return self.partitions - self.statuses.keys() - self.lost

    def is_commit_ready(self) -> bool:
        """Every partition reported or is lost: nothing more to wait for. Counted, not a set
        difference: it is asked after every WRITE-STATUS, and at 10,000 partitions the
        difference made a round quadratic (12 s of coordinator CPU). ``statuses`` and
        ``lost`` are disjoint subsets of ``partitions`` (``add_status``, ``mark_lost``)."""
        return self.is_ended and len(self.statuses) + len(self.lost) == len(self.partitions)

    def is_commit_timed_out(self, now: float) -> bool:
        """END went out ``write_timeout_s`` ago and some partition still has not reported."""
        return (
            self.ended_at is not None
            and not self.is_commit_ready()
            and now >= self.ended_at + self.write_timeout_s
        )

    def has_data(self) -> bool:
        """Some committable partition moved its offset: there is something to commit."""
        return any(self._moved(k) for k in self.committable())

    def reported_data(self) -> bool:
        """Some reported partition moved its offset (committable or not)."""
        return any(self._moved(k) for k in self.statuses)

    def _moved(self, key: str) -> bool:
        """Its offset moves: it read something, or it starts over (its table offset lay
        outside its log), which the table must record even without records."""
        status = self.statuses[key]
        return status.next_offset > status.first_offset or key in self.starting_over

    def deadline(self) -> float | None:
        """When the round next needs a ``tick``: its END, or its write timeout."""
        if self.ended_at is None:
            return self.interval_from + self.commit_interval_s
        return None if self.is_commit_ready() else self.ended_at + self.write_timeout_s

    # -- the commit --------------------------------------------------------------------------

    def committable(self) -> frozenset[str]:
        """The reported partitions whose files can be committed: a file shared by several
        partitions (``DataFile.shared_by``) goes in only if every one of them is committed
        AND reported that file - else a partition that is lost, late or restarted would have
        its rows in the table without its offset (duplicates when it re-reads them). Their
        partners are left out with it, to the fixpoint; they re-read from the table like
        any partition a partial commit left behind."""
        if self._committable is None:
            self._committable = self._find_committable()
        return self._committable

    def _find_committable(self) -> frozenset[str]:
        keys = set(self.statuses)
        # Each shared file once (a host's file is shared by all its partitions): checking it
        # per reporting partition made a round quadratic in a host's partitions.
        reporters: dict[str, set[str]] = {}
        partners: dict[str, tuple[str, ...]] = {}
        for key, status in self.statuses.items():
            for f in status.files:
                if f.shared_by:
                    reporters.setdefault(f.path, set()).add(key)
                    partners[f.path] = f.shared_by
        while True:
            bad = [
                path
                for path, shared_by in partners.items()
                if not all(k in keys and k in reporters[path] for k in shared_by)
            ]
            dropped = {k for path in bad for k in reporters.pop(path) if k in keys}
            for path in bad:
                del partners[path]
            if not dropped:
                break
            keys -= dropped
        return frozenset(keys)

    def commit_table(self, pipeline: str) -> CommitTable:
        """The table commit of everything reported: all partitions, or those that made it
        before the timeout (a partial commit) and share no file with one that did not.
        A shared file goes in once."""
        keys = sorted(self.committable())
        statuses = [self.statuses[k] for k in keys]
        files = {f.path: f for s in statuses for f in s.files}
        resets = {k: self.starting_over[k] for k in keys if k in self.starting_over}
        partial = bool(self.missing() or self.lost or len(keys) < len(self.statuses))
        return CommitTable(
            epoch=self.epoch,
            txn_id=self.txn_id,
            files=tuple(files.values()),
            expected={k: resets.get(k, self.start_offsets.get(k)) for k in keys},
            offsets={s.partition: s.next_offset for s in statuses},
            starts={s.partition: s.first_offset for s in statuses},
            metadata=RoundMetadata(
                pipeline=pipeline,
                epoch=self.epoch,
                txn_id=self.txn_id,
                partial=partial,
                records=sum(s.records for s in statuses),
                offset_resets=resets,
                cut_lsn=None if partial else self.cut,
            ),
        )
