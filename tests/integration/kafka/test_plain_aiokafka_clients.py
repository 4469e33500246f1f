"""A plain aiokafka client in a process that imported rayconnect behaves as in a process that
never did, against the real embedded broker; rayconnect's own clients keep the fixes.

The plain clients (``aiokafka_only.py``) run here, after ``import rayconnect`` and
``rayconnect.kafka`` (which install the hooks), and in a fresh Python that never imports
rayconnect; the answers must be equal. Where aiokafka alone differs from rayconnect's clients
on tansu (InitProducerId v0 refused; aborted records handed to read_committed), the plain
client here shows aiokafka's behaviour, not the fixed one.

The reported stall itself (a plain read_committed consumer held back at an undecided
transaction) is not reproduced on this broker: tansu answers a read_committed fetch only up
to the last stable offset, so no fetch carries a transaction without its marker here (the
hold-back needs one - after a restart of the durable broker, or a fetch cut by size on
Kafka). tests/unit/kafka/test_compat_scope.py feeds such a fetch to both kinds of client.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka_only import read, start_transactional

import rayconnect  # noqa: F401 - the point: imported, and nothing changes for plain clients
import rayconnect.kafka  # noqa: F401
from rayconnect.kafka import clients, compat
from rayconnect.kafka.admin import create_topic, high_watermarks
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.kafka.read_back import read_topic

SCRIPT = Path(__file__).parent / "aiokafka_only.py"
TOPIC = "scope"
PARTITIONS = 2


def _fresh(*args: str) -> Any:
    """The answer of ``aiokafka_only.py`` run in a new Python (no rayconnect import)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rayconnect_modules"] == []
    return out["answer"]


def _here(answer: dict[str, Any]) -> Any:
    return json.loads(json.dumps(answer))  # int keys as strings, as the fresh process's


async def _txn(producer: Any, prefix: str, n: int, commit: bool) -> None:
    await producer.begin_transaction()
    for i in range(n):
        await producer.send(TOPIC, f"{prefix}-{i}".encode(), partition=i % PARTITIONS)
    await producer.flush()
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()


async def _compare_reads(
    bootstrap: str, isolation_level: str, until: dict[int, int] | None, duration_s: float
) -> Any:
    here = _here(await read(bootstrap, TOPIC, PARTITIONS, isolation_level, until, duration_s))
    until_arg = "-" if until is None else json.dumps(until)
    fresh = await asyncio.to_thread(
        _fresh,
        "read",
        bootstrap,
        TOPIC,
        str(PARTITIONS),
        isolation_level,
        until_arg,
        str(duration_s),
    )
    assert here == fresh, f"{isolation_level}: here {here} != without rayconnect {fresh}"
    return here


@pytest.mark.timeout(120)
async def test_plain_clients_behave_as_in_a_process_without_rayconnect(
    kafka_broker: EmbeddedBroker,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    await create_topic(bootstrap, TOPIC, PARTITIONS)
    assert compat.is_applied()  # the hooks are installed in this process

    # a plain transactional producer: refused by tansu (v0), here as without rayconnect
    here = await start_transactional(bootstrap, "plain-here")
    fresh = await asyncio.to_thread(_fresh, "start_transactional", bootstrap, "plain-fresh")
    assert here == fresh == "UnknownError"

    ours = clients.producer(bootstrap, transactional_id="ours")  # v3: starts
    slow = clients.producer(bootstrap, transactional_id="slow")
    await ours.start()
    await slow.start()
    try:
        await _txn(ours, "c1", 6, commit=True)
        await _txn(ours, "a1", 4, commit=False)
        await slow.begin_transaction()  # left open for now
        for i in range(4):
            await slow.send(TOPIC, f"open-{i}".encode(), partition=i % PARTITIONS)
        await slow.flush()
        await _txn(ours, "c2", 4, commit=True)

        # an open transaction: what each kind of consumer reads in 2 s from the beginning
        for isolation_level in ("read_committed", "read_uncommitted"):
            await _compare_reads(bootstrap, isolation_level, None, 2.0)

        await slow.abort_transaction()
    finally:
        for p in (ours, slow):
            await asyncio.wait_for(p.stop(), 10)

    # everything decided: read to the high watermarks
    hw = await high_watermarks(bootstrap, TOPIC)
    plain = await _compare_reads(bootstrap, "read_committed", hw, 30.0)
    assert plain["positions"] == {str(p): o for p, o in hw.items()}
    plain_values = sorted(v for values in plain["values"].values() for v in values)
    # aiokafka alone on tansu: the aborted records are handed out (tansu sends no aborted list)
    assert [v for v in plain_values if v.startswith(("a1", "open"))]
    committed = sorted([f"c1-{i}" for i in range(6)] + [f"c2-{i}" for i in range(4)])
    ours_values = sorted(value.decode() for _, value in await read_topic(bootstrap, TOPIC))
    assert ours_values == committed  # rayconnect's reader: the fixes
    assert sorted(v for v in plain_values if v.startswith("c")) == committed
