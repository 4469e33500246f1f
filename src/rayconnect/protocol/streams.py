"""Stream subscription and cluster merging (FLIP-246's KafkaStreamSubscriber), pure.

Why here and not in ``rayconnect.metadata``: the enumerator state machine needs both
functions and must stay pure (tests/unit/test_protocol_purity.py); ``rayconnect.metadata``
does IO. ``rayconnect.metadata.base`` re-exports them as the public names.

Clusters are named by id, not by address (FLIP-246): two streams may read topics of the same
cluster, and the reader of that cluster must read the union of their topics with one client.
So one cluster id must mean one address and one set of client properties everywhere;
anything else is ambiguous and rejected rather than resolved by "last one wins".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import msgspec

from rayconnect.errors import RayconnectError
from rayconnect.protocol.types import ClusterMetadata, KafkaStream


class MetadataError(RayconnectError, ValueError):
    """Stream metadata is invalid or inconsistent; the message names what and where."""


def select_streams(
    streams: Iterable[KafkaStream],
    stream_ids: Iterable[str] | None = None,
    stream_pattern: str | re.Pattern[str] | None = None,
) -> tuple[KafkaStream, ...]:
    """The subscribed streams, in the service's order.

    ``stream_ids`` and ``stream_pattern`` (a regex that must match the WHOLE stream id, so
    ``orders`` does not also subscribe ``orders-archive``) may be combined: a stream is kept
    if either selects it. Neither given: every stream. A subscribed id the service does not
    list is simply absent: metadata changes at run time and a stream may appear later.
    """
    if stream_ids is None and stream_pattern is None:
        return tuple(streams)
    ids = frozenset(stream_ids or ())
    pattern = re.compile(stream_pattern) if isinstance(stream_pattern, str) else stream_pattern
    return tuple(
        s
        for s in streams
        if s.stream_id in ids or (pattern is not None and pattern.fullmatch(s.stream_id))
    )


def clusters_of(streams: Iterable[KafkaStream]) -> dict[str, ClusterMetadata]:
    """Cluster id -> one ClusterMetadata with the topics of every stream on that cluster.

    Topics keep their first-seen order without duplicates. Properties are merged; the same
    property with two different values, or two bootstrap addresses for one cluster id, raise
    ``MetadataError`` naming both streams.
    """
    merged: dict[str, ClusterMetadata] = {}
    origin: dict[str, str] = {}  # cluster id -> the stream that first named it
    for stream in streams:
        for cluster_id, meta in stream.clusters.items():
            prev = merged.get(cluster_id)
            if prev is None:
                merged[cluster_id] = meta
                origin[cluster_id] = stream.stream_id
                continue
            where = (
                f"cluster {cluster_id!r} (streams {origin[cluster_id]!r} and {stream.stream_id!r})"
            )
            if prev.bootstrap_servers != meta.bootstrap_servers:
                raise MetadataError(
                    f"{where} has two bootstrap addresses: "
                    f"{prev.bootstrap_servers!r} and {meta.bootstrap_servers!r}"
                )
            clashing = sorted(
                k
                for k in prev.properties.keys() & meta.properties.keys()
                if prev.properties[k] != meta.properties[k]
            )
            if clashing:  # values may be secrets: name the keys only
                raise MetadataError(f"{where} set different values for properties {clashing}")
            merged[cluster_id] = ClusterMetadata(
                prev.bootstrap_servers,
                tuple(dict.fromkeys(prev.topics + meta.topics)),
                {**prev.properties, **meta.properties},
            )
    return merged


def with_default_properties(
    streams: Iterable[KafkaStream], defaults: Mapping[str, str]
) -> tuple[KafkaStream, ...]:
    """``streams`` with ``defaults`` (the source-wide Kafka client properties) under each
    cluster's own properties: a cluster's setting wins over the source's."""
    if not defaults:
        return tuple(streams)
    return tuple(
        KafkaStream(
            s.stream_id,
            {
                cid: msgspec.structs.replace(c, properties={**defaults, **c.properties})
                for cid, c in s.clusters.items()
            },
        )
        for s in streams
    )
