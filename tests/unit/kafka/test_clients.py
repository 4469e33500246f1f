"""``rayconnect.kafka.clients``: a user's aiokafka client gets the embedded-broker fixes in its
own process, whatever was installed before (the Getting started recipe's producer relies on
it; that the fixes are needed and work is proven in tests/integration/kafka)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from rayconnect.kafka import compat
from rayconnect.kafka.clients import consumer, producer


async def test_a_producer_and_a_consumer_install_the_fixes_first() -> None:
    for make, kind in (
        (lambda: producer("127.0.0.1:9", enable_idempotence=True), AIOKafkaProducer),
        (lambda: consumer("t", bootstrap_servers="127.0.0.1:9"), AIOKafkaConsumer),
    ):
        with compat.disabled():
            assert not compat.applied_fixes()
            client = make()
            assert compat.is_applied()
        assert isinstance(client, kind)
    assert compat.is_applied()
