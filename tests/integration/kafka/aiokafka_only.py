"""A user's plain aiokafka clients - no rayconnect import - run in the test's process or as a
script in a fresh one (``python aiokafka_only.py read|start_transactional ARGS``: the answer
as JSON on stdout), so the two can be compared (test_plain_aiokafka_clients.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition


async def read(
    bootstrap: str,
    topic: str,
    partitions: int,
    isolation_level: str,
    until: dict[int, int] | None,
    duration_s: float,
    mark: Callable[[AIOKafkaConsumer], AIOKafkaConsumer] = lambda consumer: consumer,
) -> dict[str, Any]:
    """What a plain consumer reads of ``topic`` from the beginning: until each partition's
    position reaches ``until`` (at most ``duration_s``), or for ``duration_s`` seconds.
    ``{"values": {partition: [value, ...]}, "positions": {partition: position}}``. ``mark``:
    applied to the consumer before it starts (a caller's ``compat.own`` makes it one of
    rayconnect's; the script never does)."""
    consumer = mark(
        AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level=isolation_level,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=50,
        )
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        values: dict[int, list[str]] = {p: [] for p in range(partitions)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration_s
        while loop.time() < deadline:
            if until is not None:
                positions = {tp.partition: await consumer.position(tp) for tp in tps}
                if all(positions[p] >= offset for p, offset in until.items()):
                    break
            batch = await consumer.getmany(timeout_ms=100)
            for tp, records in batch.items():
                values[tp.partition] += [r.value.decode() for r in records]
        positions = {tp.partition: await consumer.position(tp) for tp in tps}
        return {"values": values, "positions": positions}
    finally:
        await consumer.stop()


async def start_transactional(bootstrap: str, transactional_id: str) -> str:
    """Start a plain transactional producer: ``"started"``, or the error's class name."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=transactional_id, request_timeout_ms=5000
    )
    try:
        await asyncio.wait_for(producer.start(), 10)
        return "started"
    except Exception as e:
        return type(e).__name__
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 5)


def main(argv: list[str]) -> None:
    command, bootstrap, *args = argv
    if command == "read":
        topic, partitions, isolation_level, until, duration_s = args
        wanted = None if until == "-" else {int(p): o for p, o in json.loads(until).items()}
        answer: Any = asyncio.run(
            read(bootstrap, topic, int(partitions), isolation_level, wanted, float(duration_s))
        )
        answer = json.loads(json.dumps(answer))  # int keys as strings, as the caller's
    else:
        answer = asyncio.run(start_transactional(bootstrap, *args))
    imported = sorted(m for m in sys.modules if m.split(".")[0] == "rayconnect")
    print(json.dumps({"answer": answer, "rayconnect_modules": imported}))


if __name__ == "__main__":
    main(sys.argv[1:])
