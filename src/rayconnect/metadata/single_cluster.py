"""``SingleClusterMetadataService``: every topic of one cluster is a stream of its own.

The easy path from "I have a Kafka cluster" to a pipeline that follows topics as they are
created and deleted: stream id = topic name, so ``stream_pattern`` selects topics. Internal
topics (names starting with ``_``, which covers ``__consumer_offsets`` and
``__transaction_state``) are never streams.

Why the getters are synchronous and answer from the last ``refresh()``: listing topics is
network IO (aiokafka, async) while the KafkaMetadataService getters are synchronous. The
enumerator actor calls ``await refresh()`` every ``discovery_interval_s`` (``poll_service``
does) and the getters return that view; before the first successful refresh they raise, so
an empty view is never mistaken for "every topic was deleted". A failed refresh raises and
keeps the previous view.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import msgspec

from rayconnect.kafka.discovery import client_properties
from rayconnect.metadata.base import StreamLookups
from rayconnect.properties import check_client_properties
from rayconnect.protocol.streams import MetadataError
from rayconnect.protocol.types import ClusterMetadata, KafkaStream, check_name
from rayconnect.redact import redacted_repr

__all__ = ["SingleClusterMetadataService", "streams_of_topics"]


def _is_stream_topic(topic: str, pattern: re.Pattern[str] | None) -> bool:
    if topic.startswith("_"):
        return False
    try:
        check_name("topic", topic)
    except ValueError:
        return False  # not a name a split key can hold; Kafka itself would not allow it
    return pattern is None or pattern.fullmatch(topic) is not None


def streams_of_topics(
    topics: list[str] | set[str],
    cluster_id: str,
    cluster: ClusterMetadata,
    topic_pattern: str | None = None,
) -> tuple[KafkaStream, ...]:
    """One stream per eligible topic, sorted by name (pure; the part tests can drive)."""
    pattern = re.compile(topic_pattern) if topic_pattern is not None else None
    return tuple(
        KafkaStream(
            topic,
            {cluster_id: ClusterMetadata(cluster.bootstrap_servers, (topic,), cluster.properties)},
        )
        for topic in sorted(t for t in topics if _is_stream_topic(t, pattern))
    )


@dataclass
class _View:
    """The cluster's streams as last listed, and when (None: not listed yet)."""

    streams: tuple[KafkaStream, ...] | None = None
    refreshed_at: float | None = None


class SingleClusterMetadataService(msgspec.Struct, StreamLookups, tag="single_cluster", dict=True):
    """Each non-internal topic of the cluster at ``bootstrap_servers`` is a stream.

    ``topic_pattern``: a regex the whole topic name must match to be a stream.
    ``properties``: Kafka client properties (security...) for listing AND for reading.
    """

    bootstrap_servers: str
    cluster_id: str = "default"
    properties: dict[str, str] = {}
    topic_pattern: str | None = None
    timeout_s: float = 15.0

    __repr__ = redacted_repr  # properties may hold credentials

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise MetadataError("SingleClusterMetadataService.bootstrap_servers is empty")
        try:
            check_name("cluster id", self.cluster_id)
        except ValueError as e:
            raise MetadataError(str(e)) from None
        for problem in check_client_properties(self.properties):
            raise MetadataError(f"SingleClusterMetadataService.properties: {problem}")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as e:
                raise MetadataError(f"topic_pattern {self.topic_pattern!r}: {e}") from None

    # Last refreshed view, in the instance __dict__: not a field, neither encoded nor pickled.
    def _view(self) -> _View:
        view: _View | None = self.__dict__.get("_state")
        if view is None:
            view = self.__dict__["_state"] = _View()
        return view

    @property
    def refreshed_at(self) -> float | None:
        """Wall-clock time of the last successful refresh (None: never)."""
        return self._view().refreshed_at

    async def refresh(self) -> tuple[KafkaStream, ...]:
        """List the cluster's topics now (metadata API); raises if the broker cannot be
        reached, keeping the previous view."""
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers,
            request_timeout_ms=int(self.timeout_s * 1000),
            **client_properties(self.properties),
        )
        try:  # close() also after a failed start(): it frees the half-built client
            await admin.start()
            topics = await admin.list_topics()
        finally:
            await admin.close()
        cluster = ClusterMetadata(self.bootstrap_servers, (), dict(self.properties))
        streams = streams_of_topics(topics, self.cluster_id, cluster, self.topic_pattern)
        view = self._view()
        view.streams, view.refreshed_at = streams, time.time()
        return streams

    def _streams(self) -> tuple[KafkaStream, ...]:
        streams = self._view().streams
        if streams is None:
            raise MetadataError(
                f"cluster {self.cluster_id!r} at {self.bootstrap_servers}: topics not listed "
                "yet (await refresh() first)"
            )
        return streams

    def get_all_streams(self) -> tuple[KafkaStream, ...]:
        return self._streams()

    def is_cluster_active(self, cluster_id: str) -> bool:
        return cluster_id == self.cluster_id and bool(self._view().streams)
