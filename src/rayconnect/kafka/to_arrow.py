"""Kafka records -> Arrow record batches in the raw record schema.

Records leave the reader as Arrow batches (through Ray's object store), never one Python
object or one Ray call per record, so this is the one place of the read path that touches
each record in Python. It builds each column with one list comprehension and lets Arrow
convert; headers, rarely present, are only walked when a record has any. The reader's own
path decodes whole fetches without record objects (``kafka.arrow_fetch``) and only assembles
its columns here (``columns_to_batch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from rayconnect.kafka.record_batches import RecordColumns, headers_column
from rayconnect.schema import RAW_RECORD_SCHEMA

_HEADERS_TYPE = RAW_RECORD_SCHEMA.field("headers").type


def records_to_batch(cluster: str, records: Sequence[Any]) -> pa.RecordBatch:
    """Convert aiokafka ``ConsumerRecord``s (all of one cluster) into one RecordBatch."""
    n = len(records)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=RAW_RECORD_SCHEMA)
    topics = [r.topic for r in records]
    if topics[0] == topics[-1] and topics.count(topics[0]) == n:
        topic_col = _constant(topics[0], n)
    else:
        topic_col = pa.array(topics, pa.string())
    headers = [r.headers for r in records]
    return _batch(
        cluster,
        topic_col,
        pa.array(np.fromiter((r.partition for r in records), dtype=np.int32, count=n)),
        np.fromiter((r.offset for r in records), dtype=np.int64, count=n),
        np.fromiter((r.timestamp for r in records), dtype=np.int64, count=n),
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        headers_column(headers) if any(headers) else None,
    )


def fetched_to_batch(
    cluster: str, topic: str, partition: int, items: Sequence[Any]
) -> pa.RecordBatch:
    """What ``getmany`` gave for one partition: ``RecordColumns`` (the reader's consumer, with
    ``kafka.arrow_fetch`` installed) or ``ConsumerRecord``s (without it)."""
    if isinstance(items[0], RecordColumns):
        return columns_to_batch(cluster, topic, partition, items)
    return records_to_batch(cluster, items)


def columns_to_batch(
    cluster: str, topic: str, partition: int, columns: Sequence[RecordColumns]
) -> pa.RecordBatch:
    """One partition's decoded fetches (``kafka.arrow_fetch``) as one RecordBatch."""
    if len(columns) == 1:
        c = columns[0]
        offsets, ts, keys, values, headers = c.offsets, c.timestamps_ms, c.keys, c.values, c.headers
    else:
        offsets = np.concatenate([c.offsets for c in columns])
        ts = np.concatenate([c.timestamps_ms for c in columns])
        keys = pa.concat_arrays([c.keys for c in columns])
        values = pa.concat_arrays([c.values for c in columns])
        headers = None
        if any(c.headers is not None for c in columns):
            headers = pa.concat_arrays(
                [_no_headers(len(c)) if c.headers is None else c.headers for c in columns]
            )
    n = len(offsets)
    return _batch(
        cluster,
        _constant(topic, n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        offsets,
        ts,
        keys,
        values,
        headers,
    )


def _no_headers(n: int) -> pa.Array:
    return pa.array([[]] * n, _HEADERS_TYPE)


def _constant(value: str, n: int) -> pa.Array:
    return pa.array([value], pa.string()).take(np.zeros(n, dtype=np.int32))


def _batch(
    cluster: str,
    topic: pa.Array,
    partition: pa.Array,
    offsets: np.ndarray,
    timestamps_ms: np.ndarray,
    keys: pa.Array,
    values: pa.Array,
    headers: pa.Array | None,
) -> pa.RecordBatch:
    n = len(offsets)
    columns = [
        _constant(cluster, n),
        topic,
        partition,
        pa.array(offsets),
        pa.array(timestamps_ms * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        keys,
        values,
        _no_headers(n) if headers is None else headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=RAW_RECORD_SCHEMA)
