"""rayconnect: exactly-once pipelines between Kafka and lakehouse tables on Ray.

``import rayconnect as rc`` gives the whole API. Names are resolved lazily, so importing a
pure sub-package (``rayconnect.protocol``) never drags in Ray, Spark or Kafka clients.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "SinkPipeline": "rayconnect.api",
    "PipelineHandle": "rayconnect.api",
    "PipelineError": "rayconnect.api",
    "attach": "rayconnect.api",
    "KafkaSource": "rayconnect.config",
    "DeltaSink": "rayconnect.config",
    "StaticMetadataService": "rayconnect.config",
    "CommitSettings": "rayconnect.config",
    "SparkSettings": "rayconnect.config",
    "Placement": "rayconnect.placement",
    "ConfigError": "rayconnect.config",
    "FileMetadataService": "rayconnect.metadata",
    "SingleClusterMetadataService": "rayconnect.metadata",
    "KafkaStream": "rayconnect.protocol.types",
    "ClusterMetadata": "rayconnect.protocol.types",
    "TopicPartition": "rayconnect.protocol.types",
    "SourcePipeline": "rayconnect.source_pipeline",
    "attach_source": "rayconnect.source_pipeline",
    "SourceRecord": "rayconnect.source",
    "SourceTask": "rayconnect.source",
    "SourceTaskContext": "rayconnect.source",
    "KafkaTarget": "rayconnect.source",
    "FileSource": "rayconnect.source",
    "DeltaTableSource": "rayconnect.source",
    "GeneratorSource": "rayconnect.source",
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
