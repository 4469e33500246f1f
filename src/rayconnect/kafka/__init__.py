"""Kafka side of rayconnect: aiokafka helpers, broker compatibility, the embedded broker.

Importing this package installs :mod:`rayconnect.kafka.compat`'s hooks (four aiokafka fixes
that are no-ops against Apache Kafka). They act only for the clients rayconnect builds
(``compat.own``); any other aiokafka client in the process runs aiokafka's code unchanged.
It is done at import, not left to callers, because the hooks are per process: every Ray
worker that builds a rayconnect Kafka client must have them, and forgetting them fails
silently (aborted records leak to read_committed readers).
"""

from rayconnect.kafka import compat

compat.apply()

__all__ = ["compat"]
