"""``send_batched`` on the embedded broker: a record for ``every_partition`` (the Postgres
source's truncate) lands once in each partition, in the transaction's order there, and
only if the transaction commits."""

from __future__ import annotations

import pytest

from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.batched_send import Outgoing, send_batched, send_page
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


async def test_a_page_lands_where_send_batched_puts_each_record_in_order(
    kafka_broker: EmbeddedBroker,
) -> None:
    """``send_page`` (the snapshot workers' page of one topic) partitions by key as
    ``send_batched`` does, keeps the page's order per partition across full batches, and
    sends a keyless page to partition 0."""
    bootstrap = kafka_broker.bootstrap_servers
    await create_topic(bootstrap, "page", 3)
    await create_topic(bootstrap, "batched", 3)
    await create_topic(bootstrap, "keyless", 3)
    p = producer(bootstrap, "send-page-test", max_batch_size=4096)  # several batches each
    keys = [b'{"id":%d}' % i for i in range(500)]
    values = [b"v%d" % i + b"x" * (i % 50) for i in range(500)]
    headers = [("h", b"1")]
    await p.start()
    try:
        await p.begin_transaction()
        sent = await send_page(p, "page", keys, values, headers)
        batched = await send_batched(
            p, [Outgoing("batched", None, k, v, headers) for k, v in zip(keys, values, strict=True)]
        )
        sent += await send_page(p, "keyless", [None, None], [b"a", b"b"], headers)
        for b in [*sent, *batched]:
            await b.future
        await p.commit_transaction()
    finally:
        await stop_quietly(p)
    assert len(sent) > 4  # full batches went out on the way
    assert sorted(i for b in sent[:-1] for i in b.members) == list(range(500))
    page, reference = await _seen(bootstrap, "page"), await _seen(bootstrap, "batched")
    assert {p: [v for v, _ in vs] for p, vs in page.items()} == {
        p: [v for v, _ in vs] for p, vs in reference.items()
    }
    assert all(h == [("h", b"1")] for vs in page.values() for _, h in vs)
    assert {p: [v for v, _ in vs] for p, vs in (await _seen(bootstrap, "keyless")).items()} == {
        0: [b"a", b"b"]
    }
