"""A sink pipeline across test hosts (network namespaces) through real network faults.

The broker and the object store on host ``store``; the coordinator, enumerator and writer
(Spark's master with them) on Ray node ``control``; the readers and participant hosts on Ray
node ``ingest``; the Ray head and the driver in the root namespace. One pipeline for the
module, in order; after each fault the table must hold exactly the produced records, with
the committed offsets equal to what was produced.

Faults (what the kernel allows, shared/notes/network.md): a slow link (``tbf``), a one-way
cut (a blackhole route), a partition between the coordinator's node and the readers' node
that heals after 30 s, and every worker node cut from the head long enough for Ray to
declare them dead: a new coordinator claims the table on the head while the old pipeline
lives on, whole, on the far side, committing a trickle of records round after round - until
its next commit is refused by the table's epoch fence (its own log says so, the refused
round is not in the table), and nothing is duplicated. In the ``slow`` group: the slow link, the one-way cut, a link down past Ray's
node timeout and the coordinator's node alone cut from the head.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.netns_ray import ROLES_ON_HOSTS, NetnsRayCluster
from sink_checks import Produced, assert_exactly_once, caught_up, commit_history, pipeline

import rayconnect as rc
from rayconnect.demo import chaos

NAME = "hosts"
TOPIC = "orders"
PARTITIONS = 4
#: A round of at most this many rows is written by the writer itself, more by a Spark job:
#: the 2000-record bursts go to Spark, the trickle behind the whole cut is written here.
WRITE_HERE_MAX_ROWS = 500
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
            executors=1,
            executor_memory="512MB",
            executor_wait_s=60,
            executor_lost_s=30,
            write_here_max_rows=WRITE_HERE_MAX_ROWS,
            start="with_pipeline",  # Spark's jobs cross the cut too
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_coordinator_cut_off_from_the_head_is_fenced_by_its_successor(
    hosts_cluster: NetnsRayCluster, running: Running
):
    """``control`` loses the head (and the driver) but still reaches the store and
    ``ingest``: Ray declares its node dead after ~5 s and restarts the coordinator, the
    enumerator and the writer on ``ingest``; the new coordinator claims the table with a
    newer epoch while the old one lives on behind the cut, still reaching the store and the
    participants. Nothing it does may land: no commit of the old epoch after the claim, the
    table exact. Its participants follow the new epoch, so its rounds come to nothing (the
    next test cuts the whole pipeline off instead). (``control`` stays dead.)"""
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


@pytest.mark.timeout(480)
def test_a_whole_pipeline_cut_off_from_the_head_is_fenced_by_its_successor(
    hosts_cluster: NetnsRayCluster, running: Running
):
    """Every worker node cut from the head (and the driver) at once, still reaching each
    other and the store: Ray declares them dead (~15 s) and restarts every actor on the
    head, where the new coordinator claims the table with a newer epoch. Behind the cut the
    old pipeline is whole - coordinator, readers, participants, writer - and keeps reading
    what the test produces meanwhile (a trickle: rounds far below ``write_here_max_rows``,
    which the old writer writes in its own process; a Spark job behind the cut fails with
    ``OwnerDiedError``) and committing it, round after round, until the claim. Its next
    commit is refused by the table's fence: its own log must say so (``txn N of epoch E:
    the commit failed (StaleEpochError: ...) and was refused as fenced (table epoch E+1);
    stopping: epoch E fenced by epoch E+1``), that round must not be in the table, and no
    version of the old epoch may follow the claim. Then the cut heals (the cut raylets
    learn they were declared dead and exit), the nodes are started again, and the table
    holds every record exactly once. (Last in the module; after the slow group's
    ``control`` cut, whichever nodes are alive are cut.)"""
    net, sink = hosts_cluster.net, running.sink
    epoch = running.handle.status()["epoch"]
    zombie = chaos.actor_pid(f"{NAME}/coordinator")
    placed = hosts_cluster.actors(NAME)
    workers = list(hosts_cluster.cpus)
    assert placed[f"{NAME}/coordinator"] in workers, placed  # on a worker node, cut below
    refusal = re.compile(
        rf"txn (\d+) of epoch {epoch}: the commit (?:failed|timed out) \((\w+): .*\) and was "
        rf"refused as fenced \(table epoch (\d+)\); stopping: epoch {epoch} fenced by epoch \3$"
    )
    for name in workers:
        net[name].cut_from_root()
    cut_at, cut_wall = time.monotonic(), time.time()
    try:
        # records for the zombie's rounds (the broker is reachable): a trickle, so that it
        # has a round to commit whenever the claim comes
        with _Trickle(running.produced, TRICKLE_RECORDS, TRICKLE_EVERY_S):
            # Ray ends a worker cut off from the GCS after 120 s here (SYSTEM_CONFIG):
            # everything must happen before.
            _wait(lambda: set(hosts_cluster.alive_nodes()) == {"head"}, cut_at + 45, "dead")
            RECOVERY["all cut: nodes declared dead"] = time.monotonic() - cut_at
            claimed = _wait(
                lambda: _claim_after(sink, epoch),
                cut_at + 75,
                "a new claim",
                lambda: f"actors {hosts_cluster.actors(NAME)}",
            )
            RECOVERY["all cut: new coordinator claimed"] = time.monotonic() - cut_at
            refused = _wait(
                lambda: _log_lines(hosts_cluster, zombie, " and was refused as fenced "),
                cut_at + 110,
                f"the old coordinator's (pid {zombie}) commit refused",
                lambda: "its log ends:\n" + "\n".join(_log_lines(hosts_cluster, zombie, "")[-20:]),
            )
            RECOVERY["all cut: old coordinator's commit refused"] = time.monotonic() - cut_at
        fenced = _log_lines(hosts_cluster, zombie, f"epoch {epoch} fenced by epoch ")
        tried = _log_lines(hosts_cluster, zombie, "commit failed:")
    finally:
        net.heal()
    healed_at = time.monotonic()
    for name in workers:  # the cut raylets exit on their own once they hear they are dead
        hosts_cluster.remove(name)
        hosts_cluster.add(name)
    hosts_cluster.wait_for_nodes(len(workers) + 1)
    _all_committed_after(running, "all cut, healed, nodes restarted", healed_at, 240)
    history = commit_history(sink)
    zombie_after_cut = [
        h for h in history
        if h.get("rayconnect.epoch") == str(epoch) and h["version"] < claimed["version"]
        and h["timestamp"] / 1000 > cut_wall
    ]  # fmt: skip
    late = [
        h for h in history if h["version"] > claimed["version"]
        and h.get("rayconnect.epoch") == str(epoch)
    ]  # fmt: skip
    print(
        f"\nold coordinator pid {zombie}, epoch {epoch}: {len(zombie_after_cut)} rounds "
        f"committed behind the cut before the claim (version {claimed['version']}); its "
        f"commits that failed: {tried}; {refused[-1].strip()}; then: {fenced}"
    )
    assert zombie_after_cut, "the old pipeline committed nothing behind the cut"
    found = refusal.search(refused[-1].strip())
    assert found, refused
    txn, error, newer = int(found[1]), found[2], int(found[3])
    # the table's epoch fence: a newer epoch read before the write, or (the claim landing
    # between the read and the write) the claim's version conflicting with it
    assert newer > epoch and error in ("StaleEpochError", "CommitConflictError"), refused
    assert [h for h in history if (h.get("rayconnect.epoch"), h.get("rayconnect.txn_id"))
            == (str(epoch), str(txn))] == []  # fmt: skip  # the refused round is not in it
    assert late == []  # nothing of the old epoch after the claim
    assert fenced, "the old coordinator did not stop as fenced"


#: The trickle behind the whole cut: records per produce and seconds between them.
TRICKLE_RECORDS, TRICKLE_EVERY_S = 20, 0.5


class _Trickle:
    """``produced.more(records)`` every ``every_s`` in a thread, while inside ``with``."""

    def __init__(self, produced: Produced, records: int, every_s: float) -> None:
        self.produced, self.records, self.every_s = produced, records, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickle", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every_s):
                self.produced.more(self.records)
        except BaseException as e:  # the test fails with it on leaving
            self.error = e

    def __enter__(self) -> _Trickle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.error is not None and exc[0] is None:
            raise AssertionError(f"the trickle producer failed: {self.error!r}")


def _claim_after(sink: rc.DeltaSink, epoch: int) -> dict[str, Any] | None:
    """The first table version of an epoch newer than ``epoch`` (its claim), once there is
    one."""
    newer = [h for h in commit_history(sink) if int(h.get("rayconnect.epoch", 0)) > epoch]
    return min(newer, key=lambda h: h["version"], default=None)


def _wait(
    found: Callable[[], Any],
    deadline: float,
    what: str,
    seen: Callable[[], str] = lambda: "",
) -> Any:
    """``found()`` once it is truthy (polled each second), before ``deadline`` (monotonic);
    else fail saying what ``seen`` tells."""
    while not (result := found()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no sign of {what} in time ({RECOVERY}) {seen()}")
        time.sleep(1.0)
    return result


def _log_lines(
    cluster: NetnsRayCluster, pid: int, text: str, name: str = "-{pid}.err"
) -> list[str]:
    """Lines saying ``text`` in a log of the Ray worker process ``pid`` (its stderr, where
    Python's warnings go; every node's logs are on this machine's one disk)."""
    found = []
    for log in cluster.temp_root.glob(f"ray/session_2*/logs/*{name.format(pid=pid)}"):
        if log.is_file():
            found += [line for line in log.read_text(errors="replace").splitlines() if text in line]
    return found
