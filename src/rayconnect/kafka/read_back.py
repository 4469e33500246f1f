"""Read a whole topic back, as a consumer would see it, to check what a pipeline wrote.

Used by the source demo's exactly-once check and by the tests: ``read_committed`` shows
only committed transactions, ``read_uncommitted`` everything written (the difference is what
killed tasks left in aborted transactions).
"""

from __future__ import annotations

import time
from typing import Any

from rayconnect.kafka.admin import high_watermarks

__all__ = ["read_topic"]


async def read_topic(
    bootstrap: str,
    topic: str,
    isolation_level: str = "read_committed",
    headers: bool = False,
    timeout_s: float = 60.0,
) -> list[tuple[Any, ...]]:
    """(key, value[, headers]) of every record the isolation level shows, per partition in
    offset order, up to the high watermark (so every transaction must be decided)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    marks = await high_watermarks(bootstrap, topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=16 << 20,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in marks]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + timeout_s
        while not all([await consumer.position(tp) >= marks[tp.partition] for tp in tps]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{isolation_level} never reached the high watermark of {topic}")
            for records in (await consumer.getmany(timeout_ms=100)).values():
                out += [(r.key, r.value, *([dict(r.headers)] if headers else [])) for r in records]
        return out
    finally:
        await consumer.stop()
