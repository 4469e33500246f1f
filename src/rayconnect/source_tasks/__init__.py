"""What a source pipeline runs (KIP-618): ``SourceTask`` is the API a user implements; the
File, Delta-table, Generator and Postgres tasks are built in. The pipeline itself is
``rayconnect.pipelines.source``."""

from rayconnect.source_tasks.base import (
    RecordMetadata,
    SourceRecord,
    SourceTask,
    SourceTaskContext,
    TransactionContext,
    task_of,
)
from rayconnect.source_tasks.delta import DeltaTableSource
from rayconnect.source_tasks.files import FileSource
from rayconnect.source_tasks.generator import GeneratorSource
from rayconnect.source_tasks.postgres import PostgresSource

__all__ = [
    "DeltaTableSource",
    "FileSource",
    "GeneratorSource",
    "PostgresSource",
    "RecordMetadata",
    "SourceRecord",
    "SourceTask",
    "SourceTaskContext",
    "TransactionContext",
    "task_of",
]
