"""One cluster's sub-enumerator (FLIP-246): its partitions, its readers, its splits.

Theory of operation
-------------------
The pipeline enumerator (enumerator.py) keeps one ``ClusterEnumerator`` per cluster id. It
knows two versions of the cluster's metadata: ``desired`` (what the metadata service says
now) and ``running`` (what this cluster's readers were started with; None = no readers).
States:

- PENDING: no readers yet; a discovery of ``desired`` is out or will be retried.
- ACTIVE: readers run with ``running == desired``; partitions are rediscovered every
  ``discovery_interval_s`` and new ones go to the running readers without a restart.
- CHANGING: ``desired`` differs from ``running`` and needs a discovery (a new topic, a new
  address or new properties). The readers go on reading their last known splits until
  the discovery succeeds, then restart with ``desired``. A broker that stays unreachable
  keeps the cluster in CHANGING on its old splits, and blocks no other cluster.
- REMOVED: the cluster left the metadata (readers stopped, partitions retired); it takes
  no further input.

The machine works out what an input means (an *event*: CHANGED metadata, metadata REVERTED
to what runs, only TOPICS_REMOVED ...) and the table (``TRANSITIONS``) makes the move; the
same metadata again and a tick with nothing due are ``IGNORED`` cells, a missing cell
raises ``ProtocolError``.

Rules
-----
- Only this cluster's readers restart, and only when its metadata changed: a cluster whose
  topics, address and properties are unchanged keeps its readers untouched (Flink restarts
  every reader; we do not have to).
- A change that only removes topics needs no broker: the partitions of the remaining
  topics are known, so it applies at once (the readers restart without the removed topics).
- Assignment is stable: a split never moves to another reader while it exists. New splits
  go, in key order, to the reader holding the fewest (ties: lowest index) - round-robin
  when the readers are even, and it refills readers that lost splits.
- Discovery answers carry the ``request_id`` of their ``DiscoverPartitions``; an answer to
  an older request (the metadata changed meanwhile) is stale and ignored.
- The enumerator does not hold offsets: a partition that leaves and comes back resumes from
  the table's committed offset.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from rayconnect.protocol.enumerator_effects import DiscoverPartitions, StartReaders, StopReaders
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import IGNORED, MoveTable, TableMachine
from rayconnect.protocol.types import ClusterMetadata, TopicPartition


class ClusterState(enum.Enum):
    PENDING = "pending"
    ACTIVE = "active"
    CHANGING = "changing"
    REMOVED = "removed"  # the cluster left the metadata; the enumerator dropped it


class ClusterEvent(enum.Enum):
    """What an input turned out to mean; the table moves the machine on it."""

    CHANGED = "changed"  # metadata that needs a discovery (new topics, address, properties)
    REVERTED = "reverted"  # the metadata is back to what the readers run
    TOPICS_REMOVED = "topics_removed"  # only fewer topics: applied at once, no broker needed
    UNCHANGED = "unchanged"  # the same metadata again
    DUE = "due"  # a tick, and time to rediscover (no discovery out)
    NOT_DUE = "not_due"  # a tick with nothing to do
    DISCOVERED = "discovered"  # the answer to the outstanding discovery
    DISCOVERY_FAILED = "discovery_failed"
    RESUMED = "resumed"  # a restored enumerator takes over readers that run
    REMOVED = "removed"  # the cluster left the metadata


_S = ClusterState
_E = ClusterEvent
_IGNORED = IGNORED

#: A missing cell raises ``ProtocolError``: REVERTED and TOPICS_REMOVED need running readers
#: (not PENDING; in ACTIVE what runs is what is desired, so "back to it" is UNCHANGED),
#: RESUMED happens only to a fresh cluster, and a REMOVED cluster takes no input at all.
TRANSITIONS: Final = MoveTable[ClusterState, ClusterEvent](
    "cluster enumerator",
    {
        _S.PENDING: {
            _E.CHANGED: _S.PENDING,  # (re)discover the new metadata
            _E.UNCHANGED: _IGNORED,
            _E.DUE: _S.PENDING,  # retry a failed discovery
            _E.NOT_DUE: _IGNORED,
            _E.DISCOVERED: _S.ACTIVE,  # readers start
            _E.DISCOVERY_FAILED: _S.PENDING,
            _E.RESUMED: _S.ACTIVE,
            _E.REMOVED: _S.REMOVED,
        },
        _S.ACTIVE: {
            _E.CHANGED: _S.CHANGING,  # the readers go on with their splits meanwhile
            _E.TOPICS_REMOVED: _S.ACTIVE,  # restarted without them at once
            _E.UNCHANGED: _IGNORED,
            _E.DUE: _S.ACTIVE,  # rediscover: new partitions go to the running readers
            _E.NOT_DUE: _IGNORED,
            _E.DISCOVERED: _S.ACTIVE,
            _E.DISCOVERY_FAILED: _S.ACTIVE,  # keeps its splits
            _E.REMOVED: _S.REMOVED,
        },
        _S.CHANGING: {
            _E.CHANGED: _S.CHANGING,  # changed again: a new discovery supersedes the old
            _E.REVERTED: _S.ACTIVE,  # nothing to restart; the answer in flight is moot
            _E.TOPICS_REMOVED: _S.ACTIVE,
            _E.UNCHANGED: _IGNORED,
            _E.DUE: _S.CHANGING,  # retry a failed discovery
            _E.NOT_DUE: _IGNORED,
            _E.DISCOVERED: _S.ACTIVE,  # readers restart with the desired metadata
            _E.DISCOVERY_FAILED: _S.CHANGING,  # unreachable: the old splits stay
            _E.REMOVED: _S.REMOVED,
        },
        _S.REMOVED: {},
    },
)


def normalized(meta: ClusterMetadata) -> ClusterMetadata:
    """Topic order and duplicates are not a change: compare sorted, unique topics."""
    return ClusterMetadata(meta.bootstrap_servers, tuple(sorted(set(meta.topics))), meta.properties)


def reader_ids(cluster_id: str, readers: int) -> tuple[str, ...]:
    return tuple(f"{cluster_id}/{i}" for i in range(readers))


def cluster_of_reader(reader_id: str) -> str | None:
    """``"east/0"`` -> ``"east"``; None if ``reader_id`` is not a reader id."""
    cluster, sep, index = reader_id.rpartition("/")
    return cluster if sep and cluster and index.isdigit() else None


@dataclass
class Plan:
    """What a step of one or more sub-enumerators asks for, before it is put in order."""

    stop: list[StopReaders] = field(default_factory=list)
    added: set[str] = field(default_factory=set)
    retired: set[str] = field(default_factory=set)
    start: list[StartReaders] = field(default_factory=list)
    update: list[str] = field(default_factory=list)  # readers whose split set changed
    discover: list[DiscoverPartitions] = field(default_factory=list)

    def merge(self, other: Plan) -> Plan:
        # keys name their cluster and one step changes each cluster once, so the added and
        # retired sets of different plans never overlap
        self.stop += other.stop
        self.added |= other.added
        self.retired |= other.retired
        self.start += other.start
        self.update += other.update
        self.discover += other.discover
        return self


class ClusterSnapshot(msgspec.Struct, frozen=True):
    """What a restarted enumerator needs to know about one cluster (FLIP-246 enum state)."""

    running: ClusterMetadata
    assignment: dict[str, tuple[str, ...]]


class ClusterEnumerator(TableMachine[ClusterState, ClusterEvent]):
    """Partitions and readers of one cluster; driven by ``Enumerator`` only."""

    TRANSITIONS = TRANSITIONS

    def __init__(
        self,
        cluster_id: str,
        readers: int,
        interval_s: float,
        new_request_id: Callable[[], int],
        now: float,
    ) -> None:
        super().__init__(ClusterState.PENDING)
        self.cluster_id = cluster_id
        self.readers = reader_ids(cluster_id, readers)
        self.interval_s = interval_s
        self._new_request_id = new_request_id
        self.desired: ClusterMetadata | None = None
        self.running: ClusterMetadata | None = None
        self.assignment: dict[str, list[str]] = {r: [] for r in self.readers}
        self.request_id: int | None = None
        self.next_discovery_at = now
        self.failures = 0
        self.last_error: str | None = None
        self.live: set[str] = set()

    def resume(self, snapshot: ClusterSnapshot) -> None:
        """Take over readers a previous enumerator started (see ``Enumerator.restore``)."""
        if set(snapshot.assignment) != set(self.readers):
            raise ProtocolError(
                f"cluster {self.cluster_id!r}: snapshot readers {sorted(snapshot.assignment)} "
                f"!= {list(self.readers)} (readers_per_cluster changed): start without it"
            )
        self._fire(ClusterEvent.RESUMED)
        self.desired = self.running = normalized(snapshot.running)
        self.assignment = {r: list(snapshot.assignment[r]) for r in self.readers}

    def snapshot(self) -> ClusterSnapshot | None:
        if self.running is None:
            return None
        return ClusterSnapshot(self.running, self.splits())

    # -- views -----------------------------------------------------------------------------

    def keys(self) -> set[str]:
        return {k for keys in self.assignment.values() for k in keys}

    def splits(self) -> dict[str, tuple[str, ...]]:
        """Reader id -> its split keys (empty while no readers run)."""
        if self.running is None:
            return {}
        return {r: tuple(keys) for r, keys in self.assignment.items()}

    def next_deadline(self) -> float | None:
        return self.next_discovery_at if self.request_id is None else None

    # -- inputs ----------------------------------------------------------------------------

    def desire(self, meta: ClusterMetadata, now: float) -> Plan:
        """The metadata service's view of this cluster (changed or not)."""
        wanted = normalized(meta)
        running = self.running
        if wanted == self.desired:
            event = ClusterEvent.UNCHANGED
        elif running is not None and wanted == running:
            event = ClusterEvent.REVERTED
        elif running is not None and self._only_removes_topics(running, wanted):
            event = ClusterEvent.TOPICS_REMOVED
        else:
            event = ClusterEvent.CHANGED
        if not self._fire(event):
            return Plan()
        self.desired = wanted
        if event is ClusterEvent.CHANGED:
            return self._discover()
        self.request_id = None  # what runs (or part of it) is wanted: an answer is moot
        if event is ClusterEvent.REVERTED:
            return Plan()
        keep = {k for k in self.keys() if TopicPartition.from_key(k).topic in wanted.topics}
        return self._apply(keep)

    def due(self, now: float) -> Plan:
        """A tick: rediscover if no discovery is out and the interval has passed."""
        due = self.request_id is None and now >= self.next_discovery_at
        if not self._fire(ClusterEvent.DUE if due else ClusterEvent.NOT_DUE):
            return Plan()
        return self._discover()

    def discovered(self, partitions: Iterable[TopicPartition], now: float) -> Plan:
        """The answer to the outstanding request (the caller checked the request id)."""
        assert self.desired is not None
        keys = set()
        for p in partitions:
            if p.cluster != self.cluster_id or p.topic not in self.desired.topics:
                raise ProtocolError(
                    f"cluster {self.cluster_id!r}: discovered {p.key}, which is not a "
                    f"partition of its topics {list(self.desired.topics)}"
                )
            keys.add(p.key)
        self._fire(ClusterEvent.DISCOVERED)
        self._answered(now)
        self.failures, self.last_error = 0, None
        return self._apply(keys)

    def discovery_failed(self, error: str, now: float) -> Plan:
        self._fire(ClusterEvent.DISCOVERY_FAILED)
        self._answered(now)
        self.failures += 1
        self.last_error = error
        return Plan()

    def remove(self) -> Plan:
        """The cluster left the metadata: stop its readers, retire all its partitions. No
        broker is involved, so an unreachable cluster leaves as fast as any other."""
        self._fire(ClusterEvent.REMOVED)
        plan = Plan(retired=self.keys())
        if self.running is not None:
            plan.stop.append(StopReaders(self.cluster_id, tuple(self.assignment)))
        self.request_id = None
        return plan

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _only_removes_topics(running: ClusterMetadata, wanted: ClusterMetadata) -> bool:
        return (
            wanted.bootstrap_servers == running.bootstrap_servers
            and wanted.properties == running.properties
            and set(wanted.topics) < set(running.topics)
        )

    def _discover(self) -> Plan:
        assert self.desired is not None
        self.request_id = self._new_request_id()
        return Plan(discover=[DiscoverPartitions(self.cluster_id, self.desired, self.request_id)])

    def _answered(self, now: float) -> None:
        self.request_id = None
        self.next_discovery_at = now + self.interval_s

    def _apply(self, keys: set[str]) -> Plan:
        """Make ``keys`` the cluster's partitions, as readers of ``desired``."""
        assert self.desired is not None
        old = self.keys()
        before = {r: set(ks) for r, ks in self.assignment.items()}
        assignment = {r: [k for k in ks if k in keys] for r, ks in self.assignment.items()}
        for key in sorted(keys - old, key=TopicPartition.from_key):
            assignment[min(self.readers, key=lambda r: len(assignment[r]))].append(key)
        self.assignment = assignment
        plan = Plan(added=keys - old, retired=old - keys)
        if self.running != self.desired:
            if self.running is not None:
                plan.stop.append(StopReaders(self.cluster_id, self.readers))
            self.running = self.desired
            self.live.clear()
            plan.start.append(StartReaders(self.cluster_id, self.running, self.splits()))
        else:
            plan.update = [r for r in self.readers if set(assignment[r]) != before[r]]
        return plan
