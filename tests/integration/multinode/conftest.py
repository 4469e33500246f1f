"""Fixtures for tests on a Ray cluster of several nodes on this machine
(tests/integration/local_cluster.py).

Only the ``spark*`` nodes have CPUs: the Spark executors (1 CPU each, in a SPREAD placement
group) can only land there, one per node, so two nodes write files; spark2's second CPU is
the room a lost executor (or a restarted Spark's group) needs once spark1 is gone.
rayconnect's own actors take no CPU and go wherever their placement sends them: the readers
and participants to spark1 (so one removal loses them and an executor at once), the
coordinator, enumerator and writer (with RayDP's masters) to ``control``. The head (the
driver's node) cannot be removed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from local_cluster import LocalCluster, local_cluster

import rayconnect as rc
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.storage.embedded_s3 import EmbeddedS3

#: The worker nodes: name (also its label ``node``) -> CPUs.
WORKERS: dict[str, int] = {"control": 0, "spark1": 1, "spark2": 2}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LocalCluster]:
    """The head and ``WORKERS``, the driver connected; removed with its files at the end."""
    with local_cluster(WORKERS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def sink_table(embedded_s3: EmbeddedS3) -> rc.DeltaSink:
    """Where the pipeline's table lives: on the embedded S3, as on a real cluster, so no
    part of the pipeline can lean on the nodes sharing this machine's disk."""
    bucket = embedded_s3.new_bucket("multinode")
    return rc.DeltaSink(f"s3://{bucket}/table", storage_options=embedded_s3.storage_options)


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One broker (cluster id ``local``) for the module's one long-running pipeline."""
    with EmbeddedBroker("local", log_dir=tmp_path_factory.mktemp("kafka")) as broker:
        yield broker
