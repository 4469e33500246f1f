"""The configuration of a pipeline: typed msgspec Structs, validated when they are built.

The same Structs are the Python API (``rc.KafkaSource(...)``) and the schema of pipeline
files, so a YAML file and Python code can never drift apart. Every check lives in
``__post_init__``, which msgspec also runs when decoding a file: a configuration error is
raised, naming the bad field, before any actor starts.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from rayconnect.metadata.file_service import FileMetadataService
from rayconnect.metadata.single_cluster import SingleClusterMetadataService
from rayconnect.placement import Placement
from rayconnect.properties import check_client_properties
from rayconnect.protocol.streams import (
    MetadataError,
    clusters_of,
    select_streams,
    with_default_properties,
)
from rayconnect.protocol.types import ClusterMetadata, KafkaStream, check_name
from rayconnect.redact import redacted_repr

StartingOffsets = Literal["earliest", "latest"]


class ConfigError(ValueError):
    """A pipeline's configuration is invalid; the message names the field and the fix."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


class StaticMetadataService(msgspec.Struct, frozen=True, tag="static"):
    """Streams fixed at construction (FLIP-246's simplest KafkaMetadataService)."""

    streams: tuple[KafkaStream, ...]

    __repr__ = redacted_repr  # Kafka properties hold credentials: masked in every repr

    def __post_init__(self) -> None:
        _require(bool(self.streams), "metadata.streams: give at least one KafkaStream")
        seen: set[str] = set()
        for stream in self.streams:
            _require(stream.stream_id not in seen, f"duplicate stream_id {stream.stream_id!r}")
            seen.add(stream.stream_id)
            _require(bool(stream.clusters), f"stream {stream.stream_id!r} has no clusters")
            for cluster_id, cluster in stream.clusters.items():
                try:
                    check_name("cluster id", cluster_id)
                    for topic in cluster.topics:
                        check_name("topic", topic)
                except ValueError as e:
                    raise ConfigError(f"stream {stream.stream_id!r}: {e}") from None
                _require(
                    bool(cluster.bootstrap_servers),
                    f"stream {stream.stream_id!r} cluster {cluster_id!r}: bootstrap_servers is empty",
                )
                for problem in check_client_properties(cluster.properties):
                    raise ConfigError(
                        f"stream {stream.stream_id!r} cluster {cluster_id!r} properties: {problem}"
                    )

    def get_all_streams(self) -> tuple[KafkaStream, ...]:
        return self.streams

    def describe_streams(self, stream_ids: list[str]) -> dict[str, KafkaStream]:
        return {s.stream_id: s for s in self.streams if s.stream_id in stream_ids}

    def is_cluster_active(self, cluster_id: str) -> bool:
        return any(cluster_id in s.clusters for s in self.streams)


class KafkaSource(msgspec.Struct, frozen=True):
    """Where a sink pipeline reads: streams of a metadata service, and where new partitions
    start (``earliest``, ``latest`` or an explicit ``{"cluster/topic/partition": offset}``).
    Offsets committed in the table always win over ``starting_offsets``."""

    metadata: StaticMetadataService | FileMetadataService | SingleClusterMetadataService
    stream_ids: tuple[str, ...] | None = None
    stream_pattern: str | None = None
    starting_offsets: StartingOffsets | dict[str, int] = "earliest"
    readers_per_cluster: int = 1
    max_poll_records: int = 50_000
    properties: dict[str, str] = {}
    discovery_interval_s: float = 30.0
    discovery_failure_threshold: int = 5

    __repr__ = redacted_repr

    def __post_init__(self) -> None:
        _require(self.readers_per_cluster >= 1, "source.readers_per_cluster must be >= 1")
        _require(self.max_poll_records >= 1, "source.max_poll_records must be >= 1")
        for problem in check_client_properties(self.properties):
            raise ConfigError(f"source.properties: {problem}")
        _require(self.discovery_interval_s > 0, "source.discovery_interval_s must be > 0")
        _require(
            self.discovery_failure_threshold >= 1, "source.discovery_failure_threshold must be >= 1"
        )
        if self.stream_pattern is not None:
            try:
                re.compile(self.stream_pattern)
            except re.error as e:
                raise ConfigError(f"source.stream_pattern {self.stream_pattern!r}: {e}") from None
        if self.stream_ids is not None and isinstance(self.metadata, StaticMetadataService):
            # Dynamic services may gain a stream later; a static one never will.
            known = {s.stream_id for s in self.metadata.streams}
            missing = [s for s in self.stream_ids if s not in known]
            _require(not missing, f"source.stream_ids: unknown streams {missing}, known {sorted(known)}")
        if isinstance(self.starting_offsets, dict):
            for key, offset in self.starting_offsets.items():
                _require(key.count("/") == 2, f"source.starting_offsets: key {key!r} is not 'cluster/topic/partition'")
                _require(offset >= 0, f"source.starting_offsets[{key!r}] must be >= 0")

    def streams(self) -> tuple[KafkaStream, ...]:
        """The subscribed streams, as the metadata service has them now, with the
        source-wide ``properties`` under each cluster's own."""
        return with_default_properties(
            select_streams(self.metadata.get_all_streams(), self.stream_ids, self.stream_pattern),
            self.properties,
        )

    def clusters(self) -> dict[str, ClusterMetadata]:
        """Cluster id -> its metadata, with the topics of all subscribed streams merged."""
        try:
            return clusters_of(self.streams())
        except MetadataError as e:
            raise ConfigError(f"source.metadata: {e}") from None


class DeltaSink(msgspec.Struct, frozen=True, tag="delta"):
    """A Delta table on a local path; files are written by Spark, committed by delta-rs.

    ``vacuum_retention_hours`` must outlast the longest round: files of an open round are not
    in the table yet, and vacuum would delete them."""

    path: str
    vacuum_retention_hours: float = 24.0

    def __post_init__(self) -> None:
        _require(bool(self.path), "sink.path is empty")
        _require(self.vacuum_retention_hours > 0, "sink.vacuum_retention_hours must be > 0")


class CommitSettings(msgspec.Struct, frozen=True):
    """How rounds are paced (RFC-32) and when participants flush (KIP-89)."""

    commit_interval_s: float = 10.0
    write_timeout_s: float = 60.0
    flush_max_records: int = 200_000
    flush_max_bytes: int = 64 * 1024 * 1024
    flush_max_age_s: float = 30.0
    request_commit_after_flushes: int = 4
    #: end a round as soon as a partition with data in it has read all there is: the
    #: lowest latency (a table version per write, ~1 s apart), and a backlog's last round
    #: does not wait out the interval. Off: a version per commit_interval_s.
    commit_when_caught_up: bool = False

    def __post_init__(self) -> None:
        _require(self.commit_interval_s > 0, "commit_interval_s must be > 0")
        _require(self.write_timeout_s > 0, "write_timeout_s must be > 0")
        _require(self.flush_max_records > 0, "flush_max_records must be > 0")
        _require(self.flush_max_bytes > 0, "flush_max_bytes must be > 0")
        _require(self.flush_max_age_s > 0, "flush_max_age_s must be > 0")
        _require(self.request_commit_after_flushes >= 1, "request_commit_after_flushes must be >= 1")


class SparkSettings(msgspec.Struct, frozen=True):
    """The writer's Spark on Ray: one executor of 1 core / 1 GB suits a 2-core machine."""

    executors: int = 1
    executor_cores: int = 1
    executor_memory: str = "1GB"


class SinkPipelineConfig(msgspec.Struct, frozen=True):
    name: str
    source: KafkaSource
    sink: DeltaSink
    commit: CommitSettings = CommitSettings()
    spark: SparkSettings = SparkSettings()
    placement: Placement = Placement()

    __repr__ = redacted_repr

    def __post_init__(self) -> None:
        try:
            check_name("pipeline name", self.name)
        except ValueError as e:
            raise ConfigError(str(e)) from None
