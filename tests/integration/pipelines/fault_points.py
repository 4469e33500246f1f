"""Fault points for tests, installed in a test module's Ray workers from outside the package
(``runtime_env``'s ``worker_process_setup_hook``: ``ray_with_fault_points``): the package
holds no test code, and a fault still fires in the actor process where it matters.

``die_between_tables``: while the file named by ``MARKER_ENV`` exists, a routed sink's round
that commits more than one route table stops its coordinator's process right after the
first table's commit landed (``tables.table_set`` commits the first table alone, then the
others) - and removes the file, so the restarted coordinator goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

MARKER_ENV = "RAYCONNECT_TEST_DIE_BETWEEN_TABLES"
HERE = Path(__file__).resolve().parent

log = logging.getLogger(__name__)


def die_between_tables() -> None:
    """The worker setup hook: wrap the round's and each table's commit (a no-op unless the
    marker's environment variable is set)."""
    marker = os.environ.get(MARKER_ENV)
    if not marker:
        return
    from rayconnect.tables.base import TableCommitter
    from rayconnect.tables.table_set import TableSet

    state = threading.local()
    commit_round, commit = TableSet.commit_round, TableCommitter.commit

    def round_of_tables(self: TableSet, round_commit: Any) -> int:
        state.tables = len({f.table for f in round_commit.files if f.table is not None})
        try:
            return commit_round(self, round_commit)
        finally:
            state.tables = 0

    def one_table(self: TableCommitter, *args: Any, **kwargs: Any) -> int:
        version = commit(self, *args, **kwargs)
        if getattr(state, "tables", 0) > 1 and os.path.exists(marker):
            os.remove(marker)
            log.error("dying between the tables of a round (a test's fault point)")
            os._exit(1)
        return version

    TableSet.commit_round = round_of_tables  # type: ignore[method-assign]
    TableCommitter.commit = one_table  # type: ignore[method-assign]


@contextlib.contextmanager
def ray_with_fault_points(marker: Path) -> Iterator[None]:
    """A local Ray (as the ``ray_session`` fixture starts it) whose workers have the fault
    points, armed by ``marker``'s existence. The marker's name and this folder reach the
    workers through the environment they inherit from the raylet, not through the runtime
    environment: Java workers (Spark's executors) of a job whose runtime environment sets
    env vars die at start (``spark_bridge/java.py``)."""
    from ray_tmp import cleaned_ray_tmp  # (tests/integration: not on the workers' path)

    saved = {name: os.environ.get(name) for name in (MARKER_ENV, "PYTHONPATH")}
    os.environ[MARKER_ENV] = str(marker)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), saved["PYTHONPATH"]) if p
    )
    try:
        with cleaned_ray_tmp():
            ray.init(
                namespace="rayconnect",
                log_to_driver=False,
                include_dashboard=True,
                runtime_env={"worker_process_setup_hook": "fault_points.die_between_tables"},
            )
            try:
                yield
            finally:
                ray.shutdown()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
