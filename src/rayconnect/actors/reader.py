"""Reader actor ``<pipeline>/reader/<cluster>/<i>``: one aiokafka consumer over its splits.

It owns no protocol state. Participants steer it (``seek``, ``pause``, ``resume``): a
partition is paused until its participant, which knows the round's offsets, resumes it. Each
poll becomes one Arrow batch per partition in the object store, handed to the participant
as a ref. The reader owns those objects (Ray 2.56 removed ``ray.put(_owner=...)``): when it
dies, the refs its participants buffered die too, their flushes fail and those partitions'
open round is not reported - the next START re-reads them from the table's offsets, so
nothing is lost or doubled. A restarted reader asks each participant where to resume
(``reader_attached``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from rayconnect.actors import names
from rayconnect.kafka.discovery import client_properties
from rayconnect.protocol.types import ClusterMetadata, TopicPartition

log = logging.getLogger(__name__)



@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class ReaderActor:
    async def __init__(
        self,
        pipeline: str,
        cluster_id: str,
        cluster: ClusterMetadata,
        partitions: list[str],
        max_poll_records: int = 50_000,
    ) -> None:
        self.pipeline = pipeline
        self.cluster_id = cluster_id
        self.cluster = cluster
        self.keys = list(partitions)
        self.max_poll_records = max_poll_records
        self.started_at = time.time()
        self.records_read = 0
        self.bytes_read = 0
        self._consumer: Any = None
        self._tps: dict[str, Any] = {}
        self._participants: dict[str, Any] = {}
        self._resumed: set[str] = set()
        # Where each partition's next batch starts: the seek target, then the end of the
        # last batch. Not the first record's offset: transaction markers and compaction
        # leave holes, and the participant accepts only batches that start where it is.
        self._next: dict[str, int] = {}
        # Seeks per partition: a poll that was in flight across a seek returns records of
        # the old position, which must not be labelled with the new one.
        self._seeks: dict[str, int] = {}
        self._attached = asyncio.Event()
        self._error: str | None = None
        # Started here, not by a call: Ray re-runs __init__ when it restarts this actor.
        self._task = asyncio.get_running_loop().create_task(self._main())

    async def _main(self) -> None:
        while not self._attached.is_set():
            try:
                await self._attach()
            except Exception as e:  # broker down, participant restarting: retry
                self._error = f"attach failed: {type(e).__name__}: {e}"
                log.warning("reader %s/%s: %s", self.pipeline, self.cluster_id, self._error)
                if self._consumer is not None:
                    await self._consumer.stop()
                    self._consumer = None
                await asyncio.sleep(1.0)
        self._error = None
        await self._run()

    async def _attach(self) -> None:
        """Connect, assign every split paused, then ask each participant where to resume."""
        from aiokafka import AIOKafkaConsumer
        from aiokafka import TopicPartition as KafkaTP

        from rayconnect.kafka import compat

        compat.apply()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.cluster.bootstrap_servers,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            **client_properties(self.cluster.properties),
        )
        await self._consumer.start()
        for key in self.keys:
            tp = TopicPartition.from_key(key)
            self._tps[key] = KafkaTP(tp.topic, tp.partition)
            self._participants[key] = ray.get_actor(
                names.participant(self.pipeline, key), namespace=names.NAMESPACE
            )
        self._consumer.assign(list(self._tps.values()))
        self._consumer.pause(*self._tps.values())
        me = ray.get_runtime_context().current_actor
        keys = list(self._participants)
        answers = await asyncio.gather(
            *(self._participants[k].reader_attached.remote(me) for k in keys)
        )
        for key, (offset, resume) in zip(keys, answers, strict=True):
            if offset is not None:
                await self.seek(key, offset)
            if resume:
                await self.resume(key)
        self._attached.set()

    async def ready(self, timeout_s: float = 60.0) -> bool:
        """Wait until the reader is attached to its participants."""
        try:
            await asyncio.wait_for(self._attached.wait(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"reader not attached after {timeout_s} s: {self._error}") from None
        return True

    async def seek(self, key: str, offset: int) -> None:
        self._consumer.seek(self._tps[key], offset)
        self._next[key] = offset
        self._seeks[key] = self._seeks.get(key, 0) + 1

    async def pause(self, key: str) -> None:
        self._resumed.discard(key)
        self._consumer.pause(self._tps[key])

    async def resume(self, key: str) -> None:
        self._resumed.add(key)
        self._consumer.resume(self._tps[key])

    async def _run(self) -> None:
        from rayconnect.kafka.to_arrow import records_to_batch

        while True:
            try:
                if not self._resumed:
                    await asyncio.sleep(0.05)
                    continue
                seeks_before = dict(self._seeks)
                fetched = await self._consumer.getmany(
                    timeout_ms=200, max_records=self.max_poll_records
                )
                handed: list[tuple[str, int, Any]] = []
                for tp, records in fetched.items():
                    if not records:
                        continue
                    key = TopicPartition(self.cluster_id, tp.topic, tp.partition).key
                    if self._seeks.get(key) != seeks_before.get(key):
                        continue  # moved meanwhile: the consumer reads from the new place
                    if key not in self._resumed:
                        # Paused meanwhile: rewind, so the consumer stays where the
                        # participant believes this partition is.
                        if key in self._next:
                            self._consumer.seek(tp, self._next[key])
                        continue
                    batch = records_to_batch(self.cluster_id, records)
                    ref = ray.put(batch)
                    first = self._next.get(key, records[0].offset)
                    self._next[key] = records[-1].offset + 1
                    self.records_read += len(records)
                    self.bytes_read += batch.nbytes
                    call = self._participants[key].records.remote(
                        first, self._next[key], len(records), batch.nbytes, [ref]
                    )
                    handed.append((key, first, call))
                results = await asyncio.gather(*(c for _, _, c in handed), return_exceptions=True)
                for (key, first, _), result in zip(handed, results, strict=True):
                    if isinstance(result, BaseException):
                        # Not handed over (the participant is restarting): read it again.
                        self._error = f"{key}: {type(result).__name__}: {result}"
                        if self._seeks.get(key) == seeks_before.get(key):
                            self._next[key] = first
                            self._consumer.seek(self._tps[key], first)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep reading; the participant/coordinator recover
                self._error = f"{type(e).__name__}: {e}"
                log.exception("reader %s/%s poll failed", self.pipeline, self.cluster_id)
                # What this poll fetched was not handed over: read it again.
                for key, offset in self._next.items():
                    self._consumer.seek(self._tps[key], offset)
                await asyncio.sleep(0.5)

    async def status(self) -> dict[str, Any]:
        lag: dict[str, dict[str, int | None]] = {}
        for key, tp in self._tps.items():
            hw = self._consumer.highwater(tp) if self._consumer else None
            try:
                pos = await self._consumer.position(tp) if key in self._resumed else None
            except Exception:
                pos = None
            lag[key] = {"position": pos, "high_watermark": hw}
        return {
            "cluster": self.cluster_id,
            "splits": self.keys,
            "resumed": sorted(self._resumed),
            "records_read": self.records_read,
            "bytes_read": self.bytes_read,
            "started_at": self.started_at,
            "error": self._error,
            "partitions": lag,
        }

    async def close(self) -> None:
        self._task.cancel()
        if self._consumer:
            await self._consumer.stop()


