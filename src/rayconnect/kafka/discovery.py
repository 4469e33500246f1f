"""What a cluster holds now: the partitions of the subscribed topics, and where they begin.

Used before any actor starts (a missing topic or an unreachable broker is a configuration
error reported up front) and by the coordinator to resolve ``starting_offsets`` for
partitions the table has no offset for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rayconnect.errors import DiscoveryError
from rayconnect.kafka import compat
from rayconnect.properties import (
    INT_PROPERTIES,
    SSL_CHECK_HOSTNAME,
    SSL_FILES,
)
from rayconnect.protocol.types import ClusterMetadata, TopicPartition


def client_properties(properties: dict[str, str]) -> dict[str, Any]:
    """Kafka client properties (Java-style dotted names) -> aiokafka keyword arguments.

    SASL settings pass through unchanged (``sasl.plain.password`` -> ``sasl_plain_password``);
    ``ssl.cafile``/``ssl.certfile``/``ssl.keyfile``/``ssl.password``/``ssl.check.hostname``
    become one ``ssl_context``; millisecond settings become ints.
    """
    kwargs: dict[str, Any] = {}
    ssl_args: dict[str, str] = {}
    check_hostname: bool | None = None
    for key, value in properties.items():
        name = key.replace(".", "_")
        if name in SSL_FILES:
            ssl_args[SSL_FILES[name]] = value
        elif name == SSL_CHECK_HOSTNAME:
            check_hostname = str(value).lower() == "true"
        elif name in INT_PROPERTIES and str(value).strip().isdigit():
            kwargs[name] = int(value)
        else:
            kwargs[name] = value
    if ssl_args or check_hostname is not None:
        from aiokafka.helpers import create_ssl_context

        context = create_ssl_context(**ssl_args)
        if check_hostname is not None:
            context.check_hostname = check_hostname
        kwargs["ssl_context"] = context
    return kwargs


async def discover_partitions(
    cluster_id: str, cluster: ClusterMetadata, *, timeout_s: float = 15.0
) -> list[TopicPartition]:
    """Every partition of the cluster's subscribed topics; raises if a topic is missing."""
    from aiokafka import AIOKafkaConsumer

    consumer = compat.own(
        AIOKafkaConsumer(
            bootstrap_servers=cluster.bootstrap_servers,
            request_timeout_ms=int(timeout_s * 1000),
            **client_properties(cluster.properties),
        )
    )
    try:
        await consumer.start()
    except Exception as e:
        raise DiscoveryError(
            f"cluster {cluster_id!r} at {cluster.bootstrap_servers}: cannot connect ({e})"
        ) from e
    try:
        found: list[TopicPartition] = []
        available = await consumer.topics()
        missing = [t for t in cluster.topics if t not in available]
        if missing:
            raise DiscoveryError(
                f"cluster {cluster_id!r} at {cluster.bootstrap_servers}: topics {missing} do "
                f"not exist (it has {sorted(available)})"
            )
        for topic in cluster.topics:
            for p in sorted(consumer.partitions_for_topic(topic) or ()):
                found.append(TopicPartition(cluster_id, topic, p))
        return found
    finally:
        await consumer.stop()


async def beginning_offsets(
    cluster: ClusterMetadata, partitions: Iterable[TopicPartition]
) -> dict[str, int]:
    """Earliest offsets (ListOffsets earliest works on every broker, tansu included)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as KafkaTP

    tps = {KafkaTP(p.topic, p.partition): p.key for p in partitions}
    if not tps:
        return {}
    consumer = compat.own(
        AIOKafkaConsumer(
            bootstrap_servers=cluster.bootstrap_servers, **client_properties(cluster.properties)
        )
    )
    await consumer.start()
    try:
        offsets = await consumer.beginning_offsets(list(tps))
        return {tps[tp]: off for tp, off in offsets.items()}
    finally:
        await consumer.stop()


async def high_watermarks(
    cluster: ClusterMetadata, partitions: Iterable[TopicPartition]
) -> dict[str, int]:
    """High watermarks from Fetch responses (ListOffsets latest is wrong on tansu)."""
    from rayconnect.kafka.admin import high_watermarks as topic_high_watermarks

    wanted = list(partitions)
    result: dict[str, int] = {}
    for topic in sorted({p.topic for p in wanted}):
        marks = await topic_high_watermarks(
            cluster.bootstrap_servers, topic, **client_properties(cluster.properties)
        )
        for p in wanted:
            if p.topic == topic:
                result[p.key] = marks[p.partition]
    return result
