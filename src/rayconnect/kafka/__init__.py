"""Kafka side of rayconnect: aiokafka helpers, broker compatibility, the embedded broker.

Importing this package applies :mod:`rayconnect.kafka.compat` (three aiokafka fixes that
are no-ops against Apache Kafka). It is done at import, not left to callers, because the
patches are per process: every Ray worker that imports a rayconnect Kafka client must have
them, and forgetting them fails silently (aborted records leak to read_committed readers).
"""

from rayconnect.kafka import compat

compat.apply()

__all__ = ["compat"]
