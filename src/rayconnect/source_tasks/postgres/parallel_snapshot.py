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
"""

from __future__ import annotations

import asyncio
import collections
import logging

from rayconnect.source_tasks.postgres import catalog
from rayconnect.source_tasks.postgres.progress import Chunk, Progress
from rayconnect.source_tasks.postgres.settings import PostgresSettings
from rayconnect.source_tasks.postgres.snapshot import SnapshotReader
from rayconnect.source_tasks.postgres.snapshot_workers import Page, Tables, WorkerLost, WorkerPool

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
    ) -> None:
        self.settings = settings
        self.progress = progress
        self.exporter, self.lsn, name = catalog.export_snapshot(settings)
        try:
            if not progress.chunks:
                self._plan(name, tables, order)
            progress.begin_chunks(self.lsn)
            self.todo = collections.deque(i for i, c in enumerate(progress.chunks) if not c.done)
            size = max(1, min(parallelism, len(self.todo)))
            self.pool = WorkerPool(settings, name, tables, size, use_ray)
        except BaseException:
            self.exporter.close()
            raise
        self.keyless = {c.table for c in progress.chunks if not tables.shapes[c.table].primary_key}
        self._pending: dict[asyncio.Future[Page], tuple[int, int]] = {}
        self._idle = list(range(len(self.pool.workers)))
        #: each worker's process, as its last page said
        self.pids: dict[int, int] = {}

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

    def _ask(self, worker: int, index: int) -> None:
        chunk: Chunk = self.progress.chunks[index]
        limit = self.settings.batch_size
        future = asyncio.ensure_future(self.pool.page(worker, chunk, limit, self.lsn))
        self._pending[future] = (worker, index)

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
            worker, index = self._pending.pop(future)
            try:
                page = future.result()
            except WorkerLost as e:  # its replacement is up: read the chunk again from `after`
                log.warning("postgres source %s: %s; chunk %d again", self.settings.slot, e, index)
                self.todo.appendleft(index)
                self._idle.append(worker)
                continue
            self.pids[worker] = page.pid
            chunk = self.progress.chunks[index]
            if page.last_key is not None:
                chunk.after = page.last_key
            if page.exhausted:
                chunk.done = True
                self._idle.append(worker)
            else:
                self._ask(worker, index)
            out.append((chunk, page))
        self._dispatch()
        return out

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending = {}
        try:
            self.pool.close()
        finally:
            self.exporter.close()
