"""Run aiokafka's own (hooked) code paths of a producer or consumer without a broker.

- :func:`in_sender`: a probe runs where a producer's sender does its work - in
  ``Sender.start`` and in the background task it starts;
- :func:`fetch`: a hand-built fetch response goes through ``Fetcher._proc_fetch_request`` of
  a consumer, as a broker's answer would.

Both call the methods as aiokafka looks them up (so through rayconnect's hooks, if any).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.consumer.fetcher import Fetcher

from rayconnect.kafka import aiokafka_hooks

T = TypeVar("T")


async def in_sender(producer: AIOKafkaProducer, probe: Callable[[Any], T]) -> list[T]:
    """``probe(sender)``, called where ``producer``'s sender does its work: in
    ``Sender.start`` (as the wait for a producer id) and then in the background task it
    starts (as that task's first step, after which the task ends). Returns both answers.
    ``producer`` is never connected, and is stopped at the end."""
    sender = producer._sender
    results: list[T] = []

    async def wait_for_pid() -> None:
        results.append(probe(sender))
        if len(results) == 2:
            raise asyncio.CancelledError  # the background task ends quietly on a cancellation

    sender._maybe_wait_for_pid = wait_for_pid
    try:
        await sender.start()
        await sender.sender_task
    finally:
        await producer.stop()
    return results


async def fetch(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    data: bytes,
    *,
    high_watermark: int,
    last_stable_offset: int,
    isolation_level: str = "read_committed",
    fetch_max_wait_ms: int = 50,
    original: bool = False,
) -> tuple[Any, Fetcher]:
    """The ``PartitionRecords`` a fetcher of ``consumer`` (not started) builds from ``data``
    fetched at offset 0 with an empty aborted-transactions list (what tansu sends), or None
    if it built none; and the fetcher. Stops ``consumer`` (never started) at the end.
    ``original``: through aiokafka's own ``_proc_fetch_request``, whatever is hooked."""
    client = consumer._client
    fetcher = Fetcher(
        client,
        consumer._subscription,
        key_deserializer=consumer._key_deserializer,
        value_deserializer=consumer._value_deserializer,
        isolation_level=isolation_level,
        fetch_max_wait_ms=fetch_max_wait_ms,
        check_crcs=False,  # the hand-built batches carry no CRC
    )
    await fetcher.close()  # its background routine is not needed: the response is ours
    consumer._subscription.assign_from_user({tp})
    assignment = consumer._subscription.subscription.assignment
    assignment.state_value(tp).seek(0)

    # FetchResponse v4: (partition, error, high watermark, last stable offset, aborted, data)
    response = SimpleNamespace(
        API_VERSION=4,
        topics=[(tp.topic, [(tp.partition, 0, high_watermark, last_stable_offset, [], data)])],
    )

    async def send(node_id: Any, request: Any) -> Any:
        return response

    client.send = send
    request = SimpleNamespace(topics=[(tp.topic, [(tp.partition, 0, 1 << 20)])])
    if original:
        await aiokafka_hooks.ORIGINAL_PROC_FETCH_REQUEST(fetcher, assignment, 0, request)
    else:
        await fetcher._proc_fetch_request(assignment, 0, request)
    await consumer.stop()
    result = fetcher._records.get(tp)
    return (None if result is None else result._partition_records), fetcher
