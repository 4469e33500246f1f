"""The ceiling: raw aiokafka fetch of the same records, nothing converted, nothing written.

    python bench/ceiling.py BOOTSTRAP TOPIC EXPECTED [--latency]

Reads every partition of TOPIC from the beginning until EXPECTED records arrived (same
consumer settings as rayconnect's reader: read_committed, 4 MB per partition, 32 MB per
fetch, 50k records per poll). Prints READY once assigned, then one JSON line: records/s,
payload MB/s (key + value bytes), and with --latency the produce-to-received latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiokafka import AIOKafkaConsumer, TopicPartition


async def main(bootstrap: str, topic: str, expected: int, latency: bool) -> dict:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    parts = sorted(consumer.partitions_for_topic(topic) or [])
    tps = [TopicPartition(topic, p) for p in parts]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    print("READY", flush=True)
    count = nbytes = 0
    lat: list[float] = []
    t0 = None
    try:
        while count < expected:
            fetched = await consumer.getmany(timeout_ms=200, max_records=50_000)
            now_ms = time.time() * 1000.0
            for records in fetched.values():
                if t0 is None:
                    t0 = time.perf_counter()
                count += len(records)
                for r in records:
                    nbytes += len(r.value) + len(r.key or b"")
                if latency:
                    lat.extend(now_ms - r.timestamp for r in records)
        elapsed = time.perf_counter() - (t0 or time.perf_counter())
    finally:
        await consumer.stop()
    out = {
        "records": count,
        "seconds": elapsed,
        "records_per_s": count / elapsed if elapsed else None,
        "mb_per_s": nbytes / elapsed / 1e6 if elapsed else None,
        "bytes_per_record": nbytes / max(count, 1),
    }
    if latency:
        import numpy as np

        arr = np.asarray(lat)
        out["latency_ms"] = {
            "p50": float(np.percentile(arr, 50)),
            "p99": float(np.percentile(arr, 99)),
            "max": float(arr.max()),
            "n": int(arr.size),
        }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("expected", type=int)
    ap.add_argument("--latency", action="store_true")
    a = ap.parse_args()
    print(json.dumps(asyncio.run(main(a.bootstrap, a.topic, a.expected, a.latency))), flush=True)
