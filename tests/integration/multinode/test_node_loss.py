"""A sink pipeline spread over the nodes of a Ray cluster, and whole nodes removed from
under it mid-round (``Cluster.remove_node``: raylet, actors and Spark JVMs SIGKILLed at once).

One cluster and one pipeline for the module, in order (each test leaves the cluster and the
pipeline for the next): the actors start where the placement pins them; then the node of
the readers, the participant host and one Spark executor is removed, then the node of the
coordinator and the writer (with RayDP's masters), each while records flow and a round
holds uncommitted data. After each, Ray restarts the lost actors on the nodes left; the
table must hold exactly the produced records, with the committed offsets equal to the high
watermarks, and the writer must be back to its two executors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sink_checks import (
    Produced,
    assert_exactly_once,
    caught_up,
    pipeline,
    produce_into_an_open_round,
)

import rayconnect as rc

pytestmark = [pytest.mark.multinode]

NAME = "spread"
TOPIC = "orders"
PARTITIONS = 4
EXECUTORS = 2
#: Where each role starts (soft: a lost node's actors restart anywhere).
PINNED = rc.Placement(
    prefer={
        "reader": {"node": "spark1"},
        "participant": {"node": "spark1"},
        "coordinator": {"node": "control"},
        "enumerator": {"node": "control"},
        "writer": {"node": "control"},
    }
)
#: removed node -> seconds from the removal until all was committed / until the writer had
#: its executors again.
RECOVERY: dict[str, tuple[float, float]] = {}


class Running:
    """The module's pipeline, what was produced into it, and its handle."""

    def __init__(self, produced: Produced, handle: Any, sink: rc.DeltaSink) -> None:
        self.produced, self.handle, self.sink = produced, handle, sink
        self.seen: set[str] = set()  # the writer's problems the last node loss showed


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
        commit_interval_s=1,
        write_timeout_s=20,
        flush_max_records=1500,
        commit_when_drained=False,  # rounds stay open for the interval: kills land in them
        spark=rc.SparkSettings(
            executors=EXECUTORS,
            executor_memory="768MB",
            executor_wait_s=60,
            executor_lost_s=45,
            start="with_pipeline",  # executors on the nodes that are lost
        ),
        placement=PINNED,
    ).start(timeout_s=240)
    try:
        handle.wait_for(caught_up(produced), timeout_s=120)
        yield Running(produced, handle, sink_table)
    finally:
        print("\nrecovery (node removed -> every produced record committed / executors back):")
        for node, (committed, executors) in RECOVERY.items():
            print(f"  {node:<8} {committed:6.1f} s {executors:6.1f} s")
        handle.stop(commit=False)


def _lose_node_mid_round(ray_cluster, running: Running, node: str) -> dict[str, str]:
    """Produce, remove ``node`` while a round holds uncommitted records, produce more, wait
    until everything is committed and the writer has all its executors; check the table
    exactly. Returns the placement after."""
    produced, handle = running.produced, running.handle
    print(f"\nbefore removing {node}: {ray_cluster.placement(NAME)}")
    app = handle.status().writer.app_name
    before = produce_into_an_open_round(handle, produced, 3000)
    removed_at = time.monotonic()
    ray_cluster.remove(node)
    produced.more(2000)
    seen: set[str] = set()  # what the status said about Spark on the way

    def all_committed(s: dict[str, Any]) -> bool:
        seen.add(str(s.writer.problem or s.writer.error or "ok"))
        return caught_up(produced)(s)

    status = handle.wait_for(all_committed, timeout_s=240)
    committed_s = time.monotonic() - removed_at
    writer = handle.wait_for(
        lambda s: s.writer.executors == EXECUTORS and not s.writer.problem,
        timeout_s=180,
    )["writer"]
    RECOVERY[node] = (committed_s, time.monotonic() - removed_at)
    print(
        f"\n{node} removed in round {before['txn_id']} ({before['state']}): all committed "
        f"{committed_s:.1f} s later, {EXECUTORS} executors {RECOVERY[node][1]:.1f} s later"
    )
    print(f"writer status seen: {sorted(seen)}")
    assert_exactly_once(running.sink, produced, status)
    running.seen = seen
    # Rounds commit while a restarted writer's Spark still starts (written in the writer
    # process): RayDP's executors may come up after everything is committed. Keep records
    # flowing - Spark writes them once it is up - until the executors are there.
    deadline = time.monotonic() + 180
    while True:
        after = ray_cluster.placement(NAME)
        executors = [k for k in after if k.startswith("executor/")]
        if len(executors) == EXECUTORS or time.monotonic() > deadline:
            break
        produced.more(200)
        time.sleep(3)
    status = handle.wait_for(caught_up(produced), timeout_s=120)
    assert_exactly_once(running.sink, produced, status)
    spark = "same Spark" if writer.app_name == app else "writer restarted Spark"
    print(f"after ({spark}): {after}\nwriter: {writer}")
    assert node not in after.values()
    assert len([k for k in after if k.startswith("executor/")]) == EXECUTORS
    return after


def _roles_on(placement: dict[str, str], node: str) -> set[str]:
    """Roles with an actor on ``node``: coordinator, reader, ..., executor, spark."""
    return {
        name.split("/")[1] if name.startswith(f"{NAME}/") else name.split("/")[0]
        for name, n in placement.items()
        if n == node
    }


@pytest.mark.timeout(300)
def test_actors_start_where_the_placement_puts_them(ray_cluster, running):
    """Readers and participants on spark1; the coordinator, enumerator and writer, and
    RayDP's master and app master (which own the executors) on the control node; one Spark
    executor on each spark node: files come from two nodes."""
    placed = ray_cluster.placement(NAME)
    print("\nplacement:", placed)
    assert {placed[n] for n in placed if "/reader/" in n or "/participants/" in n} == {"spark1"}
    assert len([n for n in placed if "/reader/" in n]) == 2
    assert len([n for n in placed if "/participants/" in n]) == 1  # one host: 4 partitions
    for role in (f"{NAME}/coordinator", f"{NAME}/enumerator", f"{NAME}/writer", "spark/master"):
        assert placed[role] == "control", role
    assert placed["spark/app-master"] == "control"
    assert sorted(placed[n] for n in placed if n.startswith("executor/")) == ["spark1", "spark2"]
    status = running.handle.status()
    assert status.writer.executors == EXECUTORS and status.writer.problem is None
    assert_exactly_once(running.sink, running.produced, status)


@pytest.mark.timeout(480)
def test_losing_the_node_of_the_readers_participants_and_an_executor(ray_cluster, running):
    assert _roles_on(ray_cluster.placement(NAME), "spark1") == {
        "reader",
        "participants",
        "executor",
    }
    after = _lose_node_mid_round(ray_cluster, running, "spark1")
    # The lost executor was reported until RayDP (or a Spark restart) replaced it.
    assert any(p.startswith(f"degraded: 1 of {EXECUTORS}") for p in running.seen), running.seen
    assert len([n for n in after if "/participants/" in n]) == 1
    assert len([n for n in after if "/reader/" in n]) == 2


@pytest.mark.timeout(480)
def test_losing_the_node_of_the_coordinator_and_writer(ray_cluster, running):
    placed = ray_cluster.placement(NAME)
    assert {"coordinator", "enumerator", "writer", "spark"} <= _roles_on(placed, "control")
    epoch = running.handle.status()["epoch"]
    after = _lose_node_mid_round(ray_cluster, running, "control")
    assert running.handle.status()["epoch"] > epoch  # a new coordinator claimed the table
    for role in ("coordinator", "enumerator", "writer"):
        assert f"{NAME}/{role}" in after
