"""rayconnect: exactly-once pipelines between Kafka and lakehouse tables on Ray.

``import rayconnect as rc`` gives the whole API. Names are resolved lazily, so importing a
pure sub-package (``rayconnect.protocol``) never drags in Ray, Spark or Kafka clients.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "SinkPipeline": "rayconnect.pipelines.sink",
    "PipelineHandle": "rayconnect.pipelines.sink",
    "RayconnectError": "rayconnect.errors",
    "PipelineError": "rayconnect.errors",
    "PipelineNotFoundError": "rayconnect.errors",
    "PipelineAlreadyRunningError": "rayconnect.errors",
    "TableRecoveryError": "rayconnect.errors",
    "RayUnavailableError": "rayconnect.errors",
    "PipelineStatus": "rayconnect.protocol.status",
    "TableStatus": "rayconnect.protocol.status",
    "attach": "rayconnect.pipelines.attach",
    "KafkaSource": "rayconnect.config.sink",
    "DeltaSink": "rayconnect.config.sink",
    "IcebergSink": "rayconnect.config.sink",
    "RestCatalog": "rayconnect.config.rest_catalog",
    "Routes": "rayconnect.config.routes",
    "Route": "rayconnect.config.routes",
    "StaticMetadataService": "rayconnect.metadata",
    "CommitSettings": "rayconnect.protocol.settings",
    "CompactSettings": "rayconnect.protocol.upkeep",
    "LogSettings": "rayconnect.protocol.upkeep",
    "SparkSettings": "rayconnect.config.spark",
    "ConfigError": "rayconnect.errors",
    "Placement": "rayconnect.config.placement",
    "FileMetadataService": "rayconnect.metadata",
    "SingleClusterMetadataService": "rayconnect.metadata",
    "KafkaStream": "rayconnect.protocol.types",
    "ClusterMetadata": "rayconnect.protocol.types",
    "TopicPartition": "rayconnect.protocol.types",
    "SourcePipeline": "rayconnect.pipelines.source",
    "SourcePipelineHandle": "rayconnect.pipelines.source",
    "DiscoveryError": "rayconnect.errors",
    "JavaNotFoundError": "rayconnect.errors",
    "OffsetsOutOfRangeError": "rayconnect.errors",
    "attach_source": "rayconnect.pipelines.source",
    "SourceRecord": "rayconnect.source_tasks",
    "SourceTask": "rayconnect.source_tasks",
    "SourceTaskContext": "rayconnect.source_tasks",
    "KafkaTarget": "rayconnect.config.source",
    "FileSource": "rayconnect.source_tasks",
    "DeltaTableSource": "rayconnect.source_tasks",
    "PostgresSource": "rayconnect.source_tasks",
    "GeneratorSource": "rayconnect.source_tasks",
    "Mirror": "rayconnect.pipelines.mirror",
    "MirrorHandle": "rayconnect.pipelines.mirror",
    "MirrorConfig": "rayconnect.config.mirror",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rayconnect' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
