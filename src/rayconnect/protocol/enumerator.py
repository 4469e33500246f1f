"""The pipeline's enumerator (FLIP-246 DynamicKafkaSourceEnumerator) as a pure state machine.

Theory of operation
-------------------
One enumerator per pipeline (actor ``<pipeline>/enumerator``) follows the metadata service
and keeps a sub-enumerator per cluster id (cluster_enumerator.py). It polls the service
every ``discovery_interval_s`` (``PollMetadata`` -> ``metadata_polled``), keeps the
subscribed streams (``stream_ids`` / ``stream_pattern``), merges them per cluster
(``clusters_of``) and hands each cluster its metadata. The sub-enumerators discover
partitions (``DiscoverPartitions`` -> ``partitions_discovered`` / ``discovery_failed``),
assign splits to ``readers_per_cluster`` readers per cluster and ask for readers to be
started, stopped or updated. A reader asks ``GetMetadataUpdateEvent`` when it starts and
reads nothing until the answer (``SendMetadataUpdate``) tells it its splits: splits it
restored from elsewhere that the fresh metadata no longer has are dropped.

States: INIT (no good metadata yet; reader requests wait), RUNNING, FAILED (the service
failed ``discovery_failure_threshold`` polls in a row: ``FailPipeline``; then inert).

Rules
-----
- A failing service (``metadata_polled(None, error)``, or metadata that cannot be merged)
  keeps the last good metadata in force; the error shows in ``status()``. Only
  ``discovery_failure_threshold`` failures in a row fail the pipeline. A service that
  answers with its last good metadata plus a warning (a malformed file edit) is not failing:
  the warning shows in status, nothing else happens.
- Per-cluster rules (only changed clusters restart their readers, stable assignment, an
  unreachable broker keeps its last splits and blocks nobody): see cluster_enumerator.py.
- The enumerator holds no offsets. Partitions that leave retire through the commit
  protocol, and come back from the table's committed offsets: nothing is read twice.
- The machine works out what an input means (an *event*: good metadata, the failed poll
  that reaches the threshold, a STALE_ANSWER ...) and the table (``TRANSITIONS``) makes the
  move. Deliberate no-ops are ``IGNORED`` cells, counted in ``messages_ignored``: stale
  discovery answers, answers for a cluster that left, readers the metadata has no splits
  for, malformed reader ids, and everything once FAILED. A missing cell is an input the
  machine did not ask for (a discovery answer while none is outstanding, any answer in
  INIT) and raises ``ProtocolError``, as do partitions of another cluster.
- Time is an input; call ``tick(now)`` at start and by ``next_deadline()``.

Ordering contract (the actor and the coordinator must honour it)
----------------------------------------------------------------
1. The effects of one Ready are carried out in order, each finished before the next:
   ``StopReaders`` -> ``AssignPartitions`` -> ``StartReaders`` -> ``SendMetadataUpdate`` ->
   ``DiscoverPartitions`` / ``PollMetadata`` -> ``FailPipeline``. ``StopReaders`` is done
   when the readers can deliver nothing more.
2. ``AssignPartitions`` comes AFTER ``StopReaders``: a retired partition has no reader any
   more, so what its participant holds is all it will ever get. It comes BEFORE
   ``StartReaders``/``SendMetadataUpdate``: an added partition has its participant (and
   the coordinator knows it) before any reader may deliver it.
3. ``added``: start the participants, then ``Coordinator.add_partitions(added)``; they join
   at the next START from the table's offset (or the starting-offset policy).
4. ``retired``: ``Coordinator.retire_partitions(retired)``. The coordinator machine keeps
   it in the rounds (dropping it from the round in progress would make what it read since
   the last commit be read again later, from the table) until a round whose END-COMMIT went out after this effect was carried out is
   committed (or found empty); that round's WRITE-STATUS covers all it read. Then it
   emits ``PartitionsRetired`` and its actor stops the participant; the offset stays in
   the table. A later ``added`` holding a key still waiting to retire cancels the retirement.
5. ``StartReaders`` for a cluster whose readers restarted keeps most splits where they
   were: the new reader must resume each kept split at its participant's position (the
   participant re-seeks it), not at the table's offset, or the round gets duplicates.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable
from typing import Final

import msgspec

from rayconnect.protocol.cluster_enumerator import (
    ClusterEnumerator,
    ClusterSnapshot,
    Plan,
    cluster_of_reader,
)
from rayconnect.protocol.enumerator_effects import (
    AssignPartitions,
    EnumeratorEffect,
    EnumeratorReady,
    FailPipeline,
    PollMetadata,
    SendMetadataUpdate,
    StopReaders,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.machine import IGNORED, MoveTable, TableMachine
from rayconnect.protocol.messages import GetMetadataUpdateEvent, MetadataUpdateEvent
from rayconnect.protocol.streams import MetadataError, clusters_of, select_streams
from rayconnect.protocol.types import (
    ClusterMetadata,
    KafkaPartitionSplit,
    KafkaStream,
    TopicPartition,
)


class EnumeratorConfig(msgspec.Struct, frozen=True):
    """``discovery_interval_s``: between metadata polls, and between partition discoveries
    of a cluster. ``discovery_failure_threshold``: failed metadata polls in a row that fail
    the pipeline. ``stream_ids``/``stream_pattern``: the subscription (see select_streams)."""

    discovery_interval_s: float = 30.0
    discovery_failure_threshold: int = 5
    readers_per_cluster: int = 1
    stream_ids: tuple[str, ...] | None = None
    stream_pattern: str | None = None

    def __post_init__(self) -> None:
        if self.discovery_interval_s <= 0:
            raise ValueError("discovery_interval_s must be > 0")
        if self.discovery_failure_threshold < 1:
            raise ValueError("discovery_failure_threshold must be >= 1")
        if self.readers_per_cluster < 1:
            raise ValueError("readers_per_cluster must be >= 1")
        if self.stream_pattern is not None:
            try:
                re.compile(self.stream_pattern)
            except re.error as e:  # not a ValueError: msgspec would not report it nicely
                raise ValueError(f"stream_pattern {self.stream_pattern!r}: {e}") from None


class State(enum.Enum):
    INIT = "init"
    RUNNING = "running"
    FAILED = "failed"


class Event(enum.Enum):
    """What an input turned out to mean; the table moves the machine on it."""

    TICK = "tick"
    METADATA = "metadata"  # a poll's metadata (maybe with a warning): it comes into force
    POLL_FAILED = "poll_failed"  # the poll failed or its metadata was rejected; below threshold
    GIVE_UP = "give_up"  # the threshold-th failed poll in a row: the pipeline fails
    DISCOVERED = "discovered"  # the answer to a cluster's outstanding discovery
    DISCOVERY_FAILED = "discovery_failed"  # the outstanding discovery failed
    STALE_ANSWER = "stale_answer"  # an answer to a superseded request, or of a cluster that left
    UNASKED_ANSWER = "unasked_answer"  # an answer while the cluster has no discovery out
    READER_STARTED = "reader_started"  # a reader the metadata gives splits is up
    UNKNOWN_READER = "unknown_reader"  # a reader the metadata has no splits for is up
    METADATA_REQUEST = "metadata_request"  # a reader asks for its splits (at start-up)
    NOT_A_READER = "not_a_reader"  # a request with a malformed reader id


_S = State
_E = Event
_IGNORED = IGNORED

#: A missing cell raises ``ProtocolError``: in INIT no discovery was ever asked (clusters
#: are only driven once metadata is in force), so no answer can come; an UNASKED_ANSWER
#: is an actor's bug in any live state. FAILED ignores everything: answers and requests
#: still arrive while the actor stops.
TRANSITIONS: Final = MoveTable[State, Event](
    "enumerator",
    {
        _S.INIT: {
            _E.TICK: _S.INIT,  # poll the service
            _E.METADATA: _S.RUNNING,
            _E.POLL_FAILED: _S.INIT,
            _E.GIVE_UP: _S.FAILED,
            _E.READER_STARTED: _S.INIT,  # a restored enumerator's reader
            _E.UNKNOWN_READER: _IGNORED,
            _E.METADATA_REQUEST: _S.INIT,  # held until metadata arrives
            _E.NOT_A_READER: _IGNORED,
        },
        _S.RUNNING: {
            _E.TICK: _S.RUNNING,  # poll the service, rediscover the clusters that are due
            _E.METADATA: _S.RUNNING,
            _E.POLL_FAILED: _S.RUNNING,  # the last good metadata stays in force
            _E.GIVE_UP: _S.FAILED,
            _E.DISCOVERED: _S.RUNNING,
            _E.DISCOVERY_FAILED: _S.RUNNING,
            _E.STALE_ANSWER: _IGNORED,
            _E.READER_STARTED: _S.RUNNING,
            _E.UNKNOWN_READER: _IGNORED,
            _E.METADATA_REQUEST: _S.RUNNING,  # answered: its splits, or stop it
            _E.NOT_A_READER: _IGNORED,
        },
        _S.FAILED: dict.fromkeys(Event, _IGNORED),
    },
)


class ClusterStatus(msgspec.Struct, frozen=True):
    """One cluster as the dashboard shows it (no properties: they may hold credentials)."""

    state: str
    bootstrap_servers: str
    topics: tuple[str, ...]
    readers: dict[str, tuple[str, ...]]
    readers_started: tuple[str, ...]
    discovering: bool
    consecutive_failures: int
    last_error: str | None


class EnumeratorSnapshot(msgspec.Struct, frozen=True):
    """The state a restarted enumerator resumes from (FLIP-246 checkpoints it likewise):
    each cluster's running metadata and split assignment. Offsets are never in it; cluster
    properties are (they may hold credentials: store it where the pipeline config lives)."""

    clusters: dict[str, ClusterSnapshot]


class EnumeratorStatus(msgspec.Struct, frozen=True):
    """What ``handle.status()`` shows of discovery. ``last_error``: the latest poll's
    failure or warning (None: it was clean); ``last_change_at``: when metadata last changed
    (with the readers' reports, how long a change takes to reach them)."""

    state: str
    streams: tuple[str, ...]
    missing_streams: tuple[str, ...]
    clusters: dict[str, ClusterStatus]
    splits_per_reader: dict[str, tuple[str, ...]]
    partitions: int
    consecutive_failures: int
    last_error: str | None
    last_good_at: float | None
    metadata_changes: int
    last_change_at: float | None
    messages_ignored: int


class Enumerator(TableMachine[State, Event]):
    """Follows the metadata of one pipeline; see the module docstring for the rules."""

    TRANSITIONS = TRANSITIONS

    def __init__(self, config: EnumeratorConfig | None = None) -> None:
        super().__init__(State.INIT)
        self.config = config or EnumeratorConfig()
        self._clusters: dict[str, ClusterEnumerator] = {}
        self._streams: tuple[KafkaStream, ...] = ()
        self._polling = False
        self._next_poll_at = -math.inf
        self._failures = 0
        self._last_error: str | None = None
        self._last_good_at: float | None = None
        self._changes = 0
        self._last_change_at: float | None = None
        self._waiting: list[str] = []  # readers that asked before any metadata was known
        self._requests = 0

    @classmethod
    def restore(
        cls, snapshot: EnumeratorSnapshot, config: EnumeratorConfig | None, now: float
    ) -> Enumerator:
        """An enumerator that takes the snapshot's readers as running. It still starts in
        INIT: nothing is answered until fresh metadata arrives, which then reconciles."""
        enum_ = cls(config)
        for cluster_id, snap in snapshot.clusters.items():
            sub = enum_._clusters[cluster_id] = enum_._new_cluster(cluster_id, now)
            sub.resume(snap)
        return enum_

    def snapshot(self) -> EnumeratorSnapshot:
        return EnumeratorSnapshot(
            {cid: snap for cid, sub in self._clusters.items() if (snap := sub.snapshot())}
        )

    # -- read-only views -------------------------------------------------------------------

    @property
    def streams(self) -> tuple[KafkaStream, ...]:
        """The subscribed streams of the metadata in force."""
        return self._streams

    def cluster(self, cluster_id: str) -> ClusterEnumerator | None:
        """A sub-enumerator (read it, do not change it)."""
        return self._clusters.get(cluster_id)

    def splits(self) -> dict[str, tuple[str, ...]]:
        """Reader id -> split keys, over every cluster whose readers run."""
        return {r: keys for sub in self._clusters.values() for r, keys in sub.splits().items()}

    def next_deadline(self) -> float | None:
        """When ``tick`` has something to do next, or None."""
        if self._state is State.FAILED:
            return None
        deadlines = [] if self._polling else [self._next_poll_at]
        if self._state is State.RUNNING:
            deadlines += [
                d for sub in self._clusters.values() if (d := sub.next_deadline()) is not None
            ]
        return min(deadlines, default=None)

    def status(self) -> EnumeratorStatus:
        wanted = self.config.stream_ids or ()
        present = {s.stream_id for s in self._streams}
        return EnumeratorStatus(
            state=self._state.value,
            streams=tuple(sorted(present)),
            missing_streams=tuple(s for s in wanted if s not in present),
            clusters={
                cid: self._cluster_status(sub) for cid, sub in sorted(self._clusters.items())
            },
            splits_per_reader=self.splits(),
            partitions=sum(len(sub.keys()) for sub in self._clusters.values()),
            consecutive_failures=self._failures,
            last_error=self._last_error,
            last_good_at=self._last_good_at,
            metadata_changes=self._changes,
            last_change_at=self._last_change_at,
            messages_ignored=self._ignored,
        )

    # -- inputs ----------------------------------------------------------------------------

    def tick(self, now: float) -> EnumeratorReady:
        """Time passed: poll the service, rediscover the clusters that are due."""
        if not self._fire(Event.TICK):
            return []
        plan = Plan()
        if self._state is State.RUNNING:
            for sub in self._clusters.values():
                plan.merge(sub.due(now))
        ready = self._render(plan)
        if not self._polling and now >= self._next_poll_at:
            self._polling = True
            ready.append(PollMetadata())
        return ready

    def metadata_polled(
        self, streams: Iterable[KafkaStream] | None, error: str | None, now: float
    ) -> EnumeratorReady:
        """The service answered (``streams``, maybe with a warning ``error``) or failed
        (``None``, ``error``). Also accepted unasked, e.g. from a file watcher."""
        if streams is None and error is None:
            raise ProtocolError("metadata_polled: give streams, or an error if the poll failed")
        selected: tuple[KafkaStream, ...] = ()
        clusters: dict[str, ClusterMetadata] | None = None
        if streams is not None:
            try:
                selected = select_streams(
                    tuple(streams), self.config.stream_ids, self.config.stream_pattern
                )
                clusters = clusters_of(selected)
            except MetadataError as e:
                error = f"metadata rejected: {e}"
        if clusters is not None:
            event = Event.METADATA
        elif self._failures + 1 < self.config.discovery_failure_threshold:
            event = Event.POLL_FAILED
        else:
            event = Event.GIVE_UP
        if not self._fire(event):
            return []
        self._polling = False
        self._next_poll_at = now + self.config.discovery_interval_s
        self._last_error = error
        if clusters is None:
            return self._on_failure(error or "metadata service failed")
        return self._on_metadata(selected, clusters, now)

    def partitions_discovered(
        self,
        cluster_id: str,
        partitions: Iterable[TopicPartition],
        now: float,
        request_id: int | None = None,
    ) -> EnumeratorReady:
        """The answer to ``DiscoverPartitions`` (pass its ``request_id``)."""
        parts = tuple(partitions)
        return self._on_answer(
            cluster_id, request_id, Event.DISCOVERED, lambda s: s.discovered(parts, now)
        )

    def discovery_failed(
        self, cluster_id: str, error: str, now: float, request_id: int | None = None
    ) -> EnumeratorReady:
        """``DiscoverPartitions`` failed: the cluster keeps its last known splits."""
        return self._on_answer(
            cluster_id, request_id, Event.DISCOVERY_FAILED, lambda s: s.discovery_failed(error, now)
        )

    def reader_started(self, reader_id: str, cluster_id: str, now: float) -> EnumeratorReady:
        """A reader actor is up (shown in status). It still asks for its metadata."""
        sub = self._clusters.get(cluster_id)
        known = sub is not None and reader_id in sub.splits()
        if not self._fire(Event.READER_STARTED if known else Event.UNKNOWN_READER):
            return []
        assert sub is not None
        sub.live.add(reader_id)
        return []

    def get_metadata_update(self, event: GetMetadataUpdateEvent, now: float) -> EnumeratorReady:
        """A reader's start-up request: its splits under the current metadata. A reader the
        current metadata has no place for is stopped instead."""
        reader = cluster_of_reader(event.reader_id) is not None
        if not self._fire(Event.METADATA_REQUEST if reader else Event.NOT_A_READER):
            return []
        if self._state is State.INIT:
            if event.reader_id not in self._waiting:
                self._waiting.append(event.reader_id)
            return []
        return self._answer(event.reader_id)

    # -- handlers --------------------------------------------------------------------------

    def _new_cluster(self, cluster_id: str, now: float) -> ClusterEnumerator:
        cfg = self.config
        return ClusterEnumerator(
            cluster_id, cfg.readers_per_cluster, cfg.discovery_interval_s, self._request, now
        )

    def _request(self) -> int:
        self._requests += 1
        return self._requests

    def _on_metadata(
        self, streams: tuple[KafkaStream, ...], clusters: dict[str, ClusterMetadata], now: float
    ) -> EnumeratorReady:
        self._failures = 0
        self._last_good_at = now
        self._streams = streams
        plan = self._reconcile({c: m for c, m in clusters.items() if m.topics}, now)
        ready = self._render(plan)
        waiting, self._waiting = self._waiting, []
        for reader_id in waiting:
            ready += self._answer(reader_id)
        return ready

    def _on_failure(self, error: str) -> EnumeratorReady:
        self._failures += 1
        if self._state is not State.FAILED:  # the table said POLL_FAILED: keep going
            return []
        return [
            FailPipeline(
                f"metadata service failed {self._failures} times in a row "
                f"(discovery_failure_threshold={self.config.discovery_failure_threshold}): {error}"
            )
        ]

    def _reconcile(self, clusters: dict[str, ClusterMetadata], now: float) -> Plan:
        plan = Plan()
        changed = False
        for cluster_id in sorted(self._clusters.keys() - clusters.keys()):
            plan.merge(self._clusters.pop(cluster_id).remove())
            changed = True
        for cluster_id, meta in sorted(clusters.items()):
            sub = self._clusters.get(cluster_id)
            if sub is None:
                sub = self._clusters[cluster_id] = self._new_cluster(cluster_id, now)
            before = sub.desired
            plan.merge(sub.desire(meta, now))
            changed |= sub.desired != before
        if changed:
            self._changes += 1
            self._last_change_at = now
        return plan

    def _on_answer(
        self,
        cluster_id: str,
        request_id: int | None,
        event: Event,
        apply: Callable[[ClusterEnumerator], Plan],
    ) -> EnumeratorReady:
        """A discovery answer: ``event`` if it answers the cluster's outstanding request."""
        sub = self._clusters.get(cluster_id)
        if sub is None or (request_id is not None and request_id != sub.request_id):
            event = Event.STALE_ANSWER  # the cluster left, or a newer request superseded it
        elif sub.request_id is None:
            event = Event.UNASKED_ANSWER
        if not self._fire(event, why=f"cluster {cluster_id!r}: no discovery is outstanding"):
            return []
        assert sub is not None
        return self._render(apply(sub))

    def _answer(self, reader_id: str) -> EnumeratorReady:
        cluster_id = cluster_of_reader(reader_id)
        assert cluster_id is not None
        sub = self._clusters.get(cluster_id)
        splits = sub.splits() if sub is not None else {}
        if reader_id not in splits:
            return [StopReaders(cluster_id, (reader_id,))]
        return [self._update(reader_id, splits[reader_id])]

    def _update(self, reader_id: str, keys: Iterable[str]) -> SendMetadataUpdate:
        """The reader's splits, and the streams as far as its cluster goes: a reader has no
        use for other clusters' metadata, whose properties may hold their credentials."""
        cluster_id = cluster_of_reader(reader_id)
        assert cluster_id is not None  # callers only pass ids of running readers
        streams = tuple(
            KafkaStream(s.stream_id, {cluster_id: s.clusters[cluster_id]})
            for s in self._streams
            if cluster_id in s.clusters
        )
        splits = tuple(KafkaPartitionSplit(TopicPartition.from_key(k)) for k in keys)
        return SendMetadataUpdate(reader_id, MetadataUpdateEvent(streams, splits))

    def _render(self, plan: Plan) -> EnumeratorReady:
        """A plan in the contract's order (module docstring, "Ordering contract")."""
        ready: list[EnumeratorEffect] = [*plan.stop]
        if plan.added or plan.retired:
            ready.append(
                AssignPartitions(
                    added=tuple(sorted(plan.added, key=TopicPartition.from_key)),
                    retired=tuple(sorted(plan.retired, key=TopicPartition.from_key)),
                )
            )
        ready += plan.start
        splits = self.splits()
        ready += [self._update(r, splits[r]) for r in plan.update]
        ready += plan.discover
        return ready

    @staticmethod
    def _cluster_status(sub: ClusterEnumerator) -> ClusterStatus:
        meta = sub.running or sub.desired
        assert meta is not None
        return ClusterStatus(
            state=sub.state.value,
            bootstrap_servers=meta.bootstrap_servers,
            topics=meta.topics,
            readers=sub.splits(),
            readers_started=tuple(sorted(sub.live)),
            discovering=sub.request_id is not None,
            consecutive_failures=sub.failures,
            last_error=sub.last_error,
        )
