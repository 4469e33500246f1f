"""Pure protocol code: message types and state machines, with no IO and no IO libraries."""

from rayconnect.protocol.messages import (
    AckCommit,
    EndCommit,
    GetMetadataUpdateEvent,
    Message,
    MetadataUpdateEvent,
    RequestCommit,
    StartCommit,
    WriteStatus,
    decode,
    encode,
)
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
    "DataFile",
    "EndCommit",
    "FileStats",
    "GetMetadataUpdateEvent",
    "KafkaPartitionSplit",
    "KafkaStream",
    "Message",
    "MetadataUpdateEvent",
    "RequestCommit",
    "StartCommit",
    "TopicPartition",
    "WriteStatus",
    "check_name",
    "decode",
    "encode",
]
