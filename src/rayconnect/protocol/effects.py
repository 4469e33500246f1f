"""Effects: what a state machine asks its actor to do (the etcd-raft ``Ready``).

The machines in this package do no IO. Each input returns a ``Ready`` - a list of effects
the actor carries out *in order* (a ``Seek`` before the ``Resume`` that follows it). Effects
are frozen msgspec structs: values that tests compare with ``==`` and actors can log.

Addresses. ``Broadcast`` lists its recipients (the partition keys of the round), so a Ready
is complete by itself: an actor may queue it and carry it out after further steps without
asking the machine who "everyone" was. ``SendMessage`` goes to one peer; participants only
ever talk to ``COORDINATOR``, a name no partition key can take (keys always contain ``/``).
(The source task's records go out by its own effects, in ``protocol/source_task.py``.)
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from rayconnect.protocol.messages import Message
from rayconnect.protocol.types import DataFile

COORDINATOR = "coordinator"
#: the table metadata key of a version's cut (``RoundMetadata.cut_lsn``)
CUT_LSN_KEY = "rayconnect.cut_lsn"


# Subclasses say frozen=True again: msgspec inherits it, mypy (dataclass_transform) does not.
class _Effect(msgspec.Struct, frozen=True, tag=True):
    pass


class SendMessage(_Effect, frozen=True):
    """Deliver the protocol ``message`` to one peer: a partition key, or ``COORDINATOR``."""

    to: str
    message: Message


class Broadcast(_Effect, frozen=True):
    """Deliver ``message`` to every participant in ``to`` (the round's partition keys)."""

    to: tuple[str, ...]
    message: Message


class RoundMetadata(msgspec.Struct, frozen=True):
    """What a round's table version records about the round beside its files and offsets
    (Delta commit info, Iceberg snapshot summary), for history tools and operators."""

    pipeline: str
    epoch: int
    txn_id: int
    #: committed without every partition (some missed the round's deadline)
    partial: bool
    records: int
    #: partitions this version starts over (``protocol.offset_range``): key -> the stale
    #: offset outside the partition's log that the version's offset replaces
    offset_resets: dict[str, int] = {}
    #: consistent cuts: every partition of the version ends at its cut marker of this LSN
    #: (None: not a cut - cuts are off, or the commit is partial)
    cut_lsn: int | None = None

    def as_table_metadata(self) -> dict[str, str]:
        """The table's spelling: ``rayconnect.<field>`` string values."""
        spelled = {
            "rayconnect.pipeline": self.pipeline,
            "rayconnect.epoch": str(self.epoch),
            "rayconnect.txn_id": str(self.txn_id),
            "rayconnect.partial": str(self.partial).lower(),
            "rayconnect.records": str(self.records),
        }
        if self.offset_resets:
            spelled["rayconnect.offset_resets"] = msgspec.json.encode(self.offset_resets).decode()
        if self.cut_lsn is not None:
            spelled[CUT_LSN_KEY] = str(self.cut_lsn)
        return spelled


class CommitTable(_Effect, frozen=True):
    """Commit ``files`` and the partitions' new ``offsets`` as ONE table version.

    The table must refuse (and the actor then report ``commit_failed``) unless the epoch
    ``epoch`` is still the newest one claimed AND every partition's committed offset still
    equals ``expected[key]`` (None = the table has no offset for it yet): compare-and-set,
    so neither a zombie coordinator nor a lost race can ever commit (I3). ``expected`` and
    ``offsets`` have the same keys: exactly the partitions this commit covers.
    """

    epoch: int
    txn_id: int
    files: tuple[DataFile, ...]
    expected: dict[str, int | None]
    offsets: dict[str, int]
    metadata: RoundMetadata
    #: where each partition's round started (its WRITE-STATUS's ``first_offset``): with
    #: routes, a table that gets a partition's rows for the first time is given this offset
    #: before any table commits (``tables.table_set``)
    starts: dict[str, int] = {}

    @property
    def resets(self) -> frozenset[str]:
        """Partitions whose offset this commit may move down (they start over)."""
        return frozenset(self.metadata.offset_resets)


class ReloadTable(_Effect, frozen=True):
    """Read the table's committed offsets (and its epoch) again, then call
    ``Coordinator.table_reloaded``: after a failed commit only the table knows the truth."""


class GiveUp(_Effect, frozen=True):
    """The pipeline cannot go on without a person (``reason`` says why): no further round."""

    reason: str


class Fenced(_Effect, frozen=True):
    """A newer coordinator epoch was claimed: this coordinator must stop for good."""

    epoch: int
    table_epoch: int


class PartitionsRetired(_Effect, frozen=True):
    """These partitions left the pipeline (FLIP-246) after a round whose END went out after
    their retirement was asked for finished (committed, or found empty): they are in no
    further round. Stop their participants; their offsets stay in the table."""

    keys: tuple[str, ...]


class Stopped(_Effect, frozen=True):
    """The stop asked for is done: the last round was committed, found empty or discarded
    (or there was none to finish, or the stop did not wait for it). The coordinator sends
    nothing more; its actor stops ticking and reports."""


class RoundFinished(_Effect, frozen=True):
    """Round ``txn_id`` finished: committed as table ``version`` (``files`` added, START to
    commit in ``duration_s``), or found empty (``version`` None). ``end_to_start_s``: its END
    to the next round's START - the protocol's own cost of a round; None when no START
    followed at once (a stop, or a table read first). The actor's outage watch learns that
    rounds work again; the dashboard gets the timings."""

    txn_id: int
    version: int | None
    files: int
    duration_s: float | None
    end_to_start_s: float | None


class RoundDiscarded(_Effect, frozen=True):
    """Round ``txn_id`` was discarded (its commit failed, or time ran out with nothing to
    commit): the table decides where the next one starts. ``reason`` for the outage watch."""

    txn_id: int
    reason: str


class Seek(_Effect, frozen=True):
    """Make the reader deliver this partition from ``offset`` on."""

    offset: int


class SeekToPolicy(_Effect, frozen=True):
    """The table has no offset for this partition: seek by the starting-offset policy
    (earliest/latest), then report the concrete offset with ``position_resolved``."""


class Pause(_Effect, frozen=True):
    """Stop reading this partition (batches already on their way are dropped by the machine)."""


class Resume(_Effect, frozen=True):
    """Start reading this partition again."""


class FindReader(_Effect, frozen=True):
    """A steering effect missed this partition's reader (``protocol.reader_link``): look the
    reader up, then call the participant's ``reader_found`` or ``reader_not_found``."""


#: What a participant asks of its partition's reader, in order.
Steer: TypeAlias = Seek | Pause | Resume


class ReaderSteer(msgspec.Struct, frozen=True):
    """One partition's steering as a participant host sends it to the partition's reader:
    the machine's own effect, addressed (a reader serves many partitions)."""

    key: str
    action: Seek | Pause | Resume


class Flush(_Effect, frozen=True):
    """Write the buffered ``batches`` (opaque handles, object refs in production) to files,
    then call ``flushed(flush_id, files)`` or ``flush_failed(flush_id, reason)``.

    ``first_offset``/``next_offset`` is the offset range the batches hold, contiguous.
    """

    flush_id: int
    batches: tuple[object, ...]
    first_offset: int
    next_offset: int
    records: int
    nbytes: int


Effect: TypeAlias = (
    SendMessage
    | Broadcast
    | CommitTable
    | ReloadTable
    | Fenced
    | GiveUp
    | PartitionsRetired
    | Stopped
    | RoundFinished
    | RoundDiscarded
    | Seek
    | SeekToPolicy
    | Pause
    | Resume
    | FindReader
    | Flush
)
Ready: TypeAlias = list[Effect]
