"""KafkaMetadataService implementations (FLIP-246): where a pipeline's streams come from.

IO is allowed here (files, Kafka admin API), Ray is not: services are plain objects that an
enumerator actor polls through ``poll_service``.
static.py, single_cluster.py and file_service.py each satisfy the ``KafkaMetadataService``
protocol of base.py.
"""

from rayconnect.metadata.base import (
    KafkaMetadataService,
    MetadataError,
    clusters_of,
    poll_service,
    select_streams,
)
from rayconnect.metadata.file_service import FileMetadataService, MetadataFileError, parse_streams
from rayconnect.metadata.single_cluster import SingleClusterMetadataService, streams_of_topics
from rayconnect.metadata.static import StaticMetadataService

__all__ = [
    "FileMetadataService",
    "KafkaMetadataService",
    "MetadataError",
    "MetadataFileError",
    "SingleClusterMetadataService",
    "StaticMetadataService",
    "clusters_of",
    "parse_streams",
    "poll_service",
    "select_streams",
    "streams_of_topics",
]
