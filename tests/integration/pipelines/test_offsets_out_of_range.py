"""A table ahead of its topic, on real parts (tansu, Ray, a Delta table): the topic is
deleted and re-created with fewer records than the table committed. Each setting of
``source.offsets_out_of_range``: ``fail`` gives the pipeline up naming the partitions and
both offsets, ``earliest`` commits the new topic from its start, ``latest`` from its end -
each reset recorded in the table version that lands it, and never a silent lag 0."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sink_checks
from aiokafka.admin import AIOKafkaAdminClient
from sink_checks import Produced, commit_history, table_rows
from sink_checks import caught_up as _caught_up

CLUSTER = sink_checks.CLUSTER
TOPIC = "recreated"
KEYS = [f"{CLUSTER}/{TOPIC}/{p}" for p in range(2)]


def _recreate(bootstrap: str) -> Produced:
    """Delete the topic and make it again, empty (its offsets start at 0 again)."""

    async def delete() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([TOPIC])
            for _ in range(200):
                if TOPIC not in await admin.list_topics():
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"{TOPIC} still listed after delete")
        finally:
            await admin.close()

    asyncio.run(delete())
    return Produced(bootstrap, TOPIC, 2)


def _rows(table: Path) -> Counter[tuple[int, int]]:
    return Counter((p, o) for _, _, p, o in table_rows(table))


def _start(bootstrap: str, table: Path, policy: str) -> Any:
    pipeline = sink_checks.pipeline(  # one name: the table's offsets are the pipeline's
        "oor",
        bootstrap,
        TOPIC,
        table,
        source={"offsets_out_of_range": policy},
        commit_interval_s=1,
    )
    return pipeline.start()


@pytest.mark.timeout(420)
def test_a_table_ahead_of_its_re_created_topic_under_each_setting(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    table = tmp_path / "t"
    first = Produced(bootstrap, TOPIC, 2)
    first.more(100)
    handle = _start(bootstrap, table, "fail")
    try:
        handle.wait_for(_caught_up(first), timeout_s=120)
    finally:
        handle.stop()
    old = _rows(table)
    assert sum(old.values()) == 100

    # the topic comes back with fewer records than the table committed: ahead by 35 each
    second = _recreate(bootstrap)
    second.more(30)
    handle = _start(bootstrap, table, "fail")
    try:
        status = handle.wait_for(lambda s: s["gave_up"] is not None, timeout_s=90)
        # the first partition found gives the pipeline up: named, with both offsets
        assert any(f"{key}: the table's committed offset 50 " in status.gave_up for key in KEYS)
        assert "log [0, 15)" in status.gave_up and "offsets_out_of_range" in status.gave_up
        assert set(status.out_of_range) <= set(KEYS) and status.out_of_range
        for key in KEYS:  # never a silent lag 0
            part = status.partition_status[key]
            assert part.state == "offsets_ahead" and part.lag is None, part
    finally:
        handle.stop(commit=False)
    assert _rows(table) == old  # nothing read, nothing committed

    handle = _start(bootstrap, table, "earliest")
    try:
        status = handle.wait_for(_caught_up(second), timeout_s=120)
        assert all(status.partition_status[k].state == "ok" for k in KEYS)
        assert all(status.partition_status[k].lag == 0 for k in KEYS)
    finally:
        handle.stop()
    new = Counter((p, o) for p, n in second.counts.items() for o in range(n))
    assert _rows(table) == old + new  # the new topic's records, each once
    resets = [
        json.loads(c["rayconnect.offset_resets"])
        for c in commit_history(table)
        if "rayconnect.offset_resets" in c
    ]
    assert {k: v for r in resets for k, v in r.items()} == dict.fromkeys(KEYS, 50)

    # once more, starting over at the end: only what is produced after the start
    third = _recreate(bootstrap)
    third.more(6)
    handle = _start(bootstrap, table, "latest")
    try:
        handle.wait_for(
            lambda s: all(s.partition_status.get(k) and s.offsets.get(k) == 3 for k in KEYS)
            and not s.out_of_range,
            timeout_s=120,
        )
        before_more = _rows(table)
        third.more(10)
        status = handle.wait_for(_caught_up(third), timeout_s=120)
    finally:
        handle.stop()
    assert before_more == old + new  # the 6 records before the start were skipped
    later = Counter((p, o) for p, n in third.counts.items() for o in range(3, n))
    assert _rows(table) == old + new + later
    assert status.offsets == third.offsets()
