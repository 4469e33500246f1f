"""One exported snapshot read by several workers at once: which worker reads which chunk.

Made by the task (blocking: export, plan, start the workers) when it snapshots. It keeps the
exporting connection open - the snapshot lives as long as it - so a worker that replaces a
dead one imports the same snapshot, and everything one incarnation of the task writes is
at one LSN. A chunk is read by one worker at a time, page after page in key order, so its
``after`` only grows; the worker then takes the next chunk of the plan. ``pages`` hands the
task the pages that arrived, each already applied to its chunk's progress (``after``,
``done``) - the task puts them, with that progress, in one Kafka transaction.

A keyless table's chunks must all be in one Kafka transaction: ``may_commit`` is False
while some of them are received and others not (its rows have no key to resume by, and a
later snapshot could see a row moved between two ``ctid`` ranges: one transaction, as
before, keeps it exact). The plan lists them one after another, so that window is short.

Producing workers (``producing``: in a task actor) write their pages themselves, each page
with its chunk's progress in one transaction of the worker's (``snapshot_workers``); a
keyless table's chunks are one job of one worker, in one transaction. ``pages`` then only
applies the progress they committed and hands the task nothing to write. The plan is
committed (the task's source offset, by the ``-snapshot-plan`` producer) before any worker
starts, and again when this incarnation starts more workers than the plan says: a later
one fences every worker id that may have written.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Coroutine
from typing import Any

import msgspec

from rayconnect.source_tasks.postgres import catalog
from rayconnect.source_tasks.postgres.chunk_offsets import plan_id
from rayconnect.source_tasks.postgres.chunk_writer import ChunkWriter
from rayconnect.source_tasks.postgres.progress import Chunk, Progress
from rayconnect.source_tasks.postgres.settings import PostgresSettings
from rayconnect.source_tasks.postgres.snapshot import SnapshotReader
from rayconnect.source_tasks.postgres.snapshot_workers import (
    Page,
    Producing,
    Tables,
    WorkerLost,
    WorkerPool,
    Written,
)

log = logging.getLogger(__name__)


class ParallelSnapshot:
    def __init__(
        self,
        settings: PostgresSettings,
        progress: Progress,
        tables: Tables,
        order: list[str],
        parallelism: int,
        use_ray: bool,
        producing: Producing | None = None,
        partition: Any = None,
    ) -> None:
        """``producing``: the workers write (Ray actors); ``partition``: the task's source
        partition, which the plan is committed under then."""
        self.settings = settings
        self.progress = progress
        self.exporter, self.lsn, name = catalog.export_snapshot(settings)
        try:
            planned = not progress.chunks
            if planned:
                self._plan(name, tables, order)
                progress.plan = time.time_ns()
            progress.begin_chunks(self.lsn)
            shapes = tables.shapes
            self.keyless = {c.table for c in progress.chunks if not shapes[c.table].primary_key}
            self.todo = collections.deque(self._jobs(producing is not None))
            size = max(1, min(parallelism, len(self.todo)))
            if producing is not None:
                producing = msgspec.structs.replace(producing, plan=progress.plan)
                if planned or size > progress.snapshot_workers:
                    progress.snapshot_workers = max(size, progress.snapshot_workers)
                    self._commit_plan(producing, partition)
            self.pool = WorkerPool(settings, name, tables, size, use_ray, producing)
        except BaseException:
            self.exporter.close()
            raise
        self.producing = producing
        self._pending: dict[asyncio.Future[Any], tuple[int, list[int]]] = {}
        self._idle = list(range(len(self.pool.workers)))
        #: jobs whose worker died: their next worker first reads what it committed
        self._recover: set[int] = set()
        #: rows the producing workers committed
        self.rows_written = 0
        #: each worker's process, as its last page said
        self.pids: dict[int, int] = {}

    def _jobs(self, producing: bool) -> list[list[int]]:
        """Each unfinished chunk; a producing worker takes a keyless table's chunks as one
        job (one transaction)."""
        jobs: list[list[int]] = []
        grouped: dict[str, list[int]] = {}
        for i, chunk in enumerate(self.progress.chunks):
            if chunk.done:
                continue
            if producing and chunk.table in self.keyless:
                if chunk.table not in grouped:
                    grouped[chunk.table] = []
                    jobs.append(grouped[chunk.table])
                grouped[chunk.table].append(i)
            else:
                jobs.append([i])
        return jobs

    def _commit_plan(self, producing: Producing, partition: Any) -> None:
        """The plan (this offset) committed before a worker writes a chunk of it."""
        tid = plan_id(producing.transactional_id) if producing.transactional else None
        writer = ChunkWriter(producing.pipeline, tid)

        async def commit() -> None:
            try:
                await writer.write([], [(partition, self.progress.to_offset())])
            finally:
                await writer.stop()

        asyncio.run(commit())

    def _plan(self, name: str, tables: Tables, order: list[str]) -> None:
        """The chunks of every table still to read (from ``table``/``after`` of an offset
        written before chunks: the rest of that table and the ones after it)."""
        p, s = self.progress, self.settings
        first = p.table or 0
        reader = SnapshotReader(catalog.connect(s), name)
        try:
            for i, table in enumerate(order[first:]):
                start = p.after if i == 0 else None
                shape, types = tables.shapes[table], tables.sql_types[table]
                p.chunks += reader.plan(shape, types, s.snapshot_chunk_rows, start)
        finally:
            reader.close()
        p.table = p.after = None

    @property
    def done(self) -> bool:
        return not self._pending and not self.todo

    @property
    def may_commit(self) -> bool:
        """No keyless table is in the transaction in part."""
        for table in self.keyless:
            done = [c.done for c in self.progress.chunks if c.table == table]
            if any(done) and not all(done):
                return False
        return True

    def counts(self) -> tuple[int, int]:
        """(chunks done, chunks planned)."""
        chunks = self.progress.chunks
        return sum(c.done for c in chunks), len(chunks)

    def _ask(self, worker: int, job: list[int]) -> None:
        limit = self.settings.batch_size
        chunks = self.progress.chunks
        call: Coroutine[Any, Any, Page | Written]
        if self.producing is None:
            call = self.pool.page(worker, chunks[job[0]], limit, self.lsn)
        else:
            recover = job[0] in self._recover
            self._recover.discard(job[0])
            call = self.pool.write(worker, [(i, chunks[i]) for i in job], limit, self.lsn, recover)
        self._pending[asyncio.ensure_future(call)] = (worker, job)

    def _dispatch(self) -> None:
        while self._idle and self.todo:
            self._ask(self._idle.pop(), self.todo.popleft())

    async def pages(self, wait_s: float) -> list[tuple[Chunk, Page]]:
        """The pages that arrive within ``wait_s`` (at least one unless it passes), each
        applied to its chunk; the workers are asked for their next pages first."""
        self._dispatch()
        if not self._pending:
            return []
        done, _ = await asyncio.wait(
            self._pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
        )
        out: list[tuple[Chunk, Page]] = []
        for future in done:
            worker, job = self._pending.pop(future)
            try:
                result = future.result()
            except WorkerLost as e:  # its replacement is up: read the chunk again from `after`
                log.warning("postgres source %s: %s; chunk %d again", self.settings.slot, e, job[0])
                self.todo.appendleft(job)
                self._recover.add(job[0])
                self._idle.append(worker)
                continue
            if isinstance(result, Written):
                self._written(worker, job, result)
                continue
            page: Page = result
            index = job[0]
            self.pids[worker] = page.pid
            chunk = self.progress.chunks[index]
            if page.last_key is not None:
                chunk.after = page.last_key
            if page.exhausted:
                chunk.done = True
                self._idle.append(worker)
            else:
                self._ask(worker, job)
            out.append((chunk, page))
        self._dispatch()
        return out

    def _written(self, worker: int, job: list[int], written: Written) -> None:
        """A producing worker committed: its chunks' progress is what Kafka holds now."""
        self.pids[worker] = written.pid
        self.rows_written += written.rows
        for index, chunk in written.chunks:
            self.progress.chunks[index] = chunk
        if all(self.progress.chunks[i].done for i in job):
            self._idle.append(worker)
        else:
            self._ask(worker, job)

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending = {}
        try:
            self.pool.close()
        finally:
            self.exporter.close()
