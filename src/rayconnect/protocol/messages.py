"""The messages of the commit protocol (Hudi RFC-32) and of metadata discovery (FLIP-246).

Every message is a frozen msgspec Struct in one tagged union, so a message can be encoded to
msgpack, sent anywhere (a Ray call, a Kafka control topic) and decoded back to the exact type;
``decode`` rejects anything that is not a known message with a clear error.

Epochs and transaction ids order everything: ``epoch`` grows each time a coordinator starts
(it is fenced by the table, see coordinator.py), ``txn_id`` grows with each round of one epoch.
A receiver ignores any message whose ``(epoch, txn_id)`` is older than the newest it has seen.
"""

from __future__ import annotations

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
