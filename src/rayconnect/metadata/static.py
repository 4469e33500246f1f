"""``StaticMetadataService``: streams fixed at construction, FLIP-246's simplest service.

A msgspec Struct (tagged ``static``) so that it is both the Python API and the ``metadata:``
block of a pipeline file.
"""

from __future__ import annotations

import msgspec

from rayconnect.errors import ConfigError, require
from rayconnect.metadata.base import StreamLookups
from rayconnect.properties import check_client_properties
from rayconnect.protocol.types import KafkaStream, check_name
from rayconnect.redact import redacted_repr


class StaticMetadataService(msgspec.Struct, StreamLookups, frozen=True, tag="static"):
    """Streams fixed at construction (FLIP-246's simplest KafkaMetadataService)."""

    streams: tuple[KafkaStream, ...]

    __repr__ = redacted_repr  # Kafka properties hold credentials: masked in every repr

    def __post_init__(self) -> None:
        require(bool(self.streams), "metadata.streams: give at least one KafkaStream")
        seen: set[str] = set()
        for stream in self.streams:
            require(stream.stream_id not in seen, f"duplicate stream_id {stream.stream_id!r}")
            seen.add(stream.stream_id)
            require(bool(stream.clusters), f"stream {stream.stream_id!r} has no clusters")
            for cluster_id, cluster in stream.clusters.items():
                try:
                    check_name("cluster id", cluster_id)
                    for topic in cluster.topics:
                        check_name("topic", topic)
                except ValueError as e:
                    raise ConfigError(f"stream {stream.stream_id!r}: {e}") from None
                require(
                    bool(cluster.bootstrap_servers),
                    f"stream {stream.stream_id!r} cluster {cluster_id!r}: bootstrap_servers is empty",
                )
                for problem in check_client_properties(cluster.properties):
                    raise ConfigError(
                        f"stream {stream.stream_id!r} cluster {cluster_id!r} properties: {problem}"
                    )

    def get_all_streams(self) -> tuple[KafkaStream, ...]:
        return self.streams
