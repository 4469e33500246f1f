"""Source pipelines (KIP-618): any source -> Kafka, records and source offsets in one
transaction per task. ``SourceTask`` is the API; File/Delta/Generator sources are built in."""

from rayconnect.source.base import (
    RecordMetadata,
    SourceRecord,
    SourceTask,
    SourceTaskContext,
    TransactionContext,
    task_of,
)
from rayconnect.source.config import KafkaTarget, SourceSettings
from rayconnect.source.delta import DeltaTableSource
from rayconnect.source.files import FileSource
from rayconnect.source.generator import GeneratorSource

__all__ = [
    "DeltaTableSource",
    "FileSource",
    "GeneratorSource",
    "KafkaTarget",
    "RecordMetadata",
    "SourceRecord",
    "SourceSettings",
    "SourceTask",
    "SourceTaskContext",
    "TransactionContext",
    "task_of",
]
