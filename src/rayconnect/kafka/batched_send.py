"""A transaction's records sent as whole record batches, not one ``producer.send`` each.

Why: aiokafka's ``send`` costs ~36 us a record on this machine (a metadata wait, the
partition list rebuilt per call, a pure-Python murmur2, a future per record resolved one
by one): a source task that polls thousands of small records spends most of its time
there. Here the records of a segment are partitioned all at once (murmur2 vectorised with
numpy, the same hash as aiokafka's ``DefaultPartitioner`` and Java's), appended to one
``BatchBuilder`` per topic-partition in order, and each full batch is handed to
``send_batch`` - which adds the partition to the open transaction exactly as ``send`` does.
Record order per partition is kept: batches of one partition go out in the order filled.

Keyless records without a partition all go to one partition per call (chosen at random
among the available ones, like Kafka's sticky partitioner), not one at random each. A
record for ``every_partition`` is appended to a batch of each partition the topic has
(per the producer's metadata, as it is sent): a copy in each, in the same transaction.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

_SEED = 0x9747B28C
_M = np.uint32(0x5BD1E995)

Headers = Sequence[tuple[str, bytes | None]]


class Outgoing(msgspec.Struct, frozen=True, array_like=True):
    """One record ready for a batch: bytes, and its partition if the task chose one (or
    ``every_partition``: a copy for each)."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: Headers | None = None
    every_partition: bool = False


class SentBatch(msgspec.Struct, frozen=True):
    """One batch sent: its future (resolves to the batch's RecordMetadata, whose offset is
    the batch's first record's) and which of the records given it holds, in batch order."""

    future: asyncio.Future[Any]
    members: list[int]


def check_size(producer: Any, key: bytes | None, value: bytes | None, headers: Any) -> None:
    """aiokafka's own per-record limit (``max_request_size``): MessageSizeTooLargeError."""
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers or [])
    if size > producer._max_request_size:
        raise MessageSizeTooLargeError(
            f"The message is {size} bytes when serialized which is larger than the maximum "
            "request size you have configured with the max_request_size configuration"
        )


def murmur2(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of every key (uint32), keys of one length at a time in numpy."""
    out = np.empty(len(keys), np.uint32)
    by_length: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_length.setdefault(len(key), []).append(i)
    for length, where in by_length.items():
        data = np.frombuffer(b"".join([keys[i] for i in where]), np.uint8)
        data = data.reshape(len(where), length)
        h = np.full(len(where), (_SEED ^ length) & 0xFFFFFFFF, np.uint32)
        words = length // 4
        if words:
            blocks = np.ascontiguousarray(data[:, : words * 4]).view("<u4")
            for j in range(words):
                k = blocks[:, j] * _M
                k ^= k >> np.uint32(24)
                k *= _M
                h *= _M
                h ^= k
        tail, extra = words * 4, length % 4
        if extra >= 3:
            h ^= data[:, tail + 2].astype(np.uint32) << np.uint32(16)
        if extra >= 2:
            h ^= data[:, tail + 1].astype(np.uint32) << np.uint32(8)
        if extra >= 1:
            h ^= data[:, tail].astype(np.uint32)
            h *= _M
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
        out[where] = h
    return out


async def send_batched(producer: Any, records: Sequence[Outgoing]) -> list[SentBatch]:
    """Send ``records`` (already size-checked) in batches, in the order the batches were
    filled. A partition the topic does not have is an error (as ``send`` asserts).

    Records are first grouped by topic-partition (a record's copies in each of its
    partitions), in order, then each group is appended to its batches in one tight loop."""
    metadata = producer._metadata
    partitions: dict[str, list[int]] = {}
    for topic in {r.topic for r in records}:
        await producer.client._wait_on_metadata(topic)
        partitions[topic] = sorted(metadata.partitions_for_topic(topic))
    keyed = [
        r.key
        for r in records
        if r.partition is None and r.key is not None and not r.every_partition
    ]
    hashes = iter((murmur2(keyed) & np.uint32(0x7FFFFFFF)).tolist()) if keyed else iter(())
    sticky: dict[str, int] = {}
    groups: dict[tuple[str, int], list[int]] = {}  # members of each partition, in order
    for i, r in enumerate(records):
        topic = r.topic
        of_topic = partitions[topic]
        if r.every_partition:
            for partition in of_topic:
                groups.setdefault((topic, partition), []).append(i)
            continue
        if r.partition is not None:
            if r.partition not in of_topic:
                raise ValueError(f"topic {r.topic!r} has no partition {r.partition}")
            partition = r.partition
        elif r.key is not None:
            partition = of_topic[next(hashes) % len(of_topic)]
        else:
            if topic not in sticky:
                available = list(metadata.available_partitions_for_topic(topic))
                sticky[topic] = random.choice(available or of_topic)
            partition = sticky[topic]
        members = groups.get((topic, partition))
        if members is None:
            members = groups[(topic, partition)] = []
        members.append(i)
    sent: list[SentBatch] = []
    for (topic, partition), members in groups.items():
        builder, start = producer.create_batch(), 0
        for j, i in enumerate(members):
            r = records[i]
            key, value, headers = r.key, r.value, r.headers or []
            if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:
                builder.close()  # full: out at once (no linger); a new one takes the record
                future = await producer.send_batch(builder, topic, partition=partition)
                sent.append(SentBatch(future, members[start:j]))
                builder, start = producer.create_batch(), j
                builder.append(timestamp=None, key=key, value=value, headers=headers)
        builder.close()
        future = await producer.send_batch(builder, topic, partition=partition)
        sent.append(SentBatch(future, members[start:]))
    return sent


async def send_page(
    producer: Any,
    topic: str,
    keys: Sequence[bytes | None],
    values: Sequence[bytes],
    headers: list[tuple[str, bytes | None]],
) -> list[SentBatch]:
    """``send_batched`` for a page of one topic's records sharing ``headers``: keyed ones
    partitioned by their keys (the same murmur2), keyless ones (None keys: all of them)
    to partition 0 - without a record object each, a partition at a time."""
    await producer.client._wait_on_metadata(topic)
    of_topic = sorted(producer._metadata.partitions_for_topic(topic))
    if not keys:
        return []
    if keys[0] is None:
        by_partition = {0: list(range(len(values)))}
    else:
        chosen = (murmur2(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(len(of_topic))  # type: ignore[arg-type]
        by_partition = {
            of_topic[p]: np.flatnonzero(chosen == p).tolist() for p in range(len(of_topic))
        }
    sent: list[SentBatch] = []
    for partition, members in by_partition.items():
        builder, start = producer.create_batch(), 0
        for j, i in enumerate(members):
            key, value = keys[i], values[i]
            if builder.append(timestamp=None, key=key, value=value, headers=headers) is None:
                builder.close()
                future = await producer.send_batch(builder, topic, partition=partition)
                sent.append(SentBatch(future, members[start:j]))
                builder, start = producer.create_batch(), j
                builder.append(timestamp=None, key=key, value=value, headers=headers)
        if start < len(members):
            builder.close()
            future = await producer.send_batch(builder, topic, partition=partition)
            sent.append(SentBatch(future, members[start:]))
    return sent
