"""Test-wide set-up: embedded-broker fixtures, and the ``integration`` mark by folder.

Every test under ``tests/integration/`` uses real parts (broker, Ray, Spark, tables) and is
marked ``integration`` here, so a file cannot forget the mark and slip into the fast suite
(``pytest -m "not integration"``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["fixtures.kafka"]

INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)
