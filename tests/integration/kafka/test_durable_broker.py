"""The durable embedded broker: tansu's S3 engine on the embedded S3 keeps the log through a
SIGKILL, and the broker comes back on the same port (clients reconnect where they were)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from aiokafka.errors import KafkaTimeoutError

from rayconnect.kafka.admin import create_topic, high_watermarks, produce_demo_records
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.kafka.read_back import read_topic


@pytest.mark.timeout(120)
def test_records_survive_a_sigkill_and_the_port_is_kept(durable_broker: EmbeddedBroker) -> None:
    bootstrap, port = durable_broker.bootstrap_servers, durable_broker.port
    asyncio.run(create_topic(bootstrap, "kept", 3))
    counts = asyncio.run(produce_demo_records(bootstrap, "kept", 3000, 3))
    before = asyncio.run(read_topic(bootstrap, "kept", "read_uncommitted"))
    assert len(before) == 3000

    old_pid = durable_broker.pid
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    os.waitpid(old_pid, 0)
    assert not durable_broker.running
    durable_broker.start()

    assert durable_broker.pid != old_pid and durable_broker.port == port
    assert asyncio.run(high_watermarks(bootstrap, "kept")) == counts
    after = asyncio.run(read_topic(bootstrap, "kept", "read_uncommitted"))
    assert sorted(after) == sorted(before)
    assert len({key for key, _ in after}) == 3000

    # and it keeps taking writes after the restart, offsets continuing from the old log
    more = asyncio.run(produce_demo_records(bootstrap, "kept", 300, 3, start_index=3000))
    marks = asyncio.run(high_watermarks(bootstrap, "kept"))
    assert marks == {p: counts[p] + more[p] for p in counts}


@pytest.mark.timeout(60)
def test_memory_broker_restart_keeps_the_port_but_not_the_log(
    kafka_broker: EmbeddedBroker,
) -> None:
    bootstrap, port = kafka_broker.bootstrap_servers, kafka_broker.port
    asyncio.run(create_topic(bootstrap, "lost", 1))
    asyncio.run(produce_demo_records(bootstrap, "lost", 10, 1))
    kafka_broker.restart()
    assert kafka_broker.port == port and kafka_broker.running
    with pytest.raises(KafkaTimeoutError, match="not found"):
        asyncio.run(high_watermarks(bootstrap, "lost", timeout=3))
