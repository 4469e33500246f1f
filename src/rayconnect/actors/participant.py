"""Participant actor ``<pipeline>/participant/<cluster>/<topic>/<partition>``.

A thin shell around ``protocol.participant.Participant``: Ray calls and a timer become
machine inputs, and the effects the machine returns are carried out here, in order, one
Ready at a time (a lock keeps two Readies from interleaving at an ``await``). The only state
kept outside the machine is the handles of its peers. Ray restarts this actor when it dies;
the fresh machine is paused and waits for the coordinator's next START, which carries the
table's offsets (I2) - so nothing the dead incarnation buffered is ever reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

import msgspec
import ray

from rayconnect.actors import names
from rayconnect.pipelines.sink_config import StartingOffsets
from rayconnect.protocol.effects import (
    Flush,
    Pause,
    Ready,
    Resume,
    Seek,
    SeekToPolicy,
    SendMessage,
)
from rayconnect.protocol.messages import Message, ParticipantStarted
from rayconnect.protocol.participant import Participant
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import ClusterMetadata, TopicPartition
from rayconnect.storage.location import TableLocation

log = logging.getLogger(__name__)

TICK_S = 0.25
IDLE_TICK_S = 1.0


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class ParticipantActor:
    async def __init__(
        self,
        pipeline: str,
        key: str,
        table: TableLocation,
        commit: CommitSettings,
        cluster: ClusterMetadata,
        starting_offsets: StartingOffsets | dict[str, int] = "earliest",
    ) -> None:
        self.pipeline = pipeline
        self.key = key
        self.table = table
        self.cluster = cluster
        self.starting_offsets = starting_offsets
        self.machine = Participant(
            key,
            commit,
        )
        self.writer = ray.get_actor(names.writer(pipeline), namespace=names.NAMESPACE)
        # The reader serving this partition: it announces itself (reader_attached) when it
        # (re)starts; a restarted participant asks the enumerator which reader it is.
        self.reader: Any = None
        self._coordinator: Any = None
        self._lock = asyncio.Lock()
        self.records_in = 0
        self.flushes = 0
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())
        asyncio.get_running_loop().create_task(self._announce())

    # -- inputs ----------------------------------------------------------------------------

    async def deliver(self, *messages: Message) -> None:
        """Coordinator messages, in order: START-COMMIT, END-COMMIT or ACK-COMMIT."""
        for message in messages:
            await self._apply(lambda m=message: self.machine.step(m, time.monotonic()))

    async def records(
        self,
        first_offset: int,
        next_offset: int,
        count: int,
        nbytes: int,
        refs: list,
        caught_up: bool = False,
    ) -> None:
        """A batch from the reader; ``refs`` is a one-element list so Ray passes the ref;
        ``caught_up``: the batch ends at the partition's high watermark."""
        self.records_in += count
        await self._apply(
            lambda: self.machine.records(
                first_offset,
                next_offset,
                count,
                nbytes,
                refs[0],
                time.monotonic(),
                caught_up=caught_up,
            )
        )

    async def reader_attached(self, reader: Any) -> tuple[int | None, bool]:
        """A reader (new, or restarted by Ray) serves this partition. Returns where it must
        seek (None: nowhere yet) and whether to resume - the reader applies both itself, so
        this call never calls back into a reader that is still starting."""
        self.reader = reader
        return self.machine.position, self.machine.is_reading and self.machine.position is not None

    async def status(self) -> dict[str, Any]:
        status = msgspec.to_builtins(self.machine.status())
        status.update(records_in=self.records_in, flushes=self.flushes)
        return status

    async def close(self) -> None:
        self._ticker.cancel()

    # -- effects ---------------------------------------------------------------------------

    async def _tick_forever(self) -> None:
        """Tick when the machine has a deadline (flush by age), at most every TICK_S and at
        least every IDLE_TICK_S: a pipeline with many idle partitions must not spend its
        CPU waking their actors."""
        longest = min(IDLE_TICK_S, self.machine.config.flush_max_age_s)
        while True:
            deadline = self.machine.next_deadline()
            wait = longest if deadline is None else deadline - time.monotonic()
            await asyncio.sleep(min(max(wait, TICK_S), longest))
            try:
                await self._apply(lambda: self.machine.tick(time.monotonic()))
            except Exception:
                log.exception("participant %s: tick failed", self.key)

    async def _apply(self, step) -> None:
        async with self._lock:
            await self._carry_out(step())

    async def _carry_out(self, ready: Ready) -> None:
        for effect in ready:
            if isinstance(effect, SendMessage):
                self._coordinator_handle().deliver.remote(effect.message)
            elif isinstance(effect, Flush):
                self.flushes += 1
                asyncio.get_running_loop().create_task(self._flush(effect))
            elif isinstance(effect, Seek | SeekToPolicy | Pause | Resume):
                await self._steer_reader(effect)
            else:
                raise TypeError(f"participant cannot carry out {effect!r}")

    async def _announce(self) -> None:
        """A fresh machine knows no round and is paused until START: stop the reader pushing
        batches it would drop, and tell the coordinator (PARTICIPANT-STARTED), which sends a
        running round's START again or stops waiting for an ended one."""
        reader = await self._reader()
        if reader is not None:
            await reader.pause.remote(self.key)
        # No coordinator yet (the pipeline is starting): its first START reaches us anyway.
        with contextlib.suppress(ValueError):
            self._coordinator_handle().deliver.remote(ParticipantStarted(self.key))

    async def _steer_reader(self, effect: Seek | SeekToPolicy | Pause | Resume) -> None:
        reader = await self._reader()
        if isinstance(effect, SeekToPolicy):
            offset = await self._policy_offset()
            if reader is not None:
                await reader.seek.remote(self.key, offset)
            await self._carry_out(self.machine.position_resolved(offset, time.monotonic()))
        elif reader is None:
            return  # no reader yet: it asks where to start when it attaches
        elif isinstance(effect, Seek):
            await reader.seek.remote(self.key, effect.offset)
        elif isinstance(effect, Pause):
            await reader.pause.remote(self.key)
        else:
            await reader.resume.remote(self.key)

    async def _reader(self) -> Any:
        if self.reader is None:
            try:
                enumerator = ray.get_actor(
                    names.enumerator(self.pipeline), namespace=names.NAMESPACE
                )
                name = await enumerator.reader_of.remote(self.key)
                if name is not None:
                    self.reader = ray.get_actor(name, namespace=names.NAMESPACE)
            except (ValueError, ray.exceptions.RayError):
                return None  # no reader yet: it will attach itself when it starts
        return self.reader

    async def _flush(self, flush: Flush) -> None:
        try:
            files = await self.writer.write.remote(self.table, list(flush.batches))
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            log.warning("participant %s: flush %d failed: %s", self.key, flush.flush_id, reason)
            await self._apply(
                lambda: self.machine.flush_failed(flush.flush_id, reason, time.monotonic())
            )
            return
        await self._apply(lambda: self.machine.flushed(flush.flush_id, files, time.monotonic()))

    def _coordinator_handle(self) -> Any:
        if self._coordinator is None:
            self._coordinator = ray.get_actor(
                names.coordinator(self.pipeline), namespace=names.NAMESPACE
            )
        return self._coordinator

    async def _policy_offset(self) -> int:
        """Where a partition the table never committed starts: explicit, earliest or latest."""
        from rayconnect.kafka.discovery import beginning_offsets, high_watermarks

        policy = self.starting_offsets
        if isinstance(policy, dict) and self.key in policy:
            return policy[self.key]
        tp = TopicPartition.from_key(self.key)
        if policy == "latest":
            return (await high_watermarks(self.cluster, [tp]))[self.key]
        return (await beginning_offsets(self.cluster, [tp]))[self.key]


def start_participants(
    config: Any, keys: Iterable[str], clusters: dict[str, ClusterMetadata]
) -> list[Any]:
    """Create (or find) the named, detached participants of ``keys`` for the sink pipeline
    ``config`` (a SinkPipelineConfig); ``clusters`` is the current metadata per cluster id.
    Returns their handles; callers wait for them (``status``) as suits them."""
    return [
        ParticipantActor.options(
            name=names.participant(config.name, key),
            namespace=names.NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            **config.placement.actor_options("participant"),
        ).remote(
            config.name,
            key,
            config.sink.location(),
            config.commit,
            clusters[TopicPartition.from_key(key).cluster],
            config.source.starting_offsets,
        )
        for key in keys
    ]
