"""Snapshot workers: several processes reading, encoding and writing chunks of the export.

The task (task 0, the one that then streams) keeps the exported snapshot open - its exporting
connection - and hands chunks to ``snapshot_parallelism`` workers, Ray actors spread over the
cluster (a ``WorkerCore`` in a thread when there is no Ray). A worker imports the snapshot
once and then, per request, reads a page of a chunk by ``COPY`` and encodes it into the
events' keys and values a page at a time (``events.read_events``: the same bytes the
stream's encoder writes).

Who writes the page to Kafka. In a task actor (``Producing``: the pipeline's settings are
known) the worker does: the page's records and the chunk's new progress (``chunk_offsets``)
in one transaction of its own producer (``chunk_writer``), and answers with the chunk's
progress - the task only plans, hands out chunks and tracks them, and the Kafka side scales
with the workers. Without (a task started outside a task actor) the worker answers with the
page's records and the task puts them with the chunk's progress in its own transaction.
Either way a page is in Kafka exactly when its chunk's progress is.

A worker that dies (``ray.kill``, SIGKILL, its node) loses the page it was reading and
nothing else: the task starts another worker, which imports the same snapshot, and asks it
for that chunk again from the chunk's progress - a producing worker first reads back what
its predecessor committed for the chunk (``recover``: the predecessor may have committed a
page it died before reporting), after its producer's start fenced the predecessor.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import msgspec

from rayconnect.errors import RayconnectError
from rayconnect.source_tasks.postgres import catalog
from rayconnect.source_tasks.postgres.chunk_offsets import (
    ChunkOffset,
    chunk_partition,
    committed_chunk,
    worker_id,
)
from rayconnect.source_tasks.postgres.chunk_writer import ChunkWriter, PageRecords, WriterSettings
from rayconnect.source_tasks.postgres.events import (
    EventBuilder,
    RowCodec,
    TableShape,
    key_values,
    read_events,
)
from rayconnect.source_tasks.postgres.page_events import PageCodec
from rayconnect.source_tasks.postgres.progress import Chunk, Key, comparable_key
from rayconnect.source_tasks.postgres.settings import PostgresSettings
from rayconnect.source_tasks.postgres.snapshot import SnapshotReader, SqlTypes


class WorkerLost(RayconnectError):
    """A snapshot worker died with a request open: its chunk is asked of another."""


class Page(msgspec.Struct, frozen=True):
    """A chunk's next rows, encoded: the records' keys and values in key order,
    ``last_key`` (the chunk's new ``after``) and whether the chunk has no more rows."""

    keys: list[bytes | None]
    values: list[bytes]
    last_key: Key | None
    exhausted: bool
    #: the worker's process (status shows the workers)
    pid: int = 0


class Producing(msgspec.Struct, frozen=True):
    """What a worker that writes its pages itself needs: the pipeline (target, offsets
    topics, the task's transactional id), whether it has transactions, and the plan."""

    pipeline: WriterSettings
    transactional: bool
    transactional_id: str
    plan: int


class Written(msgspec.Struct, frozen=True):
    """A producing worker's answer: the chunks it wrote (index, progress now committed)
    and how many rows that transaction held."""

    chunks: list[tuple[int, Chunk]]
    rows: int
    pid: int


class Tables(msgspec.Struct, frozen=True):
    """What a worker needs to know of the tables: their shapes and SQL types."""

    shapes: dict[str, TableShape]
    sql_types: dict[str, SqlTypes]
    database: str


class WorkerCore:
    """A worker's blocking work: one connection in the imported snapshot."""

    def __init__(self, settings: PostgresSettings, snapshot_name: str, tables: Tables) -> None:
        self.settings = settings
        self.tables = tables
        self.reader = SnapshotReader(catalog.connect(settings), snapshot_name)
        self.events = EventBuilder(
            settings.topic_prefix, settings.topic, settings.tombstones, tables.database
        )
        self.codecs: dict[str, RowCodec] = {}
        self.page_codecs: dict[str, PageCodec] = {}

    def page(self, chunk: Chunk, limit: int, lsn: int) -> Page:
        """A page of ``chunk``: read by COPY and encoded a column at a time
        (``page_events``; a table without columns a row at a time)."""
        shape = self.tables.shapes[chunk.table]
        types = self.tables.sql_types[chunk.table]
        codec = self.codecs.get(chunk.table)
        if codec is None:
            s = self.settings
            codec = self.codecs[chunk.table] = RowCodec(
                shape, s.unavailable_value, s.column_types == "header"
            )
            self.page_codecs[chunk.table] = PageCodec(shape)
        now_ms = int(time.time() * 1000)
        source = self.events.source(shape, lsn=lsn, txid=None, commit_ms=now_ms, snapshot=True)
        if shape.columns:
            columns = self.reader.read_columns(shape, types, chunk, limit)
            keys, values = self.page_codecs[chunk.table].events(columns, source, now_ms)
        else:
            rows = self.reader.read(shape, types, chunk, limit)
            keys, values = read_events(codec, rows, source, now_ms)
        last = keys[-1] if keys else None
        return Page(
            keys,
            values,
            comparable_key(key_values(last)) if last is not None else None,
            exhausted=not shape.primary_key or len(values) < limit,
            pid=os.getpid(),
        )

    def close(self) -> None:
        self.reader.close()


class ProducingCore:
    """A worker that writes its pages: a ``WorkerCore`` and its ``ChunkWriter``, whose
    asyncio work runs on the worker's own event loop (the worker's calls are blocking)."""

    def __init__(
        self, settings: PostgresSettings, snapshot_name: str, tables: Tables,
        producing: Producing, index: int,
    ) -> None:  # fmt: skip
        self.core = WorkerCore(settings, snapshot_name, tables)
        self.producing = producing
        tid = worker_id(producing.transactional_id, index) if producing.transactional else None
        self.writer = ChunkWriter(producing.pipeline, tid)
        self.loop = asyncio.new_event_loop()
        try:  # a replacement fences its dead predecessor before anything else
            self.loop.run_until_complete(self.writer.start())
        except BaseException:
            self.core.close()
            raise

    def write(self, job: list[tuple[int, Chunk]], limit: int, lsn: int, recover: bool) -> Written:
        """The next page of each chunk of ``job`` (one keyed chunk, or every chunk of a
        keyless table: all in one transaction) with their progress, committed.
        ``recover``: first take what a dead predecessor committed for the chunk."""
        if recover:
            ahead = self._committed(job, lsn)
            if ahead is not None:
                return ahead
        core, slot, plan = self.core, self.core.settings.slot, self.producing.plan
        pages: list[PageRecords] = []
        written: list[tuple[int, Chunk]] = []
        for index, chunk in job:
            page = core.page(chunk, limit, lsn)
            shape = core.tables.shapes[chunk.table]
            headers = list(core.codecs[chunk.table].headers)  # aiokafka's batches take lists
            pages.append(PageRecords(core.events.topic(shape), page.keys, page.values, headers))
            after = page.last_key if page.last_key is not None else chunk.after
            done = page.exhausted
            written.append((index, msgspec.structs.replace(chunk, after=after, done=done)))
        offsets = [
            (chunk_partition(slot, i), msgspec.to_builtins(ChunkOffset(plan, c)))
            for i, c in written
        ]
        self.loop.run_until_complete(self.writer.write(pages, offsets))
        return Written(written, sum(len(p.values) for p in pages), os.getpid())

    def _committed(self, job: list[tuple[int, Chunk]], lsn: int) -> Written | None:
        """The job's chunks as committed in Kafka, if that is ahead of what the task knew."""
        offsets = self.loop.run_until_complete(self.writer.committed())
        slot, plan = self.core.settings.slot, self.producing.plan
        found = [(i, committed_chunk(offsets, slot, plan, i) or chunk) for i, chunk in job]
        if all(mine == theirs for (_, mine), (_, theirs) in zip(job, found, strict=True)):
            return None
        for _, chunk in found:
            chunk.continue_at(lsn)
        return Written(found, 0, os.getpid())

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.writer.stop())
            self.loop.close()
        finally:
            self.core.close()


def _remote_worker() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")
    class SnapshotWorker:
        def __init__(
            self, settings: PostgresSettings, name: str, tables: Tables,
            producing: Producing | None = None, index: int = 0,
        ) -> None:  # fmt: skip
            if producing is None:
                self.core = WorkerCore(settings, name, tables)
            else:
                self.producer = ProducingCore(settings, name, tables, producing, index)

        def page(self, chunk: Chunk, limit: int, lsn: int) -> Page:
            return self.core.page(chunk, limit, lsn)

        def write(
            self, job: list[tuple[int, Chunk]], limit: int, lsn: int, recover: bool
        ) -> Written:
            return self.producer.write(job, limit, lsn, recover)

    return SnapshotWorker


class WorkerPool:
    """``size`` workers in the snapshot ``snapshot_name``; ``page(i, ...)`` / ``write(i,
    ...)`` ask worker ``i``, raising ``WorkerLost`` (after starting its replacement, with
    the same index: the same transactional id) if it died. ``producing``: the workers write
    their pages (Ray actors only)."""

    def __init__(
        self, settings: PostgresSettings, snapshot_name: str, tables: Tables, size: int,
        use_ray: bool, producing: Producing | None = None,
    ) -> None:  # fmt: skip
        assert use_ray or producing is None, "producing snapshot workers are Ray actors"
        self._args = (settings, snapshot_name, tables)
        self.use_ray = use_ray
        self.producing = producing
        self._cls = _remote_worker() if use_ray else None
        self.workers: list[Any] = [self._start(i) for i in range(size)]

    def _start(self, index: int) -> Any:
        if self._cls is not None:
            return self._cls.remote(*self._args, self.producing, index)
        return WorkerCore(*self._args)

    async def page(self, i: int, chunk: Chunk, limit: int, lsn: int) -> Page:
        worker = self.workers[i]
        if self._cls is None:
            page: Page = await asyncio.to_thread(worker.page, chunk, limit, lsn)
            return page
        page = await self._call(i, worker.page.remote(chunk, limit, lsn))
        return page

    async def write(
        self, i: int, job: list[tuple[int, Chunk]], limit: int, lsn: int, recover: bool
    ) -> Written:
        written: Written = await self._call(
            i, self.workers[i].write.remote(job, limit, lsn, recover)
        )
        return written

    async def _call(self, i: int, ref: Any) -> Any:
        import ray

        try:
            return await ref
        except ray.exceptions.RayActorError as e:
            self.workers[i] = self._start(i)
            raise WorkerLost(f"snapshot worker {i} died: {e}") from None

    def close(self) -> None:
        for worker in self.workers:
            try:
                if self._cls is None:
                    worker.close()
                else:
                    import ray

                    ray.kill(worker)
            except Exception:  # a worker already gone has nothing to close
                pass
        self.workers = []
