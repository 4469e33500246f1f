"""Shape rule: a plain aiokafka client in a process that imported rayconnect behaves as
without it; the aiokafka fixes (``rayconnect.kafka.compat``, and the reader's fetch hooks in
``kafka.arrow_fetch``) apply to the clients rayconnect builds only.

Each test drives the code aiokafka runs - the producer's sender routine, the consumer's fetch
response handling - through whatever rayconnect hooked, for a plain client and for one of
rayconnect's, and compares the plain one with aiokafka's original code on the same input.
(The same against a real broker, compared with a process that never imported rayconnect:
tests/integration/kafka/test_plain_aiokafka_clients.py.)
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import aiokafka.consumer.fetcher as fetcher_module
import aiokafka.errors
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.producer.sender import InitPIDHandler
from aiokafka.protocol.transaction import InitProducerIdRequest_v0
from aiokafka_probes import fetch, in_sender
from kafka_batches import DECIDED, batch

import rayconnect  # noqa: F401 - the point: imported, and nothing changes for plain clients
import rayconnect.kafka  # noqa: F401
from rayconnect.kafka import aiokafka_hooks, arrow_fetch, clients, compat, transactions
from rayconnect.kafka.compat import InitProducerIdRequest_v3, ProducerFencedError

pytestmark = pytest.mark.timeout(30)

BOOTSTRAP = "127.0.0.1:9"  # never connected to
SRC = Path(rayconnect.__file__).parent

# 0-1: a transaction of producer 3 with no marker yet (open); 2: a plain record after it
OPEN_AT_0 = batch(0, 3, [b"u1", b"u2"]) + batch(2, -1, [b"after"], txn=False)


def _values(records: object) -> list[bytes]:
    return [] if records is None else [r.value for r in records]  # type: ignore[attr-defined]


def _init_pid_and_code_90(sender: object) -> tuple[object, type]:
    """What the sender's handlers get: the InitProducerId request, the class of code 90."""
    return InitPIDHandler(sender).create_request(), aiokafka.errors.for_code(90)


async def test_a_plain_producer_builds_aiokafkas_requests_and_errors() -> None:
    assert compat.is_applied()  # the hooks are installed in this process
    plain = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, transactional_id="plain")
    ours = clients.producer(BOOTSTRAP, transactional_id="ours")
    assert not compat.owns(plain) and compat.owns(ours)

    for request, code_90 in await in_sender(plain, _init_pid_and_code_90):
        assert type(request) is aiokafka_hooks.ORIGINAL_INIT_PRODUCER_ID_REQUEST
        assert isinstance(request.prepare({22: (0, 4)}), InitProducerIdRequest_v0)  # v0 only
        assert code_90 is aiokafka.errors.UnknownError  # aiokafka's answer: no class for 90

    for request, code_90 in await in_sender(ours, _init_pid_and_code_90):
        v3 = request.prepare({22: (0, 4)})
        assert isinstance(v3, InitProducerIdRequest_v3)
        assert (v3.producer_id, v3.producer_epoch) == (-1, -1)
        assert code_90 is ProducerFencedError
    # outside any rayconnect producer, code 90 is aiokafka's again
    assert aiokafka.errors.for_code(90) is aiokafka.errors.UnknownError
    assert 90 not in aiokafka.errors.kafka_errors  # aiokafka's table is not touched


async def test_a_plain_consumer_is_not_held_back_by_an_open_transaction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reported stall: a user's read_committed consumer over a transaction with no
    marker yet got nothing ("transaction at offset 0 has no COMMIT/ABORT marker ... holding
    it back") where aiokafka alone hands the records out (tansu sends no aborted list)."""
    tp = TopicPartition("scope-open", 0)
    plain = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, isolation_level="read_committed")
    caplog.set_level(logging.DEBUG, logger="rayconnect.kafka.compat")

    records, fetcher = await fetch(plain, tp, OPEN_AT_0, high_watermark=3, last_stable_offset=3)
    assert type(records) is aiokafka_hooks.ORIGINAL_PARTITION_RECORDS
    assert fetcher._fetch_max_wait_ms == 50  # not paced
    aiokafkas, _ = await fetch(
        AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, isolation_level="read_committed"),
        tp,
        OPEN_AT_0,
        high_watermark=3,
        last_stable_offset=3,
        original=True,
    )
    assert _values(records) == _values(aiokafkas) == [b"u1", b"u2", b"after"]
    assert not caplog.records

    ours = clients.consumer(bootstrap_servers=BOOTSTRAP, isolation_level="read_committed")
    records, fetcher = await fetch(ours, tp, OPEN_AT_0, high_watermark=3, last_stable_offset=3)
    assert type(records) is compat.MarkerAwarePartitionRecords
    assert _values(records) == [] and records.next_fetch_offset == 0  # held back (fix c)
    assert fetcher._fetch_max_wait_ms == 100  # paced (fix d)
    assert "holding it back" in caplog.text


async def test_a_plain_consumer_reads_what_aiokafka_reads_of_an_aborted_transaction() -> None:
    tp = TopicPartition("scope-aborted", 0)

    def consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, isolation_level="read_committed")

    plain, _ = await fetch(consumer(), tp, DECIDED, high_watermark=6, last_stable_offset=6)
    aiokafkas, _ = await fetch(
        consumer(), tp, DECIDED, high_watermark=6, last_stable_offset=6, original=True
    )
    assert _values(plain) == _values(aiokafkas) == [b"c", b"a1", b"a2", b"plain"]
    ours, _ = await fetch(
        compat.own(consumer()), tp, DECIDED, high_watermark=6, last_stable_offset=6
    )
    assert _values(ours) == [b"c", b"plain"]


async def test_the_readers_fetch_hooks_leave_plain_consumers_alone() -> None:
    tp = TopicPartition("scope-arrow", 0)
    saved = fetcher_module.PartitionRecords, fetcher_module.MemoryRecords
    try:
        arrow_fetch.install()

        def consumer() -> AIOKafkaConsumer:
            return AIOKafkaConsumer(
                bootstrap_servers=BOOTSTRAP,
                isolation_level="read_committed",
                key_deserializer=arrow_fetch.arrow_columns,
            )

        plain, _ = await fetch(consumer(), tp, DECIDED, high_watermark=6, last_stable_offset=6)
        assert type(plain) is aiokafka_hooks.ORIGINAL_PARTITION_RECORDS
        assert type(plain._records) is aiokafka_hooks.ORIGINAL_MEMORY_RECORDS
        assert _values(plain) == [b"c", b"a1", b"a2", b"plain"]  # records, as aiokafka's

        ours, _ = await fetch(
            compat.own(consumer()), tp, DECIDED, high_watermark=6, last_stable_offset=6
        )
        assert type(ours) is arrow_fetch.ArrowPartitionRecords
        (columns,) = list(ours)  # one RecordColumns for the fetched partition
        assert len(columns) == 2  # c and plain; the aborted ones dropped
    finally:
        fetcher_module.PartitionRecords, fetcher_module.MemoryRecords = saved


async def test_rayconnects_own_builders_mark_their_clients() -> None:
    assert compat.owns(transactions.producer(BOOTSTRAP, "t"))
    assert compat.owns(clients.producer(BOOTSTRAP))
    assert compat.owns(clients.consumer("t", bootstrap_servers=BOOTSTRAP))
    assert not compat.owns(AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP))


CLIENTS = {"AIOKafkaConsumer", "AIOKafkaProducer"}


def _unowned_constructions(tree: ast.AST) -> list[int]:
    """Lines that build an aiokafka producer/consumer neither inside ``compat.own(...)`` nor
    assigned to a name the same function passes to ``compat.own``."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def is_own(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) == "own"

    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in CLIENTS:
            continue
        parent = parents[node]
        if is_own(parent):
            continue
        if isinstance(parent, ast.Assign) and isinstance(parent.targets[0], ast.Name):
            name = parent.targets[0].id
            scope = parent
            while not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                scope = parents[scope]
            if any(
                is_own(n) and any(isinstance(a, ast.Name) and a.id == name for a in n.args)
                for n in ast.walk(scope)
            ):
                continue
        bad.append(node.lineno)
    return bad


def test_every_aiokafka_client_built_in_src_is_marked_as_rayconnects() -> None:
    """Rule: a producer or consumer built anywhere in the package goes through
    ``compat.own`` (so it keeps the fixes it had when they were process-wide)."""
    found, bad = 0, []
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text()
        if not any(c + "(" in source for c in CLIENTS):
            continue
        tree = ast.parse(source)
        found += sum(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in CLIENTS
            for n in ast.walk(tree)
        )
        bad += [f"{path.relative_to(SRC)}:{line}" for line in _unowned_constructions(tree)]
    assert found >= 9  # the rule looks at something
    assert bad == []


def test_the_rule_sees_an_unmarked_client() -> None:
    tree = ast.parse(
        "def f():\n"
        "    a = compat.own(AIOKafkaConsumer())\n"
        "    b = AIOKafkaProducer()\n"
        "    compat.own(b)\n"
        "    c = AIOKafkaProducer()\n"
        "    return AIOKafkaConsumer()\n"
    )
    assert _unowned_constructions(tree) == [5, 6]
