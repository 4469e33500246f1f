"""aiokafka clients for your own code that work against the embedded broker as against Kafka.

Why this exists: aiokafka 0.14 cannot start an idempotent (``enable_idempotence=True``) or
transactional (``transactional_id=...``) producer against tansu, the embedded broker - its
InitProducerId request fails with ``UnknownError`` - and its ``read_committed`` consumers see
records of aborted transactions there. rayconnect fixes both inside aiokafka
(:mod:`rayconnect.kafka.compat`; each fix is a no-op against Apache Kafka), for the clients
it builds only: a plain ``AIOKafkaProducer``/``AIOKafkaConsumer`` gets aiokafka unfixed, even
in a process that imported rayconnect. :func:`producer` and :func:`consumer` make the choice
explicit: they install the fixes in the calling process and return aiokafka clients marked
to get them (``compat.own``), so code written against the embedded broker runs unchanged
against a real Kafka.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from rayconnect.kafka import compat

__all__ = ["consumer", "producer"]


def producer(bootstrap_servers: str, **settings: Any) -> AIOKafkaProducer:
    """An ``AIOKafkaProducer`` (``settings``: its keyword arguments, e.g.
    ``enable_idempotence=True`` or ``transactional_id="..."``), with rayconnect's aiokafka
    fixes installed in this process first and applied to it. Start and stop it as any aiokafka
    producer."""
    compat.apply()
    return compat.own(AIOKafkaProducer(bootstrap_servers=bootstrap_servers, **settings))


def consumer(*topics: str, bootstrap_servers: str, **settings: Any) -> AIOKafkaConsumer:
    """An ``AIOKafkaConsumer`` of ``topics`` (``settings``: its keyword arguments, e.g.
    ``isolation_level="read_committed"``), with rayconnect's aiokafka fixes installed in this
    process first and applied to it: on the embedded broker a read_committed consumer then
    skips aborted transactions as it does on Kafka."""
    compat.apply()
    return compat.own(AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap_servers, **settings))
