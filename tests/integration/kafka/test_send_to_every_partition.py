"""``send_batched`` on the embedded broker: a record for ``every_partition`` (the Postgres
source's truncate) lands once in each partition, in the transaction's order there, and
only if the transaction commits."""

from __future__ import annotations

import pytest

from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.batched_send import Outgoing, send_batched
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.kafka.read_back import read_to_high_watermarks
from rayconnect.kafka.transactions import producer, stop_quietly
from rayconnect.protocol.truncate_marker import PARTITION_TRUNCATE_HEADERS

pytestmark = [pytest.mark.timeout(60)]


async def _seen(bootstrap: str, topic: str) -> dict[int, list[tuple[bytes, list]]]:
    by_partition: dict[int, list[tuple[bytes, list]]] = {}
    async for r in read_to_high_watermarks(bootstrap, topic, "read_committed"):
        by_partition.setdefault(r.partition, []).append((r.value, list(r.headers)))
    return by_partition


async def test_an_every_partition_record_is_one_copy_per_partition_in_the_transaction(
    kafka_broker: EmbeddedBroker,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    await create_topic(bootstrap, "t", 3)
    p = producer(bootstrap, "batched-send-test")
    await p.start()
    try:
        marker = Outgoing("t", None, None, b"truncate", list(PARTITION_TRUNCATE_HEADERS), True)
        before = [Outgoing("t", n, None, b"before", None) for n in range(3)]
        after = [Outgoing("t", n, None, b"after", None) for n in range(3)]
        for commit in (False, True):
            await p.begin_transaction()
            batches = await send_batched(p, [*before, marker, *after])
            for b in batches:
                await b.future
            await (p.commit_transaction() if commit else p.abort_transaction())
        # (members: which of the records given a batch holds - the marker in one each)
        assert sorted(i for b in batches for i in b.members).count(3) == 3
    finally:
        await stop_quietly(p)
    copy = (b"truncate", list(PARTITION_TRUNCATE_HEADERS))
    assert await _seen(bootstrap, "t") == {
        n: [(b"before", []), copy, (b"after", [])] for n in range(3)
    }
