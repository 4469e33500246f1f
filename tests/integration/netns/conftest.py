"""Fixtures for tests across test hosts (network namespaces, tests/fixtures/netns.py): the
broker and the object store on host ``store``, a Ray head in the root namespace (the
driver's), and two worker nodes on hosts of their own - ``control`` (the coordinator,
enumerator and writer with Spark's master) and ``ingest`` (the readers and participant
hosts). Each has one CPU, so the one Spark executor can run on either node: a lost node
leaves room for it on the other. Skipped, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures.netns import TestNetwork, network_or_skip
from fixtures.netns_ray import NetnsRayCluster
from ray_tmp import cleaned_ray_tmp

import rayconnect as rc
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.storage.embedded_s3 import EmbeddedS3

#: Ray worker hosts -> CPUs; ``store`` runs no Ray.
WORKERS: dict[str, int] = {"control": 1, "ingest": 1}


@pytest.fixture(scope="module")
def net() -> Iterator[TestNetwork]:
    with network_or_skip(["store", *WORKERS]) as network:
        yield network


@pytest.fixture(scope="module")
def store_s3(net: TestNetwork) -> Iterator[EmbeddedS3]:
    store = net["store"]
    with EmbeddedS3(host=store.ip, launch_prefix=store.command()) as s3:
        yield s3


@pytest.fixture(scope="module")
def store_broker(net: TestNetwork, tmp_path_factory: pytest.TempPathFactory):
    store = net["store"]
    log_dir = tmp_path_factory.mktemp("kafka")
    with EmbeddedBroker("local", log_dir, host=store.ip, launch_prefix=store.command()) as broker:
        yield broker


@pytest.fixture(scope="module")
def hosts_cluster(net: TestNetwork) -> Iterator[NetnsRayCluster]:
    with cleaned_ray_tmp() as root:
        cluster = NetnsRayCluster(net, root, WORKERS)
        try:
            yield cluster.start()
        finally:
            cluster.stop()


@pytest.fixture(scope="module")
def hosts_table(store_s3: EmbeddedS3) -> rc.DeltaSink:
    bucket = store_s3.new_bucket("netns")
    return rc.DeltaSink(f"s3://{bucket}/table", storage_options=store_s3.storage_options)
