"""The snapshot's own Kafka writes: a worker's rows with its chunk's progress, the plan.

Each write is one Kafka transaction of a producer whose transactional id is the worker's
(``chunk_offsets``): rows and source offsets commit together, as the task's do
(``actors.source_task``), with the same checks - every send stored where the broker said
(``confirm_stored``), then the commit within ``commit_timeout_s``. A producer that failed is
stopped, never reused: the worker's next write starts a new one, whose initialisation
fences the old one and aborts what it left open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from rayconnect.kafka.batched_send import send_page
from rayconnect.kafka.discovery import client_properties
from rayconnect.kafka.offsets_store import combined_offsets, offset_key, offset_value
from rayconnect.kafka.transactions import (
    confirm_stored,
    fence,
    init_transactions,
    producer,
    stop_quietly,
)
from rayconnect.source_tasks.base import encode_partition


class WriterTarget(Protocol):
    """The cluster written to (``config.source.KafkaTarget``)."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def properties(self) -> dict[str, str]: ...


class WriterSettings(Protocol):
    """What a chunk writer reads of its pipeline's settings: ``config.source.SourceSettings``
    has it (a Protocol, as ``config`` imports this package and not the other way)."""

    @property
    def name(self) -> str: ...
    @property
    def target(self) -> WriterTarget: ...
    @property
    def commit_timeout_s(self) -> float: ...
    @property
    def producer_properties(self) -> dict[str, str]: ...
    @property
    def own_offsets_topic(self) -> str: ...
    @property
    def global_offsets_topic(self) -> str: ...


#: (source partition, source offset) pairs a write commits
Offsets = Sequence[tuple[Any, Any]]


class PageRecords(msgspec.Struct, frozen=True):
    """A page's records: one topic, one headers list, keys (None: keyless) and values."""

    topic: str
    keys: list[bytes | None]
    values: list[bytes]
    headers: list[tuple[str, bytes | None]]


class ChunkWriter:
    """One transactional producer (``transactional_id``; None: plain, for a target
    without transactions) writing transactions of records and source offsets."""

    def __init__(self, settings: WriterSettings, transactional_id: str | None) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self._producer: Any = None

    async def _started(self) -> Any:
        if self._producer is None:
            s = self.settings
            p = producer(
                s.target.bootstrap_servers,
                self.transactional_id,
                request_timeout_ms=int(s.commit_timeout_s * 1000),
                **client_properties(s.producer_properties),
                **client_properties(s.target.properties),
            )
            await init_transactions(p, s.commit_timeout_s)
            self._producer = p
        return self._producer

    async def start(self) -> None:
        """Initialise the producer now: its id's predecessor (a dead worker) is fenced and
        its open transaction aborted at once - until then it holds read_committed readers
        of the partitions it wrote back (another worker reading the offsets, too)."""
        await self._started()

    async def write(self, pages: Sequence[PageRecords], offsets: Offsets) -> None:
        """``pages`` and ``offsets`` in one Kafka transaction, committed on return."""
        s = self.settings
        p = await self._started()
        transactional = self.transactional_id is not None
        try:
            if transactional:
                await p.begin_transaction()
            futures = []
            for page in pages:
                sent = await send_page(p, page.topic, page.keys, page.values, page.headers)
                futures += [b.future for b in sent]
            for partition, offset in offsets:
                key = offset_key(s.name, encode_partition(partition))
                futures.append(await p.send(s.own_offsets_topic, offset_value(offset), key=key))
            confirm_stored(await asyncio.wait_for(asyncio.gather(*futures), s.commit_timeout_s))
            if transactional:
                await asyncio.wait_for(p.commit_transaction(), s.commit_timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def committed(self) -> dict[str, Any]:
        """The pipeline's committed offsets (read_committed; after this producer's start,
        which fenced its predecessor: what it left is committed or aborted by now)."""
        await self._started()
        return await committed_offsets(self.settings)

    async def stop(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            await stop_quietly(p)


async def committed_offsets(settings: WriterSettings) -> dict[str, Any]:
    """The pipeline's committed offsets: its own topic over the global one."""
    offsets, _ = await combined_offsets(
        settings.target.bootstrap_servers,
        settings.own_offsets_topic,
        settings.global_offsets_topic,
        settings.name,
        **client_properties(settings.target.properties),
    )
    return offsets


async def fence_and_read(settings: WriterSettings, ids: list[str]) -> dict[str, Any]:
    """Fence ``ids`` (their holders' later commits are refused), then read the committed
    offsets: nothing the fenced producers did can change them any more."""
    client = client_properties(settings.target.properties)
    await fence(settings.target.bootstrap_servers, ids, settings.commit_timeout_s, **client)
    return await committed_offsets(settings)
