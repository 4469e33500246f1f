"""KafkaMetadataService implementations (FLIP-246): where a pipeline's streams come from.

IO is allowed here (files, Kafka admin API), Ray is not: services are plain objects that an
enumerator actor polls through ``poll_service``. ``rayconnect.config.StaticMetadataService``
satisfies the same ``KafkaMetadataService`` protocol.
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

__all__ = [
    "FileMetadataService",
    "KafkaMetadataService",
    "MetadataError",
    "MetadataFileError",
    "SingleClusterMetadataService",
    "clusters_of",
    "parse_streams",
    "poll_service",
    "select_streams",
    "streams_of_topics",
]
