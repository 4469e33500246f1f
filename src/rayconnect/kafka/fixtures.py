"""pytest fixtures: embedded tansu brokers (a pytest plugin, see tests/conftest.py).

Function scope: a broker starts in ~10-50 ms, and the memory storage engine only grows,
so a fresh broker per test is both cheap and keeps tests independent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rayconnect.kafka.embedded import EmbeddedBroker, EmbeddedKafka


@pytest.fixture
def kafka_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """One running broker (cluster id ``local``); log in the test's tmp_path."""
    with EmbeddedBroker("local", log_dir=tmp_path / "kafka") as broker:
        yield broker


@pytest.fixture
def kafka_clusters(tmp_path: Path) -> Iterator[EmbeddedKafka]:
    """Two independent single-broker clusters, ``c0`` and ``c1``."""
    with EmbeddedKafka(["c0", "c1"], log_dir=tmp_path / "kafka") as clusters:
        yield clusters
