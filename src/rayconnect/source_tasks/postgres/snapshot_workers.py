"""Snapshot workers: several processes reading and encoding chunks of the exported snapshot.

The task (task 0, the one that then streams) keeps the exported snapshot open - its exporting
connection - and hands chunks to ``snapshot_parallelism`` workers, Ray actors spread over the
cluster (``LocalWorker``, a thread, when there is no Ray). A worker imports the snapshot once
and then, per request, reads a page of a chunk by ``COPY`` and encodes it into the events'
keys and values a page at a time (``events.read_events``: the same bytes the stream's
encoder writes). It writes nothing: the task puts each page's records and the chunk's new
progress into its Kafka transaction, so a page is in Kafka exactly when its progress is. A
worker that dies (``ray.kill``, SIGKILL, its node) loses the page it was reading and nothing
else: the task starts another worker, which imports the same snapshot, and asks it for that
chunk again from the chunk's progress.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import msgspec

from rayconnect.errors import RayconnectError
from rayconnect.source_tasks.postgres import catalog
from rayconnect.source_tasks.postgres.events import (
    EventBuilder,
    RowCodec,
    TableShape,
    key_values,
    read_events,
)
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

    def page(self, chunk: Chunk, limit: int, lsn: int) -> Page:
        shape = self.tables.shapes[chunk.table]
        rows = self.reader.read(shape, self.tables.sql_types[chunk.table], chunk, limit)
        codec = self.codecs.get(chunk.table)
        if codec is None:
            s = self.settings
            codec = self.codecs[chunk.table] = RowCodec(
                shape, s.unavailable_value, s.column_types == "header"
            )
        now_ms = int(time.time() * 1000)
        source = self.events.source(shape, lsn=lsn, txid=None, commit_ms=now_ms, snapshot=True)
        keys, values = read_events(codec, rows, source, now_ms)
        last = keys[-1] if keys else None
        return Page(
            keys,
            values,
            comparable_key(key_values(last)) if last is not None else None,
            exhausted=not shape.primary_key or len(rows) < limit,
            pid=os.getpid(),
        )

    def close(self) -> None:
        self.reader.close()


def _remote_worker() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")
    class SnapshotWorker:
        def __init__(self, settings: PostgresSettings, name: str, tables: Tables) -> None:
            self.core = WorkerCore(settings, name, tables)

        def page(self, chunk: Chunk, limit: int, lsn: int) -> Page:
            return self.core.page(chunk, limit, lsn)

    return SnapshotWorker


class WorkerPool:
    """``size`` workers in the snapshot ``snapshot_name``; ``page(i, ...)`` asks worker
    ``i``, raising ``WorkerLost`` (after starting its replacement) if it died."""

    def __init__(
        self, settings: PostgresSettings, snapshot_name: str, tables: Tables, size: int,
        use_ray: bool,
    ) -> None:  # fmt: skip
        self._args = (settings, snapshot_name, tables)
        self.use_ray = use_ray
        self._cls = _remote_worker() if use_ray else None
        self.workers: list[Any] = [self._start() for _ in range(size)]

    def _start(self) -> Any:
        if self._cls is not None:
            return self._cls.remote(*self._args)
        return WorkerCore(*self._args)

    async def page(self, i: int, chunk: Chunk, limit: int, lsn: int) -> Page:
        worker = self.workers[i]
        if self._cls is None:
            page: Page = await asyncio.to_thread(worker.page, chunk, limit, lsn)
            return page
        import ray

        try:
            page = await worker.page.remote(chunk, limit, lsn)
            return page
        except ray.exceptions.RayActorError as e:
            self.workers[i] = self._start()
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
