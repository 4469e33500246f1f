"""A sink pipeline spread over the nodes of a Ray cluster, and whole nodes removed from
under it mid-round (``Cluster.remove_node``: raylet, actors and Spark JVMs SIGKILLed at once).

One cluster and one pipeline for the module, in order (each test leaves the cluster and the
pipeline for the next): the actors start where the placement pins them, then the node of
the readers and participants, a node of the Spark executors and the node of the coordinator
(and writer) are removed in turn while records flow and a round holds uncommitted data.
After each, Ray restarts the lost actors on the nodes left, and the table must hold exactly
the produced records, with the committed offsets equal to the high watermarks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from sink_checks import Produced, assert_exactly_once, caught_up, pipeline

import rayconnect as rc
from rayconnect.actors import names

pytestmark = [pytest.mark.multinode]

NAME = "spread"
TOPIC = "orders"
PARTITIONS = 4
#: Where each role starts (soft: a lost node's actors restart anywhere).
PINNED = rc.Placement(
    prefer={
        "reader": {"node": "ingest"},
        "participant": {"node": "ingest"},
        "coordinator": {"node": "control"},
        "enumerator": {"node": "control"},
        "writer": {"node": "control"},
    }
)
RECOVERY: dict[str, float] = {}  # removed node -> seconds until all was committed again


class Running:
    """The module's pipeline, what was produced into it, and its handle."""

    def __init__(self, produced: Produced, handle: Any, sink: rc.DeltaSink) -> None:
        self.produced, self.handle, self.sink = produced, handle, sink


@pytest.fixture(scope="module")
def running(ray_cluster, module_broker, sink_table) -> Iterator[Running]:
    produced = Produced(module_broker.bootstrap_servers, TOPIC, PARTITIONS)
    produced.more(4000)
    handle = pipeline(
        NAME,
        module_broker.bootstrap_servers,
        TOPIC,
        sink_table,
        source={"readers_per_cluster": 2},
        commit_interval_s=2,
        write_timeout_s=20,
        flush_max_records=1500,
        spark=rc.SparkSettings(executors=2, executor_memory="768MB"),
        placement=PINNED,
    ).start(timeout_s=240)
    try:
        handle.wait_for(caught_up(produced), timeout_s=120)
        yield Running(produced, handle, sink_table)
    finally:
        print("\nrecovery (node removed -> every produced record committed):")
        for node, seconds in RECOVERY.items():
            print(f"  {node:<8} {seconds:6.1f} s")
        handle.stop(commit=False)


def _lose_node_mid_round(ray_cluster, running: Running, node: str) -> dict[str, str]:
    """Produce, remove ``node`` while a round holds uncommitted records, produce more, wait
    until everything is committed; check the table exactly. Returns the placement after."""
    produced, handle = running.produced, running.handle
    print(f"\nbefore removing {node}: {ray_cluster.placement(NAME)}")
    app = _spark_app()
    produced.more(3000)
    time.sleep(1.0)  # the round is open and holds data: remove the node now
    before = handle.status()
    assert any(before["offsets"].get(k, 0) < n for k, n in produced.offsets().items()), (
        "nothing was in flight when the node was removed"
    )
    removed_at = time.monotonic()
    ray_cluster.remove(node)
    produced.more(2000)
    status = handle.wait_for(caught_up(produced), timeout_s=240)
    RECOVERY[node] = time.monotonic() - removed_at
    print(
        f"\n{node} removed in state {before['state']!r}: all committed {RECOVERY[node]:.1f} s later"
    )
    assert_exactly_once(running.sink, produced, status)
    after = ray_cluster.placement(NAME)
    spark = "same Spark" if _spark_app() == app else "writer restarted Spark"
    print(f"after ({spark}): {after}")
    assert node not in after.values()
    return after


def _roles_on(placement: dict[str, str], node: str) -> set[str]:
    """Roles with an actor on ``node``: coordinator, reader, ..., executor."""
    return {
        name.split("/")[1] if name.startswith(f"{NAME}/") else name.split("/")[0]
        for name, n in placement.items()
        if n == node
    }


def _spark_app() -> str:
    """The writer's Spark application (a new one each time the writer restarted Spark)."""
    writer = ray.get_actor(names.writer(NAME), namespace=names.NAMESPACE)
    return ray.get(writer.stats.remote(), timeout=60)["app_name"]


@pytest.mark.timeout(420)
def test_actors_start_where_the_placement_puts_them(ray_cluster, running):
    """Readers and participants on the ingest node, the coordinator, enumerator and writer
    on the control node, one Spark executor on each spark node: files come from two nodes."""
    placed = ray_cluster.placement(NAME)
    print("\nplacement:", placed)
    assert {placed[n] for n in placed if "/reader/" in n or "/participant/" in n} == {"ingest"}
    assert len([n for n in placed if "/reader/" in n]) == 2
    assert len([n for n in placed if "/participant/" in n]) == PARTITIONS
    for role in ("coordinator", "enumerator", "writer"):
        assert placed[f"{NAME}/{role}"] == "control"
    assert sorted(placed[n] for n in placed if n.startswith("executor/")) == ["spark1", "spark2"]
    assert_exactly_once(running.sink, running.produced, running.handle.status())


@pytest.mark.timeout(420)
def test_losing_the_node_of_the_readers_and_participants(ray_cluster, running):
    assert _roles_on(ray_cluster.placement(NAME), "ingest") == {"reader", "participant"}
    after = _lose_node_mid_round(ray_cluster, running, "ingest")
    assert len([n for n in after if "/participant/" in n]) == PARTITIONS
    assert len([n for n in after if "/reader/" in n]) == 2


@pytest.mark.timeout(420)
def test_losing_a_node_of_the_spark_executors(ray_cluster, running):
    placed = ray_cluster.placement(NAME)
    assert "executor" in _roles_on(placed, "spark1")
    assert not _roles_on(placed, "spark1") & {"coordinator", "writer"}
    _lose_node_mid_round(ray_cluster, running, "spark1")
    executors = [n for k, n in ray_cluster.placement(NAME).items() if k.startswith("executor/")]
    assert len(executors) == 2  # RayDP (or a restarted writer) replaced the lost one
    ray_cluster.add("spark1")  # room for a new Spark's two bundles after the next loss


@pytest.mark.timeout(420)
def test_losing_the_node_of_the_coordinator_and_writer(ray_cluster, running):
    placed = ray_cluster.placement(NAME)
    assert {"coordinator", "enumerator", "writer"} <= _roles_on(placed, "control")
    epoch = running.handle.status()["epoch"]
    after = _lose_node_mid_round(ray_cluster, running, "control")
    assert running.handle.status()["epoch"] > epoch  # a new coordinator claimed the table
    for role in ("coordinator", "enumerator", "writer"):
        assert f"{NAME}/{role}" in after
