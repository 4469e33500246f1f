"""Pure protocol code: message types and state machines, with no IO and no IO libraries."""

from rayconnect.protocol.coordinator import Coordinator
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.messages import (
    AckCommit,
    Drained,
    EndCommit,
    GetMetadataUpdateEvent,
    HostRound,
    HostWriteStatus,
    Message,
    MetadataUpdateEvent,
    ParticipantStarted,
    RequestCommit,
    RoundLost,
    StartCommit,
    WriteStatus,
    decode,
    encode,
)
from rayconnect.protocol.participant import Participant
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import (
    ClusterMetadata,
    DataFile,
    FileStats,
    KafkaPartitionSplit,
    KafkaStream,
    TopicPartition,
    check_name,
)

__all__ = [
    "AckCommit",
    "ClusterMetadata",
    "Coordinator",
    "CommitSettings",
    "Participant",
    "ProtocolError",
    "DataFile",
    "Drained",
    "EndCommit",
    "FileStats",
    "GetMetadataUpdateEvent",
    "HostRound",
    "HostWriteStatus",
    "KafkaPartitionSplit",
    "KafkaStream",
    "Message",
    "MetadataUpdateEvent",
    "ParticipantStarted",
    "RequestCommit",
    "RoundLost",
    "StartCommit",
    "TopicPartition",
    "WriteStatus",
    "check_name",
    "decode",
    "encode",
]
