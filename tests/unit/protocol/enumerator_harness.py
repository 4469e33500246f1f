"""A fake world for the enumerator tests: brokers, readers and the coordinator's partition
set, updated by carrying out the enumerator's effects in order (as the actor would)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rayconnect.protocol.enumerator import Enumerator, EnumeratorConfig
from rayconnect.protocol.enumerator_effects import (
    AssignPartitions,
    DiscoverPartitions,
    EnumeratorEffect,
    FailPipeline,
    PollMetadata,
    SendMetadataUpdate,
    StartReaders,
    StopReaders,
)
from rayconnect.protocol.types import ClusterMetadata, KafkaStream, TopicPartition


def address(cluster_id: str, port: int = 9092) -> str:
    return f"{cluster_id}.example:{port}"


def stream(stream_id: str, **clusters: list[str]) -> KafkaStream:
    """``stream("orders", east=["orders"], west=["orders", "eu"])``"""
    return KafkaStream(
        stream_id,
        {cid: ClusterMetadata(address(cid), tuple(topics)) for cid, topics in clusters.items()},
    )


def keys(cluster_id: str, topic: str, n: int) -> set[str]:
    return {TopicPartition(cluster_id, topic, p).key for p in range(n)}


@dataclass
class World:
    enumerator: Enumerator
    partitions: dict[tuple[str, str], int] = field(default_factory=dict)  # (cluster, topic) -> n
    unreachable: set[str] = field(default_factory=set)
    auto_answer: bool = True
    now: float = 0.0
    readers: dict[str, set[str]] = field(default_factory=dict)  # running reader -> splits
    assigned: set[str] = field(default_factory=set)  # the coordinator's partitions
    effects: list[EnumeratorEffect] = field(default_factory=list)  # everything, in order
    pending: list[DiscoverPartitions] = field(default_factory=list)  # unanswered discoveries
    failed: str | None = None

    @classmethod
    def make(cls, **config: object) -> World:
        """A world whose enumerator polls every 10 s; every topic has 2 partitions unless
        ``partitions`` says otherwise."""
        return cls(Enumerator(EnumeratorConfig(discovery_interval_s=10.0, **config)))  # type: ignore[arg-type]

    # -- driving ---------------------------------------------------------------------------

    def poll(self, *streams: KafkaStream, error: str | None = None) -> list[EnumeratorEffect]:
        return self.run(self.enumerator.metadata_polled(streams, error, self.now))

    def fail_poll(self, error: str = "service down") -> list[EnumeratorEffect]:
        return self.run(self.enumerator.metadata_polled(None, error, self.now))

    def tick(self, advance: float = 0.0) -> list[EnumeratorEffect]:
        self.now += advance
        return self.run(self.enumerator.tick(self.now))

    def run(self, ready: list[EnumeratorEffect]) -> list[EnumeratorEffect]:
        """Carry out ``ready`` (and, with auto_answer, the discoveries it asks for);
        returns every effect carried out, in order."""
        done: list[EnumeratorEffect] = []
        queue = list(ready)
        while queue:
            effect = queue.pop(0)
            done.append(effect)
            self.effects.append(effect)
            follow = self.apply(effect)
            queue[0:0] = follow
        return done

    def answer(self, request: DiscoverPartitions) -> list[EnumeratorEffect]:
        cid = request.cluster_id
        if cid in self.unreachable:
            return self.enumerator.discovery_failed(
                cid, f"{cid} unreachable", self.now, request.request_id
            )
        parts = [
            TopicPartition(cid, t, p)
            for t in request.cluster.topics
            for p in range(self.partitions.get((cid, t), 2))
        ]
        return self.enumerator.partitions_discovered(cid, parts, self.now, request.request_id)

    def apply(self, effect: EnumeratorEffect) -> list[EnumeratorEffect]:
        if isinstance(effect, DiscoverPartitions):
            if self.auto_answer:
                return self.answer(effect)
            self.pending.append(effect)
        elif isinstance(effect, StopReaders):
            for r in effect.reader_ids:
                self.readers.pop(r, None)
        elif isinstance(effect, StartReaders):
            for r, splits in effect.assignment.items():
                self.readers[r] = set(splits)
        elif isinstance(effect, SendMetadataUpdate):
            assert effect.reader_id in self.readers, "update for a reader that does not run"
            self.readers[effect.reader_id] = {s.partition.key for s in effect.event.splits}
        elif isinstance(effect, AssignPartitions):
            assert not (set(effect.added) & self.assigned), "added twice"
            assert set(effect.retired) <= self.assigned, "retired an unknown partition"
            self.assigned = (self.assigned | set(effect.added)) - set(effect.retired)
        elif isinstance(effect, FailPipeline):
            self.failed = effect.reason
        else:
            assert isinstance(effect, PollMetadata)
        return []

    # -- views -----------------------------------------------------------------------------

    def of(self, kind: type, cluster_id: str | None = None) -> list[EnumeratorEffect]:
        return [
            e
            for e in self.effects
            if isinstance(e, kind)
            and (cluster_id is None or getattr(e, "cluster_id", None) == cluster_id)
        ]

    def split_keys(self) -> list[str]:
        return [k for splits in self.readers.values() for k in splits]
