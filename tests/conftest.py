"""Test-wide set-up: embedded-broker fixtures, and the ``integration`` mark by folder.

Every test under ``tests/integration/`` uses real parts (broker, Ray, Spark, tables) and is
marked ``integration`` here, so a file cannot forget the mark and slip into the fast suite
(``pytest -m "not integration"``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest_plugins = ["fixtures.kafka", "fixtures.postgres"]

INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave with pytest's exit status once everything is reported, without the
    interpreter's teardown. Seen once in CI: 676 passed, then a segfault at exit (139). The
    cause, reproduced since (bench/results/exit_crashes.md): tests read tables with
    deltalake's default Python filesystem, whose files arrow's IO threads read and free with
    the GIL; one doing so during finalization is ended by pthread_exit, and the unwind kills
    the process (139, 134) or hangs it. rayconnect itself reads through pyarrow's native
    filesystems (``rayconnect.storage.delta_reads``); until every test does too, the test
    process skips the teardown. Every fixture has already cleaned up (Ray shut down, brokers
    and S3 stopped) when this runs."""
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


_EXIT_STATUS = pytest.StashKey[int]()
