"""The embedded tansu launcher and the admin helpers, against real broker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAlreadyExistsError

from rayconnect.kafka.admin import create_topic, high_watermarks, produce_demo_records
from rayconnect.kafka.embedded import (
    BrokerStartError,
    EmbeddedBroker,
    EmbeddedKafka,
    _api_versions_ok,
    embedded_cluster,
)


def _pid_gone(pid: int) -> bool:
    """Dead or a zombie (a container's PID 1 may never reap re-parented children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _pid_gone(pid):
            return True
        time.sleep(0.05)
    return _pid_gone(pid)


async def _list_topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await admin.list_topics()
    finally:
        await admin.close()


@pytest.mark.timeout(30)
def test_start_stop_and_log_kept(tmp_path: Path) -> None:
    broker = EmbeddedBroker("solo", log_dir=tmp_path)
    broker.start()
    try:
        pid = broker.pid
        assert pid is not None and broker.running
        host, port = broker.bootstrap_servers.split(":")
        assert host == "127.0.0.1" and int(port) == broker.port
        assert _api_versions_ok(host, int(port))
        assert broker.log_path.parent == tmp_path
    finally:
        broker.stop()
    assert not broker.running
    assert _wait_gone(pid, 5)
    broker.stop()  # idempotent
    log = broker.log_path.read_text()
    assert "listening on" in log and broker.bootstrap_servers.split(":")[1] in log


@pytest.mark.timeout(30)
def test_context_manager_and_fixture(kafka_broker: EmbeddedBroker) -> None:
    assert kafka_broker.running
    with EmbeddedBroker() as other:
        assert other.bootstrap_servers != kafka_broker.bootstrap_servers
        pid = other.pid
    assert pid is not None and _wait_gone(pid, 5)


@pytest.mark.timeout(30)
def test_start_failure_reports_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-tansu"
    fake.write_text("#!/bin/sh\necho 'boom: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))
    with pytest.raises(BrokerStartError, match="boom: cannot start"):
        EmbeddedBroker("bad", log_dir=tmp_path).start()


@pytest.mark.timeout(60)
async def test_two_clusters_are_independent(kafka_clusters: EmbeddedKafka) -> None:
    c0, c1 = kafka_clusters["c0"], kafka_clusters["c1"]
    assert len(kafka_clusters) == 2 and c0.bootstrap_servers != c1.bootstrap_servers
    assert set(kafka_clusters.bootstrap_servers) == {"c0", "c1"}
    await create_topic(c0.bootstrap_servers, "only-on-c0", 2)
    await produce_demo_records(c0.bootstrap_servers, "only-on-c0", 10)
    assert "only-on-c0" in await _list_topics(c0.bootstrap_servers)
    assert "only-on-c0" not in await _list_topics(c1.bootstrap_servers)
    # the same name on c1 is a different topic with its own data
    await create_topic(c1.bootstrap_servers, "only-on-c0", 2)
    assert await high_watermarks(c1.bootstrap_servers, "only-on-c0") == {0: 0, 1: 0}
    assert await high_watermarks(c0.bootstrap_servers, "only-on-c0") == {0: 5, 1: 5}


@pytest.mark.timeout(30)
def test_embedded_cluster_ids(tmp_path: Path) -> None:
    with embedded_cluster(3, log_dir=tmp_path) as kafka:
        assert [b.cluster_id for b in kafka] == ["c0", "c1", "c2"]
        pids = [b.pid for b in kafka]
        assert len({b.port for b in kafka}) == 3
    assert all(p is not None and _wait_gone(p, 5) for p in pids)
    with pytest.raises(ValueError):
        EmbeddedKafka(["a", "a"])


@pytest.mark.timeout(30)
def test_broker_started_from_short_lived_thread_survives_it(tmp_path: Path) -> None:
    """PDEATHSIG follows the forking thread: a thread that exits must not kill the broker."""
    broker = EmbeddedBroker("threaded", log_dir=tmp_path)
    t = threading.Thread(target=broker.start)
    t.start()
    t.join()
    try:
        time.sleep(0.3)
        assert broker.running
        assert _api_versions_ok("127.0.0.1", broker.port)
    finally:
        broker.stop()


_PARENT = textwrap.dedent(
    """
    import sys, threading, time
    from rayconnect.kafka.embedded import EmbeddedBroker
    b = EmbeddedBroker("orphan-test", log_dir=sys.argv[1])
    if sys.argv[2] == "thread":
        t = threading.Thread(target=b.start); t.start(); t.join()
    else:
        b.start()
    print(b.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["main", "thread"])
def test_no_orphan_when_parent_is_sigkilled(tmp_path: Path, where: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path), where],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        broker_pid = int(line)
        assert not _pid_gone(broker_pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert _wait_gone(broker_pid, 5), f"tansu {broker_pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@pytest.mark.timeout(60)
async def test_admin_helpers_exact_counts(kafka_broker: EmbeddedBroker) -> None:
    bs = kafka_broker.bootstrap_servers
    await create_topic(bs, "demo", 3)
    with pytest.raises(TopicAlreadyExistsError):
        await create_topic(bs, "demo", 3)
    await create_topic(bs, "demo", 3, exist_ok=True)
    assert await high_watermarks(bs, "demo") == {0: 0, 1: 0, 2: 0}

    seen: list[int] = []
    counts = await produce_demo_records(bs, "demo", 25_001, progress=seen.append)
    assert counts == {0: 8334, 1: 8334, 2: 8333}
    assert seen[-1] == 25_001 and seen == sorted(seen) and len(seen) >= 3
    # linger + 64 KB batches put many records in a batch: the fetch high watermark is
    # exact where tansu's ListOffsets(latest) would not be
    assert await high_watermarks(bs, "demo") == counts

    more = await produce_demo_records(bs, "demo", 4, 2, start_index=25_001)
    assert more == {0: 2, 1: 2}  # indices 25001..25004 -> partitions 1,0,1,0 of 2
    assert await high_watermarks(bs, "demo") == {0: 8336, 1: 8336, 2: 8333}

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bs, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tps = [TopicPartition("demo", p) for p in range(3)]
        consumer.assign(tps)
        keys: dict[str, int] = {}
        while sum([await consumer.position(tp) for tp in tps]) < 25_005:
            batch = await consumer.getmany(timeout_ms=500)
            for tp, records in batch.items():
                for r in records:
                    key = r.key.decode()
                    keys[key] = keys.get(key, 0) + 1
                    value = json.loads(r.value)
                    assert value["key"] == key and len(r.value) == 200
                    if value["id"] < 25_001:
                        assert tp.partition == value["id"] % 3
    finally:
        await consumer.stop()
    assert len(keys) == 25_005 and set(keys.values()) == {1}
    assert set(keys) == {f"key-{i}" for i in range(25_005)}
