"""A Ray cluster of several nodes on this machine (``ray.cluster_utils.Cluster``): each node
a raylet with its own object store and worker processes, named by the Ray node label
``node`` so a pipeline's placement can pin roles to nodes and a test knows which to remove.

Used by the multi-node tests (tests/integration/multinode) and bench/placement.py.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import ray
from ray.cluster_utils import Cluster
from ray.util.state import list_actors
from ray_tmp import cleaned_ray_tmp

OBJECT_STORE_BYTES = 200 * 1024 * 1024
#: Ray declares a node dead after this many missed health checks, one a second: ~5 s after a
#: node is removed instead of Ray's default ~15 s (3 s x 5), so the node-loss tests spend
#: their time on rayconnect's recovery, not on Ray's detector. What follows the detection is
#: the same; a production cluster adds those ~10 s to every figure measured here.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _no_shared_address_file() -> Iterator[None]:
    """``Cluster`` writes (and on shutdown deletes) /tmp/ray/ray_current_cluster, which every
    ``ray.init()`` on the machine then connects to: other test runs would join this cluster,
    or lose the file of their own ``ray start``."""
    with (
        mock.patch.object(ray._private.utils, "write_ray_address", lambda *a, **k: None),
        mock.patch.object(ray._common.utils, "reset_ray_address", lambda *a, **k: None),
    ):
        yield


class LocalCluster:
    """The cluster, its worker nodes by name, and where the actors run."""

    def __init__(self, cluster: Cluster, dashboard: str, cpus: dict[str, int]) -> None:
        self.cluster = cluster
        self.dashboard = dashboard
        self.cpus = cpus  # worker name -> CPUs
        self.nodes: dict[str, Any] = {}  # worker name -> ray._private.node.Node

    def add(self, name: str) -> str:
        """Start worker ``name`` (again, after it was removed); returns its node id. Each
        worker has its own loopback address (127.0.0.2, ...), as each machine of a real
        cluster has its own: Ray's ``node:<ip>`` resource then names one node."""
        with _no_shared_address_file():
            node = self.cluster.add_node(
                num_cpus=self.cpus[name],
                node_ip_address=f"127.0.0.{2 + list(self.cpus).index(name)}",
                labels={"node": name},
                object_store_memory=OBJECT_STORE_BYTES,
            )
        self.nodes[name] = node
        return node.node_id

    def remove(self, name: str) -> None:
        """Kill every process of node ``name`` at once (raylet, workers, JVMs): SIGKILL."""
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def name_of(self, node_id: str) -> str:
        if node_id == self.cluster.head_node.node_id:
            return "head"
        return next((n for n, node in self.nodes.items() if node.node_id == node_id), node_id)

    def actors(self) -> list[tuple[str, str, str, str]]:
        """(actor name, class, node name, state) of every actor not dead."""
        found = list_actors(address=self.dashboard, limit=10_000, raise_on_missing_output=False)
        return [
            (a.name, a.class_name, self.name_of(a.node_id) if a.node_id else "-", a.state)
            for a in found
            if a.state != "DEAD"
        ]

    def placement(self, pipeline: str) -> dict[str, str]:
        """Alive actor -> node name: the pipeline's named actors, the Spark executors
        (RayDP's ``RayDPExecutor`` actors, keyed ``executor/<n>``), RayDP's master actor
        (``spark/master``) and the app master JVM actor that owns the executors
        (``spark/app-master``)."""
        out: dict[str, str] = {}
        executors = 0
        for name, class_name, node, state in sorted(self.actors()):
            if state != "ALIVE":
                continue
            if name.startswith(f"{pipeline}/"):
                out[name] = node
            elif class_name.endswith("RayDPExecutor"):
                out[f"executor/{executors}"] = node
                executors += 1
            elif class_name.endswith("RayDPSparkMaster"):
                out["spark/master"] = node
            elif class_name.endswith("RayAppMaster"):
                out["spark/app-master"] = node
        return out

    def wait_for_dashboard(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.actors()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


@contextlib.contextmanager
def local_cluster(workers: dict[str, int]) -> Iterator[LocalCluster]:
    """A head (no CPUs: only the driver, and actors placed there) and ``workers`` (name ->
    CPUs); the driver is connected (namespace rayconnect). Everything the cluster left under
    /tmp/ray is removed at the end."""
    with cleaned_ray_tmp():
        dashboard_port = _free_port()
        with _no_shared_address_file():
            cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 0,
                    "labels": {"node": "head"},
                    "object_store_memory": OBJECT_STORE_BYTES,
                    "include_dashboard": True,
                    "dashboard_host": "127.0.0.1",
                    "dashboard_port": dashboard_port,
                    "_system_config": HEALTH_CHECKS,
                },
            )
        try:
            local = LocalCluster(cluster, f"http://127.0.0.1:{dashboard_port}", workers)
            for name in workers:
                local.add(name)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, namespace="rayconnect", log_to_driver=False)
            local.wait_for_dashboard()
            yield local
        finally:
            ray.shutdown()
            with _no_shared_address_file():
                cluster.shutdown()
