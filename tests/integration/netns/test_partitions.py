"""A sink pipeline across test hosts (network namespaces) through real network faults.

The broker and the object store on host ``store``; the coordinator, enumerator and writer
(Spark's master with them) on Ray node ``control``; the readers and participant hosts on Ray
node ``ingest``; the Ray head and the driver in the root namespace. One pipeline for the
module, in order; after each fault the table must hold exactly the produced records, with
the committed offsets equal to what was produced.

Faults (what the kernel allows, shared/notes/network.md): a slow link (``tbf``), a one-way
cut (a blackhole route), a partition between the coordinator's node and the readers' node
that heals after 30 s, and the coordinator's node cut from the head long enough for Ray to
declare it dead: a new coordinator claims the table while the old one lives on, cut off,
on the far side - it must be fenced, and nothing duplicated. Longer variants (a link down
past Ray's node timeout, a longer slow link) are in the ``slow`` group.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.netns_ray import ROLES_ON_HOSTS, NetnsRayCluster
from sink_checks import Produced, assert_exactly_once, caught_up, commit_history, pipeline

import rayconnect as rc
from rayconnect.cli import chaos

NAME = "hosts"
TOPIC = "orders"
PARTITIONS = 4
#: fault -> seconds from its end (the heal) until every produced record was committed.
RECOVERY: dict[str, float] = {}


class Running:
    def __init__(self, produced: Produced, handle: Any, sink: rc.DeltaSink) -> None:
        self.produced, self.handle, self.sink = produced, handle, sink


@pytest.fixture(scope="module")
def running(hosts_cluster, store_broker, hosts_table) -> Iterator[Running]:
    produced = Produced(store_broker.bootstrap_servers, TOPIC, PARTITIONS)
    produced.more(2000)
    handle = pipeline(
        NAME,
        store_broker.bootstrap_servers,
        TOPIC,
        hosts_table,
        commit_interval_s=1,
        write_timeout_s=20,
        spark=rc.SparkSettings(
            executors=1, executor_memory="512MB", executor_wait_s=60, executor_lost_s=30
        ),
        placement=ROLES_ON_HOSTS,
    ).start(timeout_s=240)
    try:
        handle.wait_for(caught_up(produced), timeout_s=120)
        yield Running(produced, handle, hosts_table)
    finally:
        print("\nrecovery (fault healed -> every produced record committed):")
        for fault, seconds in RECOVERY.items():
            print(f"  {fault:<28} {seconds:6.1f} s")
        handle.stop(commit=False, timeout_s=30)


def _through(running: Running, cluster: NetnsRayCluster, fault: str, seconds: float):
    """The fault just injected lasts ``seconds`` while 2000 records are produced; then
    every fault is healed and everything must be committed exactly once."""
    try:
        running.produced.more(2000)
        time.sleep(seconds)
    finally:
        cluster.net.heal()
    return _all_committed_after(running, fault, time.monotonic())


def _all_committed_after(running: Running, fault: str, healed_at: float, timeout_s: float = 180):
    status = running.handle.wait_for(caught_up(running.produced), timeout_s=timeout_s)
    RECOVERY[fault] = time.monotonic() - healed_at
    assert_exactly_once(running.sink, running.produced, status)
    return status


@pytest.mark.timeout(420)  # with the module's set-up: hosts, Ray nodes, Spark
def test_roles_run_on_their_hosts(hosts_cluster: NetnsRayCluster, running: Running):
    placed = hosts_cluster.actors(NAME)
    print("\nplacement:", placed, "nodes:", hosts_cluster.alive_nodes())
    for role in ("coordinator", "enumerator", "writer"):
        assert placed[f"{NAME}/{role}"] == "control", placed
    assert {n for k, n in placed.items() if "/reader/" in k or "/participants/" in k} == {"ingest"}
    nodes = hosts_cluster.alive_nodes()
    assert nodes["control"] == hosts_cluster.net["control"].ip
    assert nodes["ingest"] == hosts_cluster.net["ingest"].ip
    assert_exactly_once(running.sink, running.produced, running.handle.status())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slow_link_to_the_readers_node(hosts_cluster: NetnsRayCluster, running: Running):
    """``ingest``'s link limited to 1 Mbit/s both ways: records cross it twice (broker ->
    readers -> writer) and still commit, exactly once."""
    ingest = hosts_cluster.net["ingest"]
    ingest.slow("1mbit")
    slowed_at = time.monotonic()
    try:
        running.produced.more(3000)
        _all_committed_after(running, "3000 records over 1 Mbit/s", slowed_at, 150)
    finally:
        ingest.fast()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_one_way_cut_from_the_readers_node_to_the_store(
    hosts_cluster: NetnsRayCluster, running: Running
):
    """What ``ingest`` sends to the store is dropped for 10 s (the store's packets still
    arrive): readers and participants lose the broker; records produced meanwhile are read
    once it heals."""
    hosts_cluster.net["ingest"].drop_to(hosts_cluster.net["store"])
    _through(running, hosts_cluster, "one-way cut ingest->store 10 s", 10)


@pytest.mark.timeout(300)
def test_a_partition_between_the_coordinator_and_the_readers_heals_after_30_s(
    hosts_cluster: NetnsRayCluster, running: Running
):
    """``control`` and ``ingest`` cannot reach each other for 30 s (each still reaches the
    head and the store, so Ray declares no node dead): rounds stall - nothing the readers
    hold reaches the writer - and resume once it heals."""
    control, ingest = hosts_cluster.net["control"], hosts_cluster.net["ingest"]
    before = running.handle.status()
    control.partition_from(ingest)
    status = _through(running, hosts_cluster, "control<->ingest 30 s", 30)
    assert set(hosts_cluster.alive_nodes()) == {"head", "control", "ingest"}
    print(f"\nepoch {before['epoch']} -> {status['epoch']}, txn {before['txn_id']} -> "
          f"{status['txn_id']}")  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_readers_node_unplugged_past_rays_node_timeout(
    hosts_cluster: NetnsRayCluster, running: Running
):
    """``ingest``'s link down for 20 s: Ray declares the node dead (~5 s) and restarts the
    readers and participants on ``control``; when the link comes back the old raylet learns
    it was declared dead and exits; the node is then started again."""
    ingest = hosts_cluster.net["ingest"]
    ingest.link_down()
    try:
        running.produced.more(2000)
        hosts_cluster.wait_for_nodes(2, timeout_s=60)
        time.sleep(15)
    finally:
        ingest.link_up()
    _all_committed_after(running, "ingest link down 20 s", time.monotonic(), 240)
    ingest.kill_all()
    hosts_cluster.add("ingest")
    hosts_cluster.wait_for_nodes(3)
    running.produced.more(1000)
    _all_committed_after(running, "after ingest added back", time.monotonic())


@pytest.mark.timeout(300)
def test_a_coordinator_cut_off_from_the_head_is_fenced_by_its_successor(
    hosts_cluster: NetnsRayCluster, running: Running
):
    """``control`` loses the head (and the driver) but still reaches the store and
    ``ingest``: Ray declares its node dead after ~5 s and restarts the coordinator, the
    enumerator and the writer on ``ingest``; the new coordinator claims the table with a
    newer epoch while the old one lives on behind the cut, still reaching the store and the
    participants. Nothing it does may land: no commit of the old epoch after the claim, the
    table exact. (Last in the module: ``control`` stays dead.)"""
    control = hosts_cluster.net["control"]
    epoch = running.handle.status()["epoch"]
    zombie = chaos.actor_pid(f"{NAME}/coordinator")
    control.cut_from_root()
    cut_at = time.monotonic()
    try:
        running.produced.more(2000)
        running.handle.wait_for(lambda s: s["epoch"] > epoch, timeout_s=90)
        RECOVERY["control cut: new coordinator"] = time.monotonic() - cut_at
        assert Path(f"/proc/{zombie}").exists(), "the old coordinator lives behind the cut"
        # It may learn it is fenced when its round times out (write_timeout_s: its
        # participants follow the new epoch) and it reads the table; Ray ends a worker cut
        # off from the GCS after 60 s on its own. Whatever it does meanwhile must not land.
        time.sleep(max(0.0, 30 - (time.monotonic() - cut_at)))
        zombie_alive = Path(f"/proc/{zombie}").exists()
        fenced = _log_lines(hosts_cluster, zombie, f"epoch {epoch} fenced by epoch")
    finally:
        control.heal()
    status = _all_committed_after(running, "control cut from head 30 s", time.monotonic())
    assert status["epoch"] > epoch
    history = commit_history(running.sink)
    claimed = min(h["version"] for h in history if h.get("rayconnect.epoch") == str(epoch + 1))
    late = [
        h for h in history if h["version"] > claimed and h.get("rayconnect.epoch") == str(epoch)
    ]
    assert late == []  # nothing the old epoch tried after the claim was committed
    print(
        f"\nthe old coordinator (pid {zombie}) alive behind the cut 30 s after it: "
        f"{zombie_alive}; its log says it was fenced: {fenced or 'no (not within the cut)'}"
    )


def _log_lines(cluster: NetnsRayCluster, pid: int, text: str) -> list[str]:
    """Lines saying ``text`` in the logs of the Ray worker process ``pid`` (every node's
    logs are on this machine's one disk)."""
    found = []
    for log in cluster.temp_root.glob(f"ray/session_*/logs/*{pid}*"):
        if log.is_file():
            found += [line for line in log.read_text(errors="replace").splitlines() if text in line]
    return found
