"""The messages of the commit protocol (Hudi RFC-32) and of metadata discovery (FLIP-246).

Every message is a frozen msgspec Struct in one tagged union, so a message can be encoded to
msgpack, sent anywhere (a Ray call, a Kafka control topic) and decoded back to the exact type;
``decode`` rejects anything that is not a known message with a clear error.

Epochs and transaction ids order everything: ``epoch`` grows each time a coordinator starts
(it is fenced by the table, see coordinator.py), ``txn_id`` grows with each round of one epoch.
A receiver ignores any message whose ``(epoch, txn_id)`` is older than the newest it has seen.

Per-host rounds. The machines speak per partition (START, END, ACK, WRITE-STATUS each name
one round and reach one partition), but a round's messages travel per *participant host*:
the coordinator sends a host one HOST-START/HOST-END/HOST-ACK naming its partitions (the
offsets as one dict, only the host's), and a host answers with one HOST-WRITE-STATUS for
the partitions that reported together (parallel arrays; a file shared by them listed once).
At 10,000 partitions in 40 hosts a round is then ~160 messages instead of ~40,000 objects.
``HostWriteStatus.statuses()`` and ``HostRound.per_partition()`` turn them back into the
per-partition messages the machines take, so the protocol, its validation and its simulation
stay per partition: the envelopes change how many objects cross the wire, never what a
partition is told or reports.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from rayconnect.protocol.types import DataFile, KafkaPartitionSplit, KafkaStream


# Subclasses say frozen=True again: msgspec inherits it, mypy (dataclass_transform) does not.
class _Message(msgspec.Struct, frozen=True, tag=True, tag_field="type"):
    pass


class StartCommit(_Message, tag="START-COMMIT", frozen=True):
    """Coordinator -> participants: a round begins. ``offsets`` (partition key -> next offset
    to read) are the table's committed offsets this round starts from."""

    epoch: int
    txn_id: int
    offsets: dict[str, int]
    #: consistent cuts (``commit.consistent_cuts``): each partition takes the records up to
    #: its cut marker of this LSN (``protocol/cut_marks.py``); None: nothing this round
    cut: int | None = None
    #: consistent cuts: no later cut is below this LSN (``cut_floor``): a partition reads
    #: on until it has a marker at or past it before its read-ahead bound pauses it
    floor: int | None = None


class EndCommit(_Message, tag="END-COMMIT", frozen=True):
    """Coordinator -> participants: stop reading, flush, report WRITE-STATUS."""

    epoch: int
    txn_id: int


class WriteStatus(_Message, tag="WRITE-STATUS", frozen=True):
    """Participant -> coordinator: everything it wrote in this round.

    ``first_offset`` is where the round started for this partition and ``next_offset`` the
    offset after the last record written; an idle partition reports
    ``first_offset == next_offset`` and no files.
    """

    epoch: int
    txn_id: int
    partition: str
    files: tuple[DataFile, ...]
    first_offset: int
    next_offset: int
    records: int
    #: consistent cuts: the highest cut marker LSN read past the round's start (None: none)
    cut_seen: int | None = None
    #: consistent cuts: the lowest marker LSN read past the round's end - no later cut may
    #: be below it (``next_cut``); None: none read
    cut_first: int | None = None


class AckCommit(_Message, tag="ACK-COMMIT", frozen=True):
    """Coordinator -> participants: the round is in table ``version``; ``offsets`` are now
    the committed offsets (consumer-group commits for lag monitoring may follow)."""

    epoch: int
    txn_id: int
    version: int
    offsets: dict[str, int]


class RequestCommit(_Message, tag="REQUEST-COMMIT", frozen=True):
    """Participant -> coordinator: my buffer keeps filling, please end the round early (KIP-89)."""

    epoch: int
    txn_id: int
    partition: str


class Drained(_Message, tag="DRAINED", frozen=True):
    """Participant -> coordinator: between my last two catch-ups with the high watermark I
    read ``records`` (``nbytes``). At most once per round and once while reading ahead; the
    coordinator adds them up over the pipeline to tell a backlog from steady traffic
    (``commit_when_drained``, protocol/drain_window.py). Only pacing: never validated."""

    partition: str
    records: int
    nbytes: int


class RoundLost(_Message, tag="ROUND-LOST", frozen=True):
    """Participant -> coordinator: I cannot report this round (a flush failed, so data it
    accepted is gone). Do not wait ``write_timeout_s`` for me: commit the others now."""

    epoch: int
    txn_id: int
    partition: str
    reason: str = ""


class ParticipantStarted(_Message, tag="PARTICIPANT-STARTED", frozen=True):
    """Participant -> coordinator, from a fresh (e.g. restarted) participant: it knows no
    round. In a running round the coordinator sends it the round's START again; in an
    ended one it stops waiting for it."""

    partition: str


class HostWriteStatus(_Message, tag="HOST-WRITE-STATUS", frozen=True):
    """Participant host -> coordinator: the WRITE-STATUS of several of its partitions of one
    round, as parallel arrays (index ``i`` is ``partitions[i]``'s status).

    ``files`` holds each file once (a host's partitions share one file a flush); a
    partition's own files are ``file_indexes[i]``, positions in ``files``. Arrays of unequal
    length or an index outside ``files`` make the message invalid (``decode`` refuses it):
    a partition's status is never guessed."""

    epoch: int
    txn_id: int
    partitions: tuple[str, ...]
    first_offsets: tuple[int, ...]
    next_offsets: tuple[int, ...]
    records: tuple[int, ...]
    files: tuple[DataFile, ...] = ()
    file_indexes: tuple[tuple[int, ...], ...] = ()
    #: each partition's ``WriteStatus.cut_seen`` (empty: None for all)
    cuts_seen: tuple[int | None, ...] = ()
    #: each partition's ``WriteStatus.cut_first`` (empty: None for all)
    cuts_first: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.partitions)
        lengths = (len(self.first_offsets), len(self.next_offsets), len(self.records))
        if (
            lengths != (n, n, n)
            or len(self.file_indexes) not in (0, n)
            or len(self.cuts_seen) not in (0, n)
            or len(self.cuts_first) not in (0, n)
        ):
            raise ValueError(f"HOST-WRITE-STATUS arrays of unequal length for {n} partitions")
        if len(set(self.partitions)) != n:
            raise ValueError("HOST-WRITE-STATUS names a partition twice")
        nfiles = len(self.files)
        if any(not 0 <= j < nfiles for idx in self.file_indexes for j in idx):
            raise ValueError(f"HOST-WRITE-STATUS file index outside its {nfiles} files")

    @classmethod
    def of(cls, statuses: Sequence[WriteStatus]) -> HostWriteStatus:
        """Pack statuses of one round (distinct partitions) into one message."""
        first = statuses[0]
        positions: dict[str, int] = {}  # file path -> index in ``files``
        files: list[DataFile] = []
        indexes: list[tuple[int, ...]] = []
        for s in statuses:
            if (s.epoch, s.txn_id) != (first.epoch, first.txn_id):
                raise ValueError("HOST-WRITE-STATUS packs the statuses of one round only")
            own = []
            for f in s.files:
                j = positions.get(f.path)
                if j is None or (files[j] is not f and files[j] != f):
                    j = positions[f.path] = len(files)
                    files.append(f)
                own.append(j)
            indexes.append(tuple(own))
        return cls(
            epoch=first.epoch,
            txn_id=first.txn_id,
            partitions=tuple(s.partition for s in statuses),
            first_offsets=tuple(s.first_offset for s in statuses),
            next_offsets=tuple(s.next_offset for s in statuses),
            records=tuple(s.records for s in statuses),
            files=tuple(files),
            file_indexes=tuple(indexes) if files else (),
            cuts_seen=(
                tuple(s.cut_seen for s in statuses)
                if any(s.cut_seen is not None for s in statuses)
                else ()
            ),
            cuts_first=(
                tuple(s.cut_first for s in statuses)
                if any(s.cut_first is not None for s in statuses)
                else ()
            ),
        )

    def statuses(self) -> list[WriteStatus]:
        """The per-partition statuses, in order, exactly as their participants made them."""
        files, indexes = self.files, self.file_indexes or ((),) * len(self.partitions)
        # partitions that share their files share one tuple of them (a host's usually do)
        own: dict[tuple[int, ...], tuple[DataFile, ...]] = {}
        for idx in indexes:
            if idx not in own:
                own[idx] = tuple(files[j] for j in idx)
        cuts = self.cuts_seen or (None,) * len(self.partitions)
        firsts = self.cuts_first or (None,) * len(self.partitions)
        return [
            WriteStatus(
                self.epoch,
                self.txn_id,
                key,
                own[idx],
                first,
                next_,
                records,
                cut,
                cut_first,
            )
            for key, first, next_, records, idx, cut, cut_first in zip(
                self.partitions,
                self.first_offsets,
                self.next_offsets,
                self.records,
                indexes,
                cuts,
                firsts,
                strict=True,
            )
        ]


class HostRound(_Message, tag="HOST-ROUND", frozen=True):
    """Coordinator -> participant host: one round message (START, END or ACK) for
    ``partitions``, all of them this host's. A START's or ACK's ``offsets`` are cut to these
    partitions, so a host is never sent the whole pipeline's offsets.
    ``per_partition()`` is what each of them is told: the same message, as if sent alone."""

    partitions: tuple[str, ...]
    message: StartCommit | EndCommit | AckCommit

    @classmethod
    def of(cls, message: StartCommit | EndCommit | AckCommit, keys: Sequence[str]) -> HostRound:
        """``message`` for the partitions ``keys``, its offsets cut to them."""
        if isinstance(message, StartCommit | AckCommit):
            offsets = message.offsets
            mine = {k: offsets[k] for k in keys if k in offsets}
            message = msgspec.structs.replace(message, offsets=mine)
        return cls(partitions=tuple(keys), message=message)

    def per_partition(self) -> list[tuple[str, StartCommit | EndCommit | AckCommit]]:
        return [(key, self.message) for key in self.partitions]


class MetadataUpdateEvent(_Message, tag="METADATA-UPDATE", frozen=True):
    """Enumerator -> readers: the current streams, and the splits of the receiving reader."""

    streams: tuple[KafkaStream, ...]
    splits: tuple[KafkaPartitionSplit, ...] = ()


class GetMetadataUpdateEvent(_Message, tag="GET-METADATA-UPDATE", frozen=True):
    """Reader -> enumerator at start-up: send me fresh metadata before I read anything."""

    reader_id: str


Message = (
    StartCommit
    | EndCommit
    | WriteStatus
    | HostWriteStatus
    | HostRound
    | AckCommit
    | RequestCommit
    | Drained
    | RoundLost
    | ParticipantStarted
    | MetadataUpdateEvent
    | GetMetadataUpdateEvent
)

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    """Decode msgpack bytes into a message; raises ``msgspec.ValidationError`` naming the
    bad field, or ``msgspec.DecodeError`` for bytes that are not msgpack."""
    return _decoder.decode(data)
