"""Exactly-once vs plain produce, records/s, for GeneratorSource at the same batch size.

Runs one source task in this process (no Ray: the task actor only hosts this loop) against
an embedded broker, three ways per batch size:
  exactly-once  one Kafka transaction per poll: records + source offsets, then commit
  plain         the same task loop without transactions (records, offsets, flush: at-least-once)
  raw produce   aiokafka alone, the same records, no offsets (the ceiling)

    .venv/bin/python bench/source_eo_vs_plain.py [--records 100000] [--batches 100,1000,5000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rayconnect.actors.source_task import TaskRunner
from rayconnect.config.source import KafkaTarget, SourceSettings
from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.kafka.transactions import producer, stop_quietly
from rayconnect.pipelines.source import prepare_generation
from rayconnect.source_tasks import GeneratorSource
from rayconnect.source_tasks.base import SourceTaskContext, to_bytes

PARTITIONS = 4


async def via_task(bootstrap: str, name: str, n: int, batch: int, transactional: bool) -> float:
    s = SourceSettings(name=name, target=KafkaTarget(bootstrap))
    await prepare_generation(s)
    per = n // PARTITIONS
    source = GeneratorSource("bench", PARTITIONS, records_per_partition=per, batch_size=batch)
    runner = TaskRunner(s, 0, source, transactional=transactional)
    return await committed_rate(runner, per * PARTITIONS)


async def committed_rate(runner: TaskRunner, records: int) -> float:
    """Run ``runner`` until ``records`` are committed; records/s from the task's start (its
    first poll can run) to the last commit. A task that fails raises here."""
    task = asyncio.create_task(runner.run())
    while not runner.started.is_set():
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    t0 = time.perf_counter()
    while runner.machine.status().records_committed < records:
        if task.done():
            task.result()
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - t0
    runner.stop()
    await task
    return records / elapsed


async def raw(bootstrap: str, n: int, batch: int) -> float:
    source = GeneratorSource(
        "bench", PARTITIONS, records_per_partition=n // PARTITIONS, batch_size=batch
    )
    await source.start(SourceTaskContext("raw", 0, 1, {}))
    p = producer(bootstrap, None)
    await p.start()
    t0 = time.perf_counter()
    count = 0
    try:
        while records := await source.poll():
            futs = [await p.send(r.topic, to_bytes(r.value), key=to_bytes(r.key)) for r in records]
            await asyncio.gather(*futs)
            count += len(records)
    finally:
        await stop_quietly(p)
    return count / (time.perf_counter() - t0)


async def main(n: int, batches: list[int]) -> None:
    rows = []
    for batch in batches:
        with EmbeddedBroker(f"bench-{batch}") as broker:  # fresh: the memory engine only grows
            bs = broker.bootstrap_servers
            await create_topic(bs, "bench", PARTITIONS)
            eo = await via_task(bs, f"eo-{batch}", n, batch, True)
            plain = await via_task(bs, f"plain-{batch}", n, batch, False)
            ceiling = await raw(bs, n, batch)
        rows.append((batch, eo, plain, ceiling))
    print(f"{n:,} records of ~200 B, {PARTITIONS} partitions, embedded broker, one task\n")
    print(
        f"{'batch':>7} {'exactly-once rec/s':>19} {'plain rec/s':>12} {'raw produce':>12} {'eo/plain':>9}"
    )
    for batch, eo, plain, ceiling in rows:
        print(f"{batch:>7} {eo:>19,.0f} {plain:>12,.0f} {ceiling:>12,.0f} {eo / plain:>8.0%}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batches", default="100,1000,5000")
    args = ap.parse_args()
    asyncio.run(main(args.records, [int(b) for b in args.batches.split(",")]))
