"""The aiokafka fixes of rayconnect.kafka.compat, against the real embedded broker.

Each fix has a test that the scenario works with it and one that the same scenario fails
without it (``compat.disabled(<fix>)``), so a fix that stops being needed (or stops
working) shows up here. The clients are rayconnect's (``compat.own``): the fixes apply to
no other (tests/integration/kafka/test_plain_aiokafka_clients.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, ProducerFenced, UnknownError
from aiokafka_only import read

from rayconnect.kafka import compat
from rayconnect.kafka.admin import create_topic, high_watermarks
from rayconnect.kafka.embedded import EmbeddedBroker

TOPIC = "txn"


@pytest.fixture
async def bootstrap(kafka_broker: EmbeddedBroker) -> str:
    compat.apply()
    await create_topic(kafka_broker.bootstrap_servers, TOPIC, 2)
    return kafka_broker.bootstrap_servers


@contextlib.asynccontextmanager
async def _producer(bootstrap: str, **kwargs: object) -> AsyncIterator[AIOKafkaProducer]:
    producer = compat.own(AIOKafkaProducer(bootstrap_servers=bootstrap, **kwargs))
    await producer.start()
    try:
        yield producer
    finally:
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            await asyncio.wait_for(producer.stop(), 5)


async def _send_txn(producer: AIOKafkaProducer, values: list[str], commit: bool) -> None:
    """One transaction over both partitions, committed or aborted."""
    await producer.begin_transaction()
    for i, v in enumerate(values):
        await producer.send(TOPIC, v.encode(), partition=i % 2)
    await producer.flush()
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()


async def _read(
    bootstrap: str,
    isolation_level: str,
    *,
    until: dict[int, int] | None = None,
    duration: float = 0.0,
    timeout: float = 10.0,
) -> list[str]:
    """Values of TOPIC from the beginning: until each partition's position reaches
    ``until`` (all transactions decided -> the LSO is the high watermark), or for
    ``duration`` seconds when records are expected to be held back."""
    got = await read(
        bootstrap,
        TOPIC,
        2,
        isolation_level,
        until,
        duration if until is None else timeout,
        mark=compat.own,
    )
    values = [v for partition in sorted(got["values"]) for v in got["values"][partition]]
    if until is not None and any(got["positions"][p] < off for p, off in until.items()):
        raise AssertionError(f"read did not reach {until} in {timeout}s: {values}")
    return values


# --------------------------------------------------------------------------------------
# a. InitProducerId v3
# --------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
async def test_transactional_producer_commits_and_aborts(bootstrap: str) -> None:
    async with _producer(bootstrap, transactional_id="t-a") as producer:
        await _send_txn(producer, ["c1", "c2"], commit=True)
        await _send_txn(producer, ["a1", "a2"], commit=False)
        async with producer.transaction():
            await producer.send_and_wait(TOPIC, b"c3", partition=0)
    hw = await high_watermarks(bootstrap, TOPIC)
    # data + one control marker per transaction and partition touched
    assert hw == {0: 3 + 3, 1: 2 + 2}
    assert sorted(await _read(bootstrap, "read_uncommitted", until=hw)) == [
        "a1",
        "a2",
        "c1",
        "c2",
        "c3",
    ]


@pytest.mark.timeout(60)
async def test_idempotent_producer_works(bootstrap: str) -> None:
    async with _producer(bootstrap, enable_idempotence=True) as producer:
        await producer.send_and_wait(TOPIC, b"i1", partition=1)
    assert await _read(bootstrap, "read_committed", until={1: 1}) == ["i1"]


@pytest.mark.timeout(60)
async def test_transactional_producer_fails_without_init_producer_id_fix(bootstrap: str) -> None:
    with compat.disabled("init_producer_id"):
        producer = compat.own(
            AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="t-a0")
        )
        try:
            with pytest.raises(KafkaError):  # tansu rejects v0: UnknownError
                await asyncio.wait_for(producer.start(), 10)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5)


# --------------------------------------------------------------------------------------
# c. read_committed from control markers
# --------------------------------------------------------------------------------------


async def _commit_abort_commit(bootstrap: str) -> dict[int, int]:
    async with _producer(bootstrap, transactional_id="t-c") as producer:
        await _send_txn(producer, [f"c1-{i}" for i in range(50)], commit=True)
        await _send_txn(producer, [f"a1-{i}" for i in range(50)], commit=False)
        await _send_txn(producer, [f"c2-{i}" for i in range(7)], commit=True)
        await _send_txn(producer, [f"a2-{i}" for i in range(3)], commit=False)
    return await high_watermarks(bootstrap, TOPIC)


COMMITTED = sorted([f"c1-{i}" for i in range(50)] + [f"c2-{i}" for i in range(7)])


@pytest.mark.timeout(60)
async def test_read_committed_sees_exactly_the_committed_records(bootstrap: str) -> None:
    hw = await _commit_abort_commit(bootstrap)
    values = await _read(bootstrap, "read_committed", until=hw)
    assert sorted(values) == COMMITTED  # exact: no aborted record, no duplicate


@pytest.mark.timeout(60)
async def test_read_committed_leaks_aborted_records_without_fix(bootstrap: str) -> None:
    hw = await _commit_abort_commit(bootstrap)
    with compat.disabled("read_committed"):
        values = await _read(bootstrap, "read_committed", until=hw)
    leaked = [v for v in values if v.startswith("a")]
    assert len(leaked) == 53, "tansu now sends aborted_transactions? then fix c is obsolete"


@pytest.mark.timeout(60)
async def test_open_transaction_holds_back_later_records(bootstrap: str) -> None:
    async with (
        _producer(bootstrap, transactional_id="t-open") as slow,
        _producer(bootstrap, transactional_id="t-fast") as fast,
    ):
        await slow.begin_transaction()
        for i in range(4):
            await slow.send(TOPIC, f"open-{i}".encode(), partition=i % 2)
        await slow.flush()
        await _send_txn(fast, [f"later-{i}" for i in range(6)], commit=True)

        # the open transaction comes first on both partitions: nothing may pass it
        assert await _read(bootstrap, "read_committed", duration=1.0) == []
        assert len(await _read(bootstrap, "read_uncommitted", duration=1.0)) == 10

        await slow.abort_transaction()
    hw = await high_watermarks(bootstrap, TOPIC)
    expected = [f"later-{i}" for i in range(6)]
    assert sorted(await _read(bootstrap, "read_committed", until=hw)) == expected
    with compat.disabled("read_committed"):
        leaked = await _read(bootstrap, "read_committed", until=hw)
    assert sorted(leaked) == sorted(expected + [f"open-{i}" for i in range(4)])


# --------------------------------------------------------------------------------------
# b. PRODUCER_FENCED (and fencing as a whole)
# --------------------------------------------------------------------------------------


async def _fence(bootstrap: str) -> tuple[BaseException, list[str]]:
    """A zombie writes in a transaction, a new producer with its id takes over; returns
    the error of the zombie's next send and what read_committed shows afterwards."""
    zombie = compat.own(
        AIOKafkaProducer(
            bootstrap_servers=bootstrap, transactional_id="t-fence", request_timeout_ms=3000
        )
    )
    await zombie.start()
    try:
        await zombie.begin_transaction()
        await zombie.send_and_wait(TOPIC, b"zombie-1", partition=0)
        async with _producer(bootstrap, transactional_id="t-fence") as successor:
            with pytest.raises(KafkaError) as send_error:
                await asyncio.wait_for(zombie.send_and_wait(TOPIC, b"zombie-2", partition=0), 10)
            # tansu closes the zombie's connection on EndTxn instead of answering: we
            # only require that the commit does not succeed
            with pytest.raises((KafkaError, asyncio.TimeoutError)):
                await asyncio.wait_for(zombie.commit_transaction(), 1.5)
            async with successor.transaction():
                await successor.send_and_wait(TOPIC, b"successor", partition=0)
    finally:
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            await asyncio.wait_for(zombie.stop(), 5)
    hw = await high_watermarks(bootstrap, TOPIC)
    return send_error.value, await _read(bootstrap, "read_committed", until=hw)


@pytest.mark.timeout(60)
async def test_fenced_producer_gets_producer_fenced_and_its_data_stays_invisible(
    bootstrap: str,
) -> None:
    error, visible = await _fence(bootstrap)
    assert isinstance(error, ProducerFenced) and isinstance(error, compat.FENCED_ERRORS)
    assert isinstance(error, compat.ProducerFencedError) and error.errno == 90
    assert visible == ["successor"]


@pytest.mark.timeout(60)
async def test_fenced_producer_gets_unknown_error_without_fix(bootstrap: str) -> None:
    with compat.disabled("producer_fenced"):
        error, visible = await _fence(bootstrap)
    assert type(error) is UnknownError and not isinstance(error, ProducerFenced)
    assert visible == ["successor"]
