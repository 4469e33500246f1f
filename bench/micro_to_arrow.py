"""Micro-benchmark of the read path's per-record work: fetched Kafka bytes -> Arrow batch.

    .venv/bin/python bench/micro_to_arrow.py [--records 50000] [--repeat 20]

The whole path from one fetched partition's bytes (v2 record batches of 16 KB, as aiokafka's
producer makes them; demo records, ~200 B values, no headers) to the Arrow batch a
participant gets:

- *aiokafka + records_to_batch*: aiokafka's decoder (its C extension, then a ``ConsumerRecord``
  each), then our columns from the record objects - the reader before session 3;
- *decode_batches + columns_to_batch*: ``kafka/record_batches.py`` on the bytes (also with
  lz4-compressed batches, and with a header on every record) - the reader now.

Also ``records_to_batch`` alone on ready ``ConsumerRecord``s (with and without headers), the
floor of reading ``.value`` of every record object, and the baseline's ``from_pydict``.
Reports ns per record and records/s of one core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aiokafka.structs import ConsumerRecord  # noqa: E402

from rayconnect.kafka.admin import demo_value  # noqa: E402
from rayconnect.kafka.to_arrow import columns_to_batch, records_to_batch  # noqa: E402


def make_records(n: int, headers: bool = False) -> list[ConsumerRecord]:
    out = []
    for i in range(n):
        key = f"key-{i}"
        value = demo_value(i, key)
        out.append(
            ConsumerRecord(
                "bench",
                3,
                1000 + i,
                1_700_000_000_000 + i,
                0,
                key.encode(),
                value,
                None,
                len(key),
                len(value),
                [("h", b"v")] if headers else [],
            )
        )
    return out


def fetched_bytes(n: int, compression: int = 0, headers: bool = False) -> bytes:
    """``n`` demo records as a fetch response's record set: batches of 16 KB."""
    import struct

    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    out, offset = bytearray(), 0
    while offset < n:
        builder = DefaultRecordBatchBuilder(2, compression, 0, -1, -1, -1, 16384)
        base = offset
        while offset < n:
            key = f"key-{offset}"
            value = demo_value(offset, key)
            if (
                builder.append(offset - base, 1_700_000_000_000 + offset, key.encode(), value, [])
                is None
            ):
                break
            offset += 1
        batch = builder.build()
        struct.pack_into(">q", batch, 0, base)
        out += batch
    return bytes(out)


def old_path(data: bytes):
    from aiokafka import TopicPartition
    from aiokafka.consumer.fetcher import READ_COMMITTED, PartitionRecords
    from aiokafka.record.memory_records import MemoryRecords

    tp = TopicPartition("bench", 3)
    records = list(
        PartitionRecords(tp, MemoryRecords(data), [], 0, None, None, True, READ_COMMITTED)
    )
    return records_to_batch("local", records)


def new_path(data: bytes):
    from rayconnect.kafka.record_batches import batch_spans, decode_batches

    columns = decode_batches(data, list(batch_spans(data).values()), 0)
    return columns_to_batch("local", "bench", 3, [columns])


def timeit(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    from baseline import to_batch as plain_to_batch

    recs = make_records(a.records)
    with_headers = make_records(a.records, headers=True)
    data = fetched_bytes(a.records)
    lz4 = fetched_bytes(a.records, compression=3)
    traced = fetched_bytes(a.records, headers=True)
    for fetched in (data, lz4, traced):
        assert new_path(fetched).equals(old_path(fetched))
    cases = {
        "bytes: aiokafka + records_to_batch": lambda: old_path(data),
        "bytes: decode_batches + to_batch": lambda: new_path(data),
        "lz4 bytes: aiokafka + records_to_b.": lambda: old_path(lz4),
        "lz4 bytes: decode_batches + to_batch": lambda: new_path(lz4),
        "1 header: aiokafka + records_to_b.": lambda: old_path(traced),
        "1 header: decode_batches + to_batch": lambda: new_path(traced),
        "floor: read .value of each record": lambda: [r.value for r in recs],
        "records_to_batch (no headers)": lambda: records_to_batch("local", recs),
        "records_to_batch (1 header each)": lambda: records_to_batch("local", with_headers),
        "baseline from_pydict (no headers)": lambda: plain_to_batch("local", recs),
    }
    print(f"{a.records:,} records per batch, median of {a.repeat}")
    print(f"{'case':<36} {'ms/batch':>9} {'ns/record':>10} {'Mrec/s':>7}")
    for name, fn in cases.items():
        s = timeit(fn, a.repeat)
        print(
            f"{name:<36} {s * 1e3:>9.2f} {s / a.records * 1e9:>10.0f} {a.records / s / 1e6:>7.2f}"
        )


if __name__ == "__main__":
    main()
