"""Enumerator actor ``<pipeline>/enumerator``: follows the metadata service (FLIP-246).

A thin shell around ``protocol.enumerator.Enumerator``. It polls the pipeline's
KafkaMetadataService and discovers partitions in background tasks (so a slow or unreachable
cluster blocks nobody) and carries out the machine's effects strictly in order, as its
ordering contract requires: readers stopped, then partitions assigned (participants created,
the coordinator told), then readers started, then their metadata sent.

Its snapshot (the running clusters and split assignment, never offsets) is kept in Ray's
internal key-value store after every step, so a restarted enumerator resumes the readers it
had instead of restarting them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
import ray

from rayconnect import ray_internals
from rayconnect.actors import names
from rayconnect.config.sink import SinkPipelineConfig
from rayconnect.protocol.actor_status import DiscoveryStatus
from rayconnect.protocol.enumerator import Enumerator, EnumeratorConfig, EnumeratorSnapshot
from rayconnect.protocol.enumerator_effects import (
    AssignPartitions,
    DiscoverPartitions,
    EnumeratorReady,
    FailPipeline,
    PollMetadata,
    SendMetadataUpdate,
    StartReaders,
    StopReaders,
)
from rayconnect.protocol.messages import GetMetadataUpdateEvent
from rayconnect.protocol.types import TopicPartition

log = logging.getLogger(__name__)

MAX_TICK_S = 0.5


def _snapshot_key(pipeline: str) -> bytes:
    return f"rayconnect/{pipeline}/enumerator-snapshot".encode()


def enumerator_config(config: SinkPipelineConfig) -> EnumeratorConfig:
    source = config.source
    return EnumeratorConfig(
        discovery_interval_s=source.discovery_interval_s,
        discovery_failure_threshold=source.discovery_failure_threshold,
        readers_per_cluster=source.readers_per_cluster,
        stream_ids=source.stream_ids,
        stream_pattern=source.stream_pattern,
    )


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class EnumeratorActor:
    async def __init__(self, config: SinkPipelineConfig) -> None:  # type: ignore[misc]  # Ray awaits an async actor's __init__
        self.config = config
        self.service = config.source.metadata
        now = time.monotonic()
        saved = ray_internals.kv_get(_snapshot_key(config.name))
        machine_config = enumerator_config(config)
        if saved:
            snapshot = msgspec.msgpack.decode(saved, type=EnumeratorSnapshot)
            self.machine = Enumerator.restore(snapshot, machine_config, now)
            self.restored = True
        else:
            self.machine = Enumerator(machine_config)
            self.restored = False
        self.failed: str | None = None
        self.started_at = time.time()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # Started here, not by a call: Ray re-runs __init__ when it restarts this actor.
        self._task = asyncio.get_running_loop().create_task(self._tick_forever())

    # -- inputs ----------------------------------------------------------------------------

    async def _tick_forever(self) -> None:
        while self.failed is None:
            try:
                await self._apply(lambda: self.machine.tick(time.monotonic()))
            except Exception:
                log.exception("enumerator %s: tick failed", self.config.name)
            deadline = self.machine.next_deadline()
            wait = MAX_TICK_S if deadline is None else deadline - time.monotonic()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.01, min(wait, MAX_TICK_S)))

    async def get_metadata_update(self, event: GetMetadataUpdateEvent) -> None:
        """A reader's start-up request; the answer goes out as ``metadata_update``."""
        await self._apply(lambda: self.machine.get_metadata_update(event, time.monotonic()))

    async def reader_of(self, key: str) -> str | None:
        """The actor name of the reader serving partition ``key`` (no lock: a pure read)."""
        for reader_id, keys in self.machine.splits().items():
            if key in keys:
                return names.reader_of(self.config.name, reader_id)
        return None

    async def partitions_of_host(self, host: str) -> tuple[list[str], dict[str, Any]]:
        """The partitions participant host ``host`` holds now and their clusters' metadata:
        a restarted host asks (partitions that joined later are not in its arguments)."""
        keys = sorted(
            key
            for split_keys in self.machine.splits().values()
            for key in split_keys
            if names.host_of(self.config, key) == host
        )
        clusters = self._clusters()
        wanted = {TopicPartition.from_key(key).cluster for key in keys}
        return keys, {cid: clusters[cid] for cid in wanted if cid in clusters}

    async def status(self) -> DiscoveryStatus:
        return DiscoveryStatus(
            **msgspec.structs.asdict(self.machine.status()),
            failed=self.failed,
            restored=self.restored,
            started_at=self.started_at,
        )

    async def close(self) -> None:
        self._task.cancel()
        ray_internals.kv_del(_snapshot_key(self.config.name))

    # -- effects ---------------------------------------------------------------------------

    async def _apply(self, step) -> None:
        async with self._lock:
            await self._carry_out(step())
            ray_internals.kv_put(
                _snapshot_key(self.config.name), msgspec.msgpack.encode(self.machine.snapshot())
            )

    async def _carry_out(self, ready: EnumeratorReady) -> None:
        for effect in ready:
            if isinstance(effect, PollMetadata):
                asyncio.get_running_loop().create_task(self._poll())
            elif isinstance(effect, DiscoverPartitions):
                asyncio.get_running_loop().create_task(self._discover(effect))
            elif isinstance(effect, StopReaders):
                await self._stop_readers(effect)
            elif isinstance(effect, AssignPartitions):
                await self._assign(effect)
            elif isinstance(effect, StartReaders):
                await self._start_readers(effect)
            elif isinstance(effect, SendMetadataUpdate):
                reader = self._reader(effect.reader_id)
                if reader is not None:
                    await reader.metadata_update.remote(effect.event)
            elif isinstance(effect, FailPipeline):
                self.failed = effect.reason
                log.error("enumerator %s: pipeline failed: %s", self.config.name, effect.reason)
            else:
                raise TypeError(f"enumerator cannot carry out {effect!r}")

    async def _poll(self) -> None:
        from rayconnect.metadata import poll_service
        from rayconnect.protocol.streams import with_default_properties

        streams, error = await poll_service(self.service)
        if streams is not None:  # source-wide client properties under each cluster's own
            streams = with_default_properties(streams, self.config.source.properties)
        await self._apply(lambda: self.machine.metadata_polled(streams, error, time.monotonic()))

    async def _discover(self, effect: DiscoverPartitions) -> None:
        from rayconnect.kafka.discovery import discover_partitions

        try:
            found = await discover_partitions(effect.cluster_id, effect.cluster)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            await self._apply(
                lambda: self.machine.discovery_failed(
                    effect.cluster_id, error, time.monotonic(), request_id=effect.request_id
                )
            )
            return
        await self._apply(
            lambda: self.machine.partitions_discovered(
                effect.cluster_id, found, time.monotonic(), request_id=effect.request_id
            )
        )

    async def _stop_readers(self, effect: StopReaders) -> None:
        for reader_id in effect.reader_ids:
            reader = self._reader(reader_id)
            if reader is None:
                continue
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.close.remote(), 10.0)
            ray.kill(reader, no_restart=True)
            name = names.reader_of(self.config.name, reader_id)
            deadline = time.monotonic() + 30.0
            while self._reader(reader_id) is not None:  # the name is free once it is dead
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not stop in 30 s")
                await asyncio.sleep(0.05)
            log.info("enumerator %s: stopped %s", self.config.name, name)

    async def _assign(self, effect: AssignPartitions) -> None:
        from rayconnect.actors.participant_host import start_participants

        coordinator = ray.get_actor(names.coordinator(self.config.name), namespace=names.NAMESPACE)
        if effect.added:
            await asyncio.gather(*start_participants(self.config, effect.added, self._clusters()))
            await coordinator.add_partitions.remote(list(effect.added))
        if effect.retired:
            await coordinator.retire_partitions.remote(list(effect.retired))

    async def _start_readers(self, effect: StartReaders) -> None:
        from rayconnect.actors.reader import ReaderActor

        for reader_id in effect.assignment:
            existing = self._reader(reader_id)
            if existing is not None:  # "replacing any reader of that id still running"
                await self._stop_readers(StopReaders(effect.cluster_id, (reader_id,)))
            ray_internals.actor_class(ReaderActor).options(
                name=names.reader_of(self.config.name, reader_id),
                namespace=names.NAMESPACE,
                lifetime="detached",
                **self.config.placement.actor_options("reader"),
            ).remote(
                self.config.name,
                effect.cluster_id,
                effect.cluster,
                reader_id,
                self.config.source.max_poll_records,
                self.config.partitions_per_host,
                self.config.topic_groups,
                self.config.commit.consistent_cuts,
            )
            # Under the lock already (this runs inside _apply): carry its Ready out here.
            await self._carry_out(
                self.machine.reader_started(reader_id, effect.cluster_id, time.monotonic())
            )

    def _reader(self, reader_id: str) -> Any | None:
        try:
            return ray.get_actor(
                names.reader_of(self.config.name, reader_id), namespace=names.NAMESPACE
            )
        except ValueError:
            return None

    def _clusters(self) -> dict[str, Any]:
        from rayconnect.protocol.streams import clusters_of

        return clusters_of(self.machine.streams)
