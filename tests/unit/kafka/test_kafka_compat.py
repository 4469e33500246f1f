"""rayconnect.kafka.compat without a broker: request versions, the marker scan, fetch pacing.

The embedded broker never returns a transaction cut before its marker (it respects the
LSO and ignores fetch size limits), so the hold-back path of fix c is proven here on
hand-built record batches, like a Kafka fetch response would carry them.
"""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.consumer.fetcher import READ_COMMITTED, READ_UNCOMMITTED
from aiokafka.errors import BrokerResponseError, ProducerFenced, for_code
from aiokafka.protocol.transaction import InitProducerIdRequest_v0
from aiokafka.record.memory_records import MemoryRecords
from aiokafka_probes import in_sender
from kafka_batches import ABORT, COMMIT, DECIDED, batch, marker

from rayconnect.kafka import aiokafka_hooks, compat
from rayconnect.kafka.compat import (
    InitProducerIdRequest_v3,
    InitProducerIdRequestCompat,
    MarkerAwarePartitionRecords,
)

# aiokafka's own class: the package import (conftest plugin) has already patched the name
PartitionRecords = aiokafka_hooks.ORIGINAL_PARTITION_RECORDS
pytestmark = pytest.mark.timeout(30)

TP = TopicPartition("t", 0)


def _read(cls: type, data: bytes, aborted: list | None, isolation: int) -> tuple[list, int]:
    records = cls(TP, MemoryRecords(data), aborted, 0, None, None, False, isolation)
    return [(r.offset, r.value) for r in records], records.next_fetch_offset


def test_aborted_transaction_dropped_from_markers() -> None:
    got, next_offset = _read(MarkerAwarePartitionRecords, DECIDED, [], READ_COMMITTED)
    assert got == [(0, b"c"), (5, b"plain")] and next_offset == 6
    leaked, _ = _read(PartitionRecords, DECIDED, [], READ_COMMITTED)
    assert (2, b"a1") in leaked  # what aiokafka alone hands out


def test_undecided_transaction_is_held_back_with_everything_after_it() -> None:
    # 6-7 txn of pid 3 with no marker yet; 8 a plain record after it; 9 pid 1 again, decided
    data = (
        DECIDED
        + batch(6, 3, [b"u1", b"u2"])
        + batch(8, -1, [b"after"], txn=False)
        + batch(9, 1, [b"c2"])
        + marker(10, 1, COMMIT)
    )
    got, next_offset = _read(MarkerAwarePartitionRecords, data, [], READ_COMMITTED)
    assert got == [(0, b"c"), (5, b"plain")]
    assert next_offset == 6  # the next fetch starts at the undecided transaction
    leaked, _ = _read(PartitionRecords, data, [], READ_COMMITTED)
    assert (6, b"u1") in leaked  # aiokafka alone would hand out the undecided records

    # the next fetch, once the marker is there: delivered if committed...
    later = data[len(DECIDED) :] + marker(11, 3, COMMIT)
    records = MarkerAwarePartitionRecords(
        TP, MemoryRecords(later), [], 6, None, None, False, READ_COMMITTED
    )
    assert [r.value for r in records] == [b"u1", b"u2", b"after", b"c2"]
    # ...and dropped if aborted
    aborted = data[len(DECIDED) :] + marker(11, 3, ABORT)
    records = MarkerAwarePartitionRecords(
        TP, MemoryRecords(aborted), [], 6, None, None, False, READ_COMMITTED
    )
    assert [r.value for r in records] == [b"after", b"c2"]


def test_same_producer_commit_then_abort_in_one_fetch() -> None:
    data = (
        batch(0, 7, [b"x1"])
        + marker(1, 7, COMMIT)
        + batch(2, 7, [b"x2"])
        + batch(3, 7, [b"x3"])
        + marker(4, 7, ABORT)
        + batch(5, 7, [b"x4"])
        + marker(6, 7, COMMIT)
    )
    got, next_offset = _read(MarkerAwarePartitionRecords, data, None, READ_COMMITTED)
    assert [v for _, v in got] == [b"x1", b"x4"] and next_offset == 7


@pytest.mark.parametrize(
    ("aborted", "isolation"),
    [([(2, 2)], READ_COMMITTED), ([], READ_UNCOMMITTED), (None, READ_UNCOMMITTED)],
)
def test_noop_when_broker_sends_aborted_list_or_read_uncommitted(
    aborted: list | None, isolation: int
) -> None:
    data = DECIDED + batch(6, 3, [b"undecided"])
    ours = _read(MarkerAwarePartitionRecords, data, aborted, isolation)
    theirs = _read(PartitionRecords, data, aborted, isolation)
    assert ours == theirs


def test_init_producer_id_version_follows_api_versions() -> None:
    req = InitProducerIdRequestCompat("tid", 60_000)
    v3 = req.prepare({22: (0, 4)})
    assert isinstance(v3, InitProducerIdRequest_v3)
    assert (v3.producer_id, v3.producer_epoch) == (-1, -1)
    assert v3.FLEXIBLE_VERSION
    assert isinstance(req.prepare({22: (0, 2)}), InitProducerIdRequest_v0)
    assert isinstance(
        InitProducerIdRequestCompat(None, 1).prepare({22: (0, 1)}), InitProducerIdRequest_v0
    )
    # a nullable transactional id (idempotent producer) encodes as compact null
    assert InitProducerIdRequestCompat(None, 1).prepare({22: (3, 3)}).encode()[:1] == b"\x00"


async def test_error_code_90_maps_to_a_fenced_error() -> None:
    """For a rayconnect producer (in its sender, where aiokafka maps error codes)."""

    async def code_90() -> type:
        producer = compat.own(AIOKafkaProducer(bootstrap_servers="127.0.0.1:9"))
        in_start, in_task = await in_sender(producer, lambda _: for_code(90))
        assert in_start is in_task
        return in_start

    compat.apply()
    err = await code_90()
    assert issubclass(err, ProducerFenced) and issubclass(err, BrokerResponseError)
    assert str(err()).startswith("[Error 90]")
    with compat.disabled("producer_fenced"):
        assert not issubclass(await code_90(), ProducerFenced)
    assert await code_90() is err


def test_apply_is_idempotent_and_disabled_restores() -> None:
    import aiokafka.consumer.fetcher as fetcher
    import aiokafka.producer.sender as sender

    compat.apply()
    compat.apply()
    assert compat.is_applied()
    with compat.disabled():
        assert compat.applied_fixes() == frozenset()
        assert fetcher.PartitionRecords is PartitionRecords
        assert sender.InitProducerIdRequest is not InitProducerIdRequestCompat
        with compat.disabled("read_committed"):
            pass
        assert compat.applied_fixes() == frozenset()
    assert compat.is_applied()
    assert fetcher.PartitionRecords is compat._partition_records
    assert sender.InitProducerIdRequest is compat._init_producer_id_request
    with pytest.raises(ValueError):
        compat.apply("nope")


class _Fetcher:
    """What fix d reads and sets on aiokafka's Fetcher."""

    def __init__(self, wait_ms: int) -> None:
        self._fetch_max_wait_ms = wait_ms


def test_fetch_pacing_widens_while_held_and_narrows_back_once_nothing_is() -> None:
    other = TopicPartition("t", 1)
    fetcher = _Fetcher(50)
    waits = []
    for tp, held in [(TP, True), (TP, True), (other, True), (TP, False), (TP, True)] + [
        (TP, True)
    ] * 5:
        compat._pace(fetcher, tp, held)
        waits.append(fetcher._fetch_max_wait_ms)
    assert waits == [100, 200, 400, 400, 800, 1000, 1000, 1000, 1000, 1000]
    compat._pace(fetcher, TP, held=False)
    assert fetcher._fetch_max_wait_ms == 1000  # `other` is still held: unchanged
    compat._pace(fetcher, other, held=False)
    assert fetcher._fetch_max_wait_ms == 500  # none held: halves back per fetch, never below 50
    for _ in range(6):
        compat._pace(fetcher, TP, held=False)
    assert fetcher._fetch_max_wait_ms == 50


def test_fetch_pacing_keeps_a_wait_longer_than_its_ceiling() -> None:
    fetcher = _Fetcher(5000)
    compat._pace(fetcher, TP, held=True)
    assert fetcher._fetch_max_wait_ms == 5000
    compat._pace(fetcher, TP, held=False)
    assert fetcher._fetch_max_wait_ms == 5000
