"""Offer a steady load: RATE demo records/s for SECONDS, round-robin over the partitions.

    python bench/paced_producer.py BOOTSTRAP TOPIC RATE SECONDS [--start-index I]

Sends every 10 ms what the schedule says is due (so a slow moment is caught up, not lost);
record timestamps are the producer's create time, i.e. the produce time the latency scenario
measures from. Prints READY once connected, then one JSON line: records, achieved rate and
{partition: records}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiokafka import AIOKafkaProducer

from rayconnect.kafka.admin import demo_value


async def main(a: argparse.Namespace) -> dict:
    producer = AIOKafkaProducer(
        bootstrap_servers=a.bootstrap, linger_ms=5, max_batch_size=64 * 1024, acks="all"
    )
    await producer.start()
    parts = sorted(await producer.partitions_for(a.topic))
    print("READY", flush=True)
    total = int(a.rate * a.seconds)
    counts = dict.fromkeys(parts, 0)
    pending: list[asyncio.Future] = []
    sent = 0
    t0 = time.monotonic()
    try:
        while sent < total:
            due = min(total, int((time.monotonic() - t0) * a.rate) + 1)
            while sent < due:
                i = a.start_index + sent
                key = f"key-{i}"
                p = parts[sent % len(parts)]
                pending.append(
                    await producer.send(a.topic, demo_value(i, key), key=key.encode(), partition=p)
                )
                counts[p] += 1
                sent += 1
            if len(pending) > 5000:
                await asyncio.gather(*pending)
                pending.clear()
            await asyncio.sleep(0.01)
        await asyncio.gather(*pending)
        elapsed = time.monotonic() - t0
    finally:
        await producer.stop()
    return {"records": sent, "seconds": elapsed, "rate": sent / elapsed, "counts": counts}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("rate", type=float)
    ap.add_argument("seconds", type=float)
    ap.add_argument("--start-index", type=int, default=0)
    print(json.dumps(asyncio.run(main(ap.parse_args()))), flush=True)
