"""The KafkaMetadataService interface (FLIP-246) and how an actor polls any implementation.

A metadata service is the source of truth for which clusters and topics a pipeline reads:
a stream it stops listing is gone, and its partitions retire. Implementations here:
``StaticMetadataService`` (static.py, fixed streams), ``FileMetadataService``
(YAML/JSON file, edits picked up while running) and ``SingleClusterMetadataService`` (each
topic of one cluster is a stream). The enumerator only ever sees the streams, through
``poll_service``, so any object with these three methods works (duck-typed ``Protocol``).

``select_streams`` and ``clusters_of`` live in ``rayconnect.protocol.streams`` because the
pure enumerator needs them; they are re-exported here as the public names.
``KafkaSource.clusters()`` calls ``clusters_of`` rather than merging by itself.
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

from rayconnect.protocol.streams import MetadataError, clusters_of, select_streams
from rayconnect.protocol.types import KafkaStream

__all__ = [
    "KafkaMetadataService",
    "StreamLookups",
    "MetadataError",
    "clusters_of",
    "poll_service",
    "select_streams",
]


@runtime_checkable
class KafkaMetadataService(Protocol):
    """Where the streams of a pipeline come from. Getters are synchronous and cheap: a
    service that must do network IO refreshes in an ``async refresh()`` and answers the
    getters from its last refreshed view (see ``poll_service``)."""

    def get_all_streams(self) -> tuple[KafkaStream, ...]:
        """Every stream the service knows now."""
        ...

    def describe_streams(self, stream_ids: list[str]) -> dict[str, KafkaStream]:
        """The listed streams that exist now, by id (absent ids are left out)."""
        ...

    def is_cluster_active(self, cluster_id: str) -> bool:
        """True if some stream still reads from ``cluster_id``."""
        ...


class StreamLookups:
    """The lookups every service answers the same way from ``get_all_streams``: a mixin, so
    a service writes only how it gets its streams."""

    __slots__ = ()

    def get_all_streams(self) -> tuple[KafkaStream, ...]:
        raise NotImplementedError

    def describe_streams(self, stream_ids: list[str]) -> dict[str, KafkaStream]:
        wanted = set(stream_ids)
        return {s.stream_id: s for s in self.get_all_streams() if s.stream_id in wanted}

    def is_cluster_active(self, cluster_id: str) -> bool:
        return any(cluster_id in s.clusters for s in self.get_all_streams())


async def poll_service(
    service: KafkaMetadataService,
) -> tuple[tuple[KafkaStream, ...] | None, str | None]:
    """One poll, shaped as the arguments of ``Enumerator.metadata_polled(streams, error)``.

    - ``(streams, None)``: fresh metadata.
    - ``(streams, warning)``: the service answered with its last good metadata but its
      source is broken (a malformed file edit): read on, show the warning.
    - ``(None, error)``: the service failed; the enumerator counts it toward
      ``discovery_failure_threshold``.

    A service with a ``refresh()`` (sync or async) is refreshed first. Never raises for a
    service failure: the enumerator, not the actor, decides when failures are fatal.
    """
    try:
        refresh = getattr(service, "refresh", None)
        if refresh is not None:
            result = refresh()
            if inspect.isawaitable(result):
                await result
        streams = tuple(service.get_all_streams())
    except Exception as e:  # any service failure is data for the enumerator
        return None, f"{type(e).__name__}: {e}"
    return streams, getattr(service, "last_error", None)
