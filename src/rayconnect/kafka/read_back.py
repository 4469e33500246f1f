"""Read a topic from the beginning to its high watermarks, as a consumer would see it.

One mechanism for two readers: the source pipelines' offsets store rebuilds what each
pipeline committed from its offsets topics (read_committed), and the source demo and the tests
check what a pipeline wrote (``read_committed`` shows only committed transactions,
``read_uncommitted`` everything written: the difference is what killed tasks left in aborted
transactions).

"The end" is the high watermark when the read starts. Under read_committed the read waits
while an open transaction holds the last stable offset back (it ends soon: tasks commit
continuously, and a dead task's is aborted when it is fenced); a transaction that is never
decided ends the read with a timeout naming the stuck positions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaTimeoutError

from rayconnect.kafka import compat
from rayconnect.kafka.admin import high_watermarks

__all__ = ["read_to_high_watermarks", "read_topic"]


async def read_to_high_watermarks(
    bootstrap: str,
    topic: str,
    isolation_level: str = "read_committed",
    timeout_s: float = 60.0,
    **client: Any,
) -> AsyncIterator[Any]:
    """Every record of ``topic`` the isolation level shows, per partition in offset order,
    up to the high watermarks; no consumer at all when the topic is empty."""
    marks = await high_watermarks(bootstrap, topic, **client)
    if not any(marks.values()):
        return
    consumer = compat.own(
        AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level=isolation_level,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=16 << 20,
            **client,
        )
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in marks]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while True:
            positions = {tp.partition: await consumer.position(tp) for tp in tps}
            if all(positions[p] >= hw for p, hw in marks.items()):
                return
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(
                    f"topic {topic!r}: {isolation_level} stuck at {positions} below the high "
                    f"watermarks {marks} for {timeout_s} s (a transaction never decided?)"
                )
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for record in records:
                    yield record
    finally:
        await consumer.stop()


async def read_topic(
    bootstrap: str,
    topic: str,
    isolation_level: str = "read_committed",
    headers: bool = False,
    timeout_s: float = 60.0,
) -> list[tuple[Any, ...]]:
    """(key, value[, headers]) of every record the isolation level shows."""
    return [
        (r.key, r.value, *([dict(r.headers)] if headers else []))
        async for r in read_to_high_watermarks(bootstrap, topic, isolation_level, timeout_s)
    ]
