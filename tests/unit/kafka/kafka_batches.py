"""Hand-built Kafka record batches (message format v2), as a fetch response carries them.

For the tests of the fetch path without a broker: the embedded broker never returns some
shapes (a transaction cut before its marker, compressed or LOG_APPEND_TIME batches).
"""

from __future__ import annotations

import struct

from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

COMMIT, ABORT = 1, 0


def batch(offset: int, pid: int, values: list[bytes], *, txn: bool = True) -> bytes:
    builder = _DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=0,
        is_transactional=int(txn),
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
        batch_size=1 << 20,
    )
    for i, v in enumerate(values):
        builder.append(i, timestamp=1, key=None, value=v, headers=[])
    buf = builder.build()
    struct.pack_into(">q", buf, 0, offset)  # base offset, normally set by the broker
    return bytes(buf)


def marker(offset: int, pid: int, kind: int) -> bytes:
    builder = _DefaultRecordBatchBuilderPy(2, 0, 1, pid, 0, -1, 1 << 20)
    builder.append(
        0, timestamp=1, key=struct.pack(">hh", 0, kind), value=b"\0\0\0\0\0\0", headers=[]
    )
    buf = builder.build()
    struct.pack_into(">q", buf, 0, offset)
    attrs_at = builder.ATTRIBUTES_OFFSET
    (attrs,) = struct.unpack_from(">h", buf, attrs_at)
    struct.pack_into(">h", buf, attrs_at, attrs | builder.CONTROL_MASK)  # CRC not checked
    return bytes(buf)


def records_batch(
    offset: int,
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]],
    *,
    compression: int = 0,
    log_append_time: int | None = None,
) -> bytes:
    """A plain (non-transactional) batch of (timestamp, key, value, headers) records.

    ``log_append_time``: the batch is marked LOG_APPEND_TIME with that maxTimestamp, as a
    broker with ``message.timestamp.type=LogAppendTime`` rewrites it (CRC not updated).
    """
    builder = _DefaultRecordBatchBuilderPy(2, compression, 0, -1, -1, -1, 1 << 30)
    for i, (ts, key, value, headers) in enumerate(records):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    buf = builder.build()
    struct.pack_into(">q", buf, 0, offset)
    if log_append_time is not None:
        attrs_at = builder.ATTRIBUTES_OFFSET
        (attrs,) = struct.unpack_from(">h", buf, attrs_at)
        struct.pack_into(">h", buf, attrs_at, attrs | builder.TIMESTAMP_TYPE_MASK)
        struct.pack_into(">q", buf, 35, log_append_time)  # maxTimestamp
    return bytes(buf)


# offsets: 0 c (pid 1) | 1 COMMIT pid 1 | 2-3 a (pid 2) | 4 ABORT pid 2 | 5 plain (pid -1)
DECIDED = (
    batch(0, 1, [b"c"])
    + marker(1, 1, COMMIT)
    + batch(2, 2, [b"a1", b"a2"])
    + marker(4, 2, ABORT)
    + batch(5, -1, [b"plain"], txn=False)
)
"""A committed and an aborted transaction, then a plain record: every transaction decided."""
