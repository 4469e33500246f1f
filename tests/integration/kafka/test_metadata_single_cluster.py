"""SingleClusterMetadataService against the embedded broker, and one enumerator cycle driven
with real discovery (no Ray): topics created while running show up as streams and splits."""

from __future__ import annotations

import pytest

from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.discovery import discover_partitions
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.metadata import SingleClusterMetadataService, poll_service
from rayconnect.protocol.enumerator import Enumerator, EnumeratorConfig
from rayconnect.protocol.enumerator_effects import DiscoverPartitions, StartReaders

pytestmark = [pytest.mark.timeout(60)]


async def test_topics_become_streams_and_new_topics_are_picked_up(
    kafka_broker: EmbeddedBroker,
) -> None:
    bs = kafka_broker.bootstrap_servers
    await create_topic(bs, "orders", 2)
    service = SingleClusterMetadataService(bs, cluster_id="local")
    streams = await service.refresh()
    assert [s.stream_id for s in streams] == ["orders"]
    assert streams[0].clusters["local"].topics == ("orders",)
    assert service.is_cluster_active("local") and service.refreshed_at is not None

    await create_topic(bs, "payments", 1)
    await create_topic(bs, "_internal", 1)
    streams, error = await poll_service(service)
    assert error is None and streams is not None
    assert [s.stream_id for s in streams] == ["orders", "payments"]
    assert set(service.describe_streams(["payments", "ghost"])) == {"payments"}

    only = SingleClusterMetadataService(bs, cluster_id="local", topic_pattern="pay.*")
    assert [s.stream_id for s in await only.refresh()] == ["payments"]


async def test_enumerator_cycle_with_real_discovery(kafka_broker: EmbeddedBroker) -> None:
    bs = kafka_broker.bootstrap_servers
    await create_topic(bs, "orders", 3)
    service = SingleClusterMetadataService(bs, cluster_id="local")
    enum = Enumerator(EnumeratorConfig(readers_per_cluster=2))
    enum.tick(0.0)
    ready = enum.metadata_polled(*(await poll_service(service)), 0.0)
    [discover] = [e for e in ready if isinstance(e, DiscoverPartitions)]
    parts = await discover_partitions(discover.cluster_id, discover.cluster)
    ready = enum.partitions_discovered("local", parts, 1.0, discover.request_id)
    [start] = [e for e in ready if isinstance(e, StartReaders)]
    assert start.assignment == {
        "local/0": ("local/orders/0", "local/orders/2"),
        "local/1": ("local/orders/1",),
    }


async def test_unreachable_broker_is_a_failed_poll_that_keeps_the_view(
    kafka_broker: EmbeddedBroker,
) -> None:
    await create_topic(kafka_broker.bootstrap_servers, "orders", 1)
    service = SingleClusterMetadataService(kafka_broker.bootstrap_servers, timeout_s=2.0)
    await service.refresh()
    kafka_broker.stop()
    streams, error = await poll_service(service)
    assert streams is None and error
    assert [s.stream_id for s in service.get_all_streams()] == ["orders"]  # last view kept
