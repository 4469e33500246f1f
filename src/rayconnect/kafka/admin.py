"""Small async Kafka helpers for the demo and the tests: topics, end offsets, demo data.

``high_watermarks`` reads the high watermark a Fetch response carries instead of asking
ListOffsets(latest): tansu answers ListOffsets latest with "start of last batch + 1"
when a batch holds more than one record (shared/notes/tansu.md), while the fetch high
watermark is right on tansu and on Kafka alike.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaTimeoutError, TopicAlreadyExistsError, for_code

from rayconnect.kafka import compat

__all__ = [
    "create_topic",
    "high_watermarks",
    "produce_demo_records",
    "demo_value",
    "demo_value_wide",
]

ProgressCallback = Callable[[int], None]
"""Called as ``progress(acknowledged_so_far)`` after each window of acknowledged sends."""

_ACK_WINDOW = 10_000


async def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    exist_ok: bool = False,
    timeout: float = 10.0,
    topic_configs: dict[str, str] | None = None,
    **client_kwargs: Any,
) -> None:
    """Create ``name`` with its final partition count and wait until metadata shows it.

    Final count, because tansu does not support CreatePartitions. Waiting for metadata
    means a producer started right after will not race the topic's creation.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs)
    await admin.start()
    try:
        if exist_ok and name in await admin.list_topics():
            return
        resp = await admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    topic_configs=topic_configs or {},
                )
            ]
        )
        for topic, code, *_ in resp.topic_errors:
            err = for_code(code)
            if code == 0 or (exist_ok and err is TopicAlreadyExistsError):
                continue
            raise err(f"create_topic({topic!r}, {partitions}) failed")
        deadline = time.monotonic() + timeout
        while name not in await admin.list_topics():
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"topic {name!r} not visible in metadata")
            await asyncio.sleep(0.02)
    finally:
        await admin.close()


async def high_watermarks(
    bootstrap: str, topic: str, timeout: float = 10.0, **client_kwargs: Any
) -> dict[int, int]:
    """``{partition: high watermark}`` of every partition of ``topic``, from Fetch responses.

    We seek each partition to one below what ListOffsets(latest) says (right on Kafka,
    inside the last batch on tansu) so the fetch that brings the high watermark carries at
    most one batch of data. ``timeout`` covers both requests: tansu's S3 engine answers
    ListOffsets by listing every stored batch of the partition (12-13 s for 16 partitions of
    5,000 batches each, measured right after a restart), and a timeout says which one it was.
    """
    consumer = compat.own(
        AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            isolation_level="read_uncommitted",
            fetch_max_wait_ms=10,
            max_partition_fetch_bytes=1 << 20,
            **client_kwargs,
        )
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        parts = consumer.partitions_for_topic(topic)
        while not parts:
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"topic {topic!r} not found")
            await asyncio.sleep(0.02)
            await consumer.topics()  # refreshes cluster metadata
            parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        try:  # inside the deadline: on tansu's S3 engine it lists every object of the log
            approx_end = await asyncio.wait_for(
                consumer.end_offsets(tps), max(0.1, deadline - time.monotonic())
            )
        except TimeoutError:
            raise KafkaTimeoutError(f"no ListOffsets answer for {topic} in {timeout} s") from None
        for tp in tps:
            consumer.seek(tp, max(0, approx_end[tp] - 1))
        result: dict[int, int] = {}
        while len(result) < len(tps):
            if time.monotonic() > deadline:
                missing = [tp.partition for tp in tps if tp.partition not in result]
                raise KafkaTimeoutError(f"no fetch response for {topic} partitions {missing}")
            await consumer.getmany(*tps, timeout_ms=50)
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None:
                    result[tp.partition] = hw
        return result
    finally:
        await consumer.stop()


def demo_value(i: int, key: str) -> bytes:
    """A ~200-byte JSON record (the size the throughput notes were measured with)."""
    head = {"id": i, "key": key, "ts": time.time_ns() // 1_000_000, "amount": (i * 37) % 10_000}
    base = json.dumps({**head, "payload": ""}, separators=(",", ":"))
    pad = max(0, 200 - len(base))
    return json.dumps({**head, "payload": "x" * pad}, separators=(",", ":")).encode()


def demo_value_wide(i: int, key: str) -> bytes:
    """A ~230-byte JSON record of 10 fields (the typed-table benchmark's: ints, strings, a
    float, a boolean, an ISO timestamp)."""
    record = {
        "id": i,
        "key": key,
        "ts": time.time_ns() // 1_000_000,
        "amount": (i * 37) % 10_000,
        "price": round((i % 997) * 1.25, 2),
        "currency": ("EUR", "USD", "GBP")[i % 3],
        "country": ("DE", "FR", "US", "GB", "JP")[i % 5],
        "paid": i % 2 == 0,
        "created": "2026-11-23T10:00:00Z",
    }
    base = json.dumps({**record, "note": ""}, separators=(",", ":"))
    return json.dumps(
        {**record, "note": "n" * max(0, 230 - len(base))}, separators=(",", ":")
    ).encode()


async def produce_demo_records(
    bootstrap: str,
    topic: str,
    n: int,
    partitions: int | Sequence[int] | None = None,
    *,
    progress: ProgressCallback | None = None,
    start_index: int = 0,
    value: Callable[[int, str], bytes] = demo_value,
) -> dict[int, int]:
    """Produce ``n`` demo records, keys ``key-<i>``, round-robin over ``partitions``
    (values made by ``value``, ``demo_value`` by default).

    Returns ``{partition: records written}``. ``partitions`` is a count (the first N
    partitions), a list of partition numbers, or None for all of the topic's partitions. Tuned for throughput (linger 5 ms, 64 KB batches: ~82k rec/s on tansu);
    acknowledgements are awaited in windows of 10k so memory stays flat for large ``n``.
    ``start_index`` lets a caller append more records with fresh keys later.
    """
    producer = compat.own(
        AIOKafkaProducer(
            bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=64 * 1024, acks="all"
        )
    )
    await producer.start()
    try:
        if partitions is None:
            partitions = len(await producer.partitions_for(topic))
        targets = list(range(partitions)) if isinstance(partitions, int) else list(partitions)
        if not targets:
            raise ValueError("partitions must be positive")
        counts = dict.fromkeys(targets, 0)
        pending: list[asyncio.Future[object]] = []
        for j in range(n):
            i = start_index + j
            key = f"key-{i}"
            part = targets[i % len(targets)]
            fut = await producer.send(topic, value(i, key), key=key.encode(), partition=part)
            pending.append(fut)
            counts[part] += 1
            if len(pending) >= _ACK_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
                if progress is not None:
                    progress(j + 1)
        if pending:
            await asyncio.gather(*pending)
        if progress is not None:
            progress(n)
        return counts
    finally:
        await producer.stop()
