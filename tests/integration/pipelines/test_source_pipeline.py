"""Exactly-once source pipelines (KIP-618) on the embedded broker and a real local Ray.

What is checked is what a read_committed consumer SEES: every source record exactly once,
in source order per source partition; never a zombie's records or offsets. Ray starts once
for the module; each test gets a fresh broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.actors.source_task import TaskRunner
from rayconnect.config.source import SourceSettings
from rayconnect.kafka import compat
from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.kafka.offsets_store import (
    combined_offsets,
    ensure_offsets_topic,
    offset_key,
    offset_value,
    read_offsets,
)
from rayconnect.kafka.read_back import read_topic
from rayconnect.pipelines.source import prepare_generation
from rayconnect.source_tasks.base import encode_partition
from rayconnect.source_tasks.generator import sequences

pytestmark = [pytest.mark.usefixtures("ray_session")]

TOPIC = "out"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def read_all(
    bootstrap: str,
    topic: str = TOPIC,
    isolation_level: str = "read_committed",
    headers: bool = False,
) -> list[tuple[Any, ...]]:
    return await read_topic(bootstrap, topic, isolation_level, headers)


def generator_seqs(bootstrap: str) -> tuple[dict[int, list[int]], list[dict[str, Any]]]:
    values = [json.loads(v) for _, v in run(read_all(bootstrap))]
    return sequences(values), values


def assert_exactly_once_in_order(seqs: dict[int, list[int]], start: dict[int, int] | None = None):
    """Each source partition's sequence is start..n-1, no gap, no duplicate, in order."""
    for p, got in seqs.items():
        first = (start or {}).get(p, 0)
        assert got == list(range(first, first + len(got))), f"source partition {p}: {got[:50]}"


def committed(bootstrap: str, pipeline: str) -> dict[str, Any]:
    return run(read_offsets(bootstrap, f"rayconnect-offsets-{pipeline}", pipeline)).offsets


@pytest.fixture
def broker(kafka_broker: EmbeddedBroker) -> str:
    run(create_topic(kafka_broker.bootstrap_servers, TOPIC, 2))
    return kafka_broker.bootstrap_servers


def _until(handle: Any, predicate: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    return handle.wait_for(predicate, timeout_s=timeout_s, poll_s=0.2)


# --------------------------------------------------------------------------------------


def _kill_repeatedly(handle: Any, name: str, kill: Any, times: int) -> None:
    """Kill the task ``times`` times, each time once it produced again, at a random moment:
    with a transaction per poll it is mostly mid-transaction."""
    restarts = _until(handle, lambda s: 0 in s["tasks"])["tasks"][0].get("restarts", 0)
    for k in range(times):
        _until(handle, lambda s: s["tasks"].get(0, {}).get("records_committed", 0) > 0)
        time.sleep(random.uniform(0.0, 0.15))
        if k % 2 == 0:
            kill(name, "ray.kill")
        else:  # the task reports its own pid: the state API may see other Rays here
            pid = ray.get(ray.get_actor(name, namespace=names.NAMESPACE).status.remote())["pid"]
            os.kill(pid, signal.SIGKILL)
        restarts += 1
        _until(handle, lambda s, r=restarts: s["tasks"].get(0, {}).get("restarts", 0) >= r)
    _until(handle, lambda s: s["tasks"][0]["records_committed"] > 0)


@pytest.mark.timeout(300)
def test_killed_20_times_mid_transaction_every_record_once_in_order(broker: str, kill) -> None:
    source = rc.GeneratorSource(TOPIC, partitions=4, batch_size=100, poll_delay_s=0.005)
    name = names.task("kills", 0)
    for times in (20, 10, 10):
        handle = rc.SourcePipeline("kills", task=source, target=rc.KafkaTarget(broker)).start()
        try:
            _kill_repeatedly(handle, name, kill, times)
        finally:
            handle.stop()
        seqs, _ = generator_seqs(broker)
        written = len(run(read_all(broker, isolation_level="read_uncommitted")))
        # The kills must have cut transactions (records written that never committed) for
        # the test to prove anything. A kill lands between a transaction's first send and
        # its commit most of the time, not always: if 20 missed, kill again (and restart).
        if written > sum(len(s) for s in seqs.values()):
            break
    assert written > sum(len(s) for s in seqs.values())
    assert_exactly_once_in_order(seqs)
    assert set(seqs) == {0, 1, 2, 3}
    offsets = committed(broker, "kills")
    for p, got in seqs.items():  # the committed offset is the last visible record
        assert offsets[encode_partition({"generator": p})] == {"seq": got[-1]}


@pytest.mark.timeout(90)
def test_zombie_of_an_old_generation_gets_nothing_in(broker: str) -> None:
    """Generation 1 had 2 tasks; task 1 keeps running (a zombie) while generation 2 starts
    with 1 task - so no new task shares its transactional id: only the fence stops it."""
    old = SourceSettings(
        name="zomb",
        target=rc.KafkaTarget(broker),
        tasks=2,
        transaction_boundary="interval",
        transaction_boundary_interval_s=1.5,
        commit_timeout_s=5.0,
    )
    assert run(prepare_generation(old)) == (True, None)
    zombie = TaskRunner(
        old,
        1,
        rc.GeneratorSource(TOPIC, partitions=4, batch_size=20, poll_delay_s=0.01, tag="zombie"),
    )
    outcome: dict[str, Any] = {}

    def zombie_thread() -> None:
        try:
            asyncio.run(zombie.run())
            outcome["result"] = "stopped"
        except Exception as e:
            outcome["result"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=zombie_thread, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while zombie.machine.status().transactions_committed < 1:
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.05)
    time.sleep(0.5)  # the zombie is now inside its next (interval) transaction
    sent_before = zombie.machine.status().records_sent
    assert "result" not in outcome  # still running as the new generation starts

    new_source = rc.GeneratorSource(TOPIC, partitions=4, batch_size=50, poll_delay_s=0.01)
    handle = rc.SourcePipeline("zomb", task=new_source, target=rc.KafkaTarget(broker)).start()
    try:
        _until(handle, lambda s: s["records_committed"] >= 1000)
        thread.join(30)
    finally:
        handle.stop()
    zs = zombie.machine.status()
    assert zs.records_sent > sent_before  # it did try to write after the fence

    seqs, values = generator_seqs(broker)
    assert_exactly_once_in_order(seqs)  # a zombie record after the fence would duplicate
    # the zombie's visible records are exactly those it committed before the fence
    zombie_visible = {(v["p"], v["seq"]) for v in values if v["tag"] == "zombie"}
    assert len(zombie_visible) == zs.records_committed
    assert all(p in (1, 3) for p, _ in zombie_visible)
    offsets = committed(broker, "zomb")
    for p, got in seqs.items():
        assert offsets[encode_partition({"generator": p})] == {"seq": got[-1]}


@pytest.mark.timeout(60)
def test_resumes_from_global_offsets_when_own_topic_is_empty(broker: str) -> None:
    async def seed_global() -> None:
        from aiokafka import AIOKafkaProducer

        await ensure_offsets_topic(broker, "rayconnect-offsets")
        p = AIOKafkaProducer(bootstrap_servers=broker)
        await p.start()
        try:
            for j, seq in ((0, 99), (1, 49)):
                key = offset_key("glob", encode_partition({"generator": j}))
                await p.send_and_wait("rayconnect-offsets", offset_value({"seq": seq}), key=key)
            # another pipeline's offset in the shared topic must not leak in
            other = offset_key("other", encode_partition({"generator": 0}))
            await p.send_and_wait("rayconnect-offsets", offset_value({"seq": 7}), key=other)
        finally:
            await p.stop()

    run(seed_global())
    source = rc.GeneratorSource(TOPIC, partitions=2, records_per_partition=150, batch_size=40)
    handle = rc.SourcePipeline("glob", task=source, target=rc.KafkaTarget(broker)).start()
    try:
        _until(handle, lambda s: s["records_committed"] == 50 + 100)
    finally:
        handle.stop()
    seqs, _ = generator_seqs(broker)
    assert_exactly_once_in_order(seqs, start={0: 100, 1: 50})
    assert {p: (s[0], s[-1]) for p, s in seqs.items()} == {0: (100, 149), 1: (50, 149)}


@pytest.mark.timeout(30)
def test_combined_view_prefers_the_pipelines_own_topic(broker: str) -> None:
    async def scenario() -> dict[str, Any]:
        from aiokafka import AIOKafkaProducer

        for t in ("rayconnect-offsets", "rayconnect-offsets-mine"):
            await ensure_offsets_topic(broker, t)
        p = AIOKafkaProducer(bootstrap_servers=broker)
        await p.start()
        a, b = encode_partition({"f": "a"}), encode_partition({"f": "b"})
        await p.send_and_wait("rayconnect-offsets", offset_value(1), key=offset_key("mine", a))
        await p.send_and_wait("rayconnect-offsets", offset_value(2), key=offset_key("mine", b))
        await p.send_and_wait("rayconnect-offsets-mine", offset_value(9), key=offset_key("mine", b))
        await p.stop()
        view, _ = await combined_offsets(
            broker, "rayconnect-offsets-mine", "rayconnect-offsets", "mine"
        )
        return view

    assert run(scenario()) == {encode_partition({"f": "a"}): 1, encode_partition({"f": "b"}): 9}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("boundary", ["poll", "interval", "connector"])
def test_transaction_boundaries(broker: str, boundary: str) -> None:
    source = rc.GeneratorSource(
        TOPIC,
        partitions=2,
        records_per_partition=500,
        batch_size=50,
        poll_delay_s=0.02,
        commit_every=250,
    )
    pipeline = rc.SourcePipeline(
        f"b-{boundary}",
        task=source,
        target=rc.KafkaTarget(broker),
        transaction_boundary=boundary,
        transaction_boundary_interval_s=0.5,
    )
    started = time.monotonic()
    handle = pipeline.start()
    try:
        status = _until(handle, lambda s: s["records_committed"] == 1000)
        elapsed = time.monotonic() - started
    finally:
        handle.stop()
    task = status["tasks"][0]
    if boundary == "poll":  # one transaction per (non-empty) poll of 50
        assert task["transactions_committed"] == 1000 // 50
    elif boundary == "interval":  # at most one per interval, fewer than polls
        assert 1 <= task["transactions_committed"] <= elapsed / 0.5 + 1
        assert task["transactions_committed"] < 1000 // 50
    else:  # exactly where the task asked
        assert task["transactions_committed"] == 1000 // 250
    seqs, _ = generator_seqs(broker)
    assert_exactly_once_in_order(seqs)
    assert {p: len(s) for p, s in seqs.items()} == {0: 500, 1: 500}


@pytest.mark.timeout(60)
def test_file_source_round_trip_picks_up_new_files(broker: str, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()

    def write(name: str, n: int) -> None:
        lines = [json.dumps({"file": name, "line": i}) for i in range(n)]
        (folder / name).write_text("".join(line + "\n" for line in lines))

    write("a.jsonl", 300)
    write("b.jsonl", 200)
    (folder / "ignored.txt").write_text("not json lines\n")
    source = rc.FileSource(str(folder), TOPIC, batch_size=64, idle_s=0.1)
    handle = rc.SourcePipeline("files", task=source, tasks=2, target=rc.KafkaTarget(broker)).start()
    try:
        _until(handle, lambda s: s["records_committed"] == 500)
        write("c.jsonl", 100)
        _until(handle, lambda s: s["records_committed"] == 600)
    finally:
        handle.stop()
    by_file: dict[str, list[int]] = {}
    for key, value in run(read_all(broker)):
        v = json.loads(value)
        assert key == v["file"].encode()
        by_file.setdefault(v["file"], []).append(v["line"])
    assert by_file == {
        "a.jsonl": list(range(300)),
        "b.jsonl": list(range(200)),
        "c.jsonl": list(range(100)),
    }
    offsets = committed(broker, "files")
    assert offsets[encode_partition({"file": "c.jsonl"})] == {"line": 99}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("dead_letter_topic", ["dlq", None])
def test_a_record_that_cannot_be_written_goes_to_the_dead_letter_topic_or_stops_the_task(
    broker: str, tmp_path: Path, dead_letter_topic: str | None
) -> None:
    """Line 55 of 100 is 2 MB, over the producer's 1 MB limit. With a dead-letter topic it
    lands there, with the reason and its origin, in the same transaction as its neighbours;
    without one the task stops for good (a restart would meet it again): lines 0-49 (five
    committed transactions of 10) are visible, nothing of the failed transaction is."""
    folder = tmp_path / "in"
    folder.mkdir()
    lines = [
        json.dumps({"line": i, "pad": "x" * (2_000_000 if i == 55 else 10)}) for i in range(100)
    ]
    (folder / "a.jsonl").write_text("".join(line + "\n" for line in lines))
    source = rc.FileSource(str(folder), TOPIC, batch_size=10, idle_s=0.1)
    name = f"poison-{dead_letter_topic or 'none'}"
    handle = rc.SourcePipeline(
        name, task=source, target=rc.KafkaTarget(broker), dead_letter_topic=dead_letter_topic
    ).start()
    try:
        if dead_letter_topic:
            status = _until(handle, lambda s: s["records_committed"] == 100)
            assert status["tasks"][0]["dead_letters"] == 1
        else:
            status = _until(handle, lambda s: s["tasks"][0].get("bad_record") is not None)
            task = status["tasks"][0]
            assert "MessageSizeTooLarge" in task["bad_record"]
            assert task["restarts"] == 0
            time.sleep(2.0)  # stays failed: not restarted into the same record
            assert handle.status()["tasks"][0]["restarts"] == 0
    finally:
        handle.stop()
    got = [json.loads(v)["line"] for _, v in run(read_all(broker))]
    if dead_letter_topic:
        assert sorted(got) == [i for i in range(100) if i != 55]
        [(key, value, headers)] = run(read_all(broker, dead_letter_topic, headers=True))
        assert "MessageSizeTooLarge" in headers["rayconnect.error"].decode()
        origin = json.loads(headers["rayconnect.origin"])
        assert origin["source_offset"] == {"line": 55} and origin["topic"] == TOPIC
        assert int(headers["rayconnect.value_bytes"]) > 2_000_000 > len(value)
    else:
        assert sorted(got) == list(range(50))


@pytest.mark.timeout(60)
def test_delta_table_source_replays_each_new_version(broker: str, tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path / "table")
    write_deltalake(path, pa.table({"id": list(range(100)), "v": ["a"] * 100}))
    write_deltalake(path, pa.table({"id": list(range(100, 150)), "v": ["b"] * 50}), mode="append")
    source = rc.DeltaTableSource(path, TOPIC, batch_size=40, idle_s=0.1)
    handle = rc.SourcePipeline("delta", task=source, target=rc.KafkaTarget(broker)).start()
    try:
        _until(handle, lambda s: s["records_committed"] == 150)
        write_deltalake(
            path, pa.table({"id": list(range(150, 220)), "v": ["c"] * 70}), mode="append"
        )
        _until(handle, lambda s: s["records_committed"] == 220)
    finally:
        handle.stop()
    rows = [json.loads(v) for _, v in run(read_all(broker))]
    assert [r["id"] for r in rows] == list(range(220))  # one Kafka partition: table order
    offsets = committed(broker, "delta")
    assert offsets[encode_partition({"table": path})] == {"version": 2, "row": 69}


@pytest.mark.timeout(60)
def test_required_refuses_without_transactions_requested_falls_back(broker: str) -> None:
    """A broker whose InitProducerId fails is simulated by removing our v3 fix in this
    process (tansu rejects v0): the probe is what decides, before any actor exists."""
    source = rc.GeneratorSource(TOPIC, partitions=1, records_per_partition=10)
    target = rc.KafkaTarget(broker)
    with compat.disabled("init_producer_id"):
        with pytest.raises(rc.PipelineError, match="exactly_once='required'.*transaction"):
            rc.SourcePipeline("strict", task=source, target=target, exactly_once="required").start()
        transactional, warning = rc.SourcePipeline(
            "lenient", task=source, target=target, exactly_once="requested"
        ).prepare()
    assert not transactional and "at-least-once" in warning
    from rayconnect.runtime import task_actor_names

    assert task_actor_names("strict") == []


def test_config_errors_before_any_actor(broker: str) -> None:
    source = rc.GeneratorSource(TOPIC)
    target = rc.KafkaTarget(broker)
    with pytest.raises(rc.ConfigError, match="tasks"):
        rc.SourcePipeline("bad", task=source, target=target, tasks=0)
    with pytest.raises(rc.ConfigError, match="transaction_boundary"):
        rc.SourcePipeline("bad", task=source, target=target, transaction_boundary="batch")
    with pytest.raises(rc.ConfigError, match="exactly_once"):
        rc.SourcePipeline("bad", task=source, target=target, exactly_once="always")  # type: ignore[arg-type]
    with pytest.raises(rc.ConfigError, match="pipeline name"):
        rc.SourcePipeline("a/b", task=source, target=target)
    with pytest.raises(rc.ConfigError, match="SourceTask"):
        rc.SourcePipeline("bad", task=object(), target=target)  # type: ignore[arg-type]
