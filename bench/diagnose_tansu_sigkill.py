"""Diagnosis, run on purpose (not a benchmark): does the durable embedded broker (tansu on the
embedded S3) keep a transaction's records when it is SIGKILLed mid-run?

A source task (``TaskRunner``, no Ray: restarted in a loop here) writes generator records in
1 s transactions; after 4 s the broker is SIGKILLed, started again 5 s later on the same port
and log, and the task goes on for 8 s. Then every record of the topic is read with
read_uncommitted and each source partition's sequence is checked for jumps.

Measured with tansu 0.6.0 (3 of 3 runs, also through Ray in
tests/integration/pipelines/test_source_outages.py): one jump of ~48 records per source
partition of one Kafka partition (e.g. seq 851 at offset 1693, then seq 900 at 1802) while the
offsets topic says those records committed - the broker lost records it had acknowledged.

Also with a graceful stop (SIGTERM; tansu exits 0 at once) and start, ``--graceful``:
the same loss (measured 2026-11-23: see the README's outage section).

    .venv/bin/python bench/diagnose_tansu_sigkill.py [--graceful]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

import rayconnect as rc
from rayconnect.actors.source_task import TaskRunner
from rayconnect.config.source import SourceSettings
from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.broker_storage import on_s3
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.pipelines.source import prepare_generation
from rayconnect.storage.embedded_s3 import EmbeddedS3


async def _records(bootstrap: str, topic: str, partition: int) -> list[tuple[int, dict]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_uncommitted",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    out: list[tuple[int, dict]] = []
    try:
        while batch := (await consumer.getmany(tp, timeout_ms=1000)).get(tp):
            out += [(r.offset, json.loads(r.value)) for r in batch]
    finally:
        await consumer.stop()
    return out


def main(graceful: bool) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="rayconnect-diag-") as scratch,
        EmbeddedS3() as s3,
        EmbeddedBroker("local", log_dir=Path(scratch), storage=on_s3(s3)) as broker,
    ):
        bootstrap = broker.bootstrap_servers
        asyncio.run(create_topic(bootstrap, "out", 2))
        settings = SourceSettings(
            name="diag",
            target=rc.KafkaTarget(bootstrap),
            transaction_boundary="interval",
            transaction_boundary_interval_s=1.0,
            commit_timeout_s=10.0,
        )
        asyncio.run(prepare_generation(settings))
        stop = threading.Event()
        runners: list[TaskRunner] = []

        def run_task() -> None:  # Ray's restarts, by hand
            while not stop.is_set():
                source = rc.GeneratorSource("out", partitions=4, batch_size=50, poll_delay_s=0.01)
                runners.append(TaskRunner(settings, 0, source))
                try:
                    asyncio.run(runners[-1].run())
                    return
                except Exception as e:
                    print(f"incarnation failed: {str(e)[:100]}", flush=True)
                    time.sleep(0.5)

        thread = threading.Thread(target=run_task, daemon=True)
        thread.start()
        time.sleep(4)
        assert broker.pid is not None
        if graceful:
            broker.stop(grace=5.0)  # SIGTERM: tansu exits 0 within ~40 ms
        else:
            os.kill(broker.pid, signal.SIGKILL)
        time.sleep(5)
        broker.start()
        time.sleep(8)
        runners[-1].stop()
        stop.set()
        thread.join(30)
        for partition in (0, 1):
            by_source: dict[int, list[tuple[int, int]]] = {}
            for offset, value in asyncio.run(_records(bootstrap, "out", partition)):
                by_source.setdefault(value["p"], []).append((value["seq"], offset))
            for p, seen in sorted(by_source.items()):
                jumps = [
                    (a[0], b[0], a[1], b[1])
                    for a, b in zip(seen, seen[1:], strict=False)
                    if b[0] != a[0] + 1
                ]
                print(
                    f"partition {partition}, source partition {p}: {len(seen)} records; "
                    f"jumps (seq, next seq, offset, next offset): {jumps[:5] or 'none'}"
                )


if __name__ == "__main__":
    main(graceful="--graceful" in sys.argv)
