"""Fixtures for tests on a Ray cluster of several nodes on this machine
(tests/integration/local_cluster.py).

Only the ``spark*`` nodes have CPUs: the Spark executors (1 CPU each, in a SPREAD placement
group) can only land there, one per node, so two nodes write files; spark2's second CPU is
the room a lost executor (or a restarted Spark's group) needs once spark1 is gone.
rayconnect's own actors take no CPU and go wherever their placement sends them. The head
(the driver's node) cannot be removed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from local_cluster import LocalCluster, local_cluster

import rayconnect as rc
from rayconnect.kafka.embedded import EmbeddedBroker

#: The worker nodes: name (also its label ``node``) -> CPUs.
WORKERS: dict[str, int] = {"ingest": 0, "control": 0, "spark1": 1, "spark2": 2}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LocalCluster]:
    """The head and ``WORKERS``, the driver connected; removed with its files at the end."""
    with local_cluster(WORKERS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def sink_table(tmp_path_factory: pytest.TempPathFactory) -> rc.DeltaSink:
    """Where the pipeline's table lives: the ONE place to move these tests' table (e.g. to
    the embedded S3 store). A local path works here only because every node of this test
    cluster shares this machine's disk."""
    return rc.DeltaSink(str(tmp_path_factory.mktemp("multinode") / "table"))


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One broker (cluster id ``local``) for the module's one long-running pipeline."""
    with EmbeddedBroker("local", log_dir=tmp_path_factory.mktemp("kafka")) as broker:
        yield broker
