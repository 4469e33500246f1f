"""PostgresSource: a PostgreSQL database's changes into Kafka, exactly once, from the WAL.

Runs with ``transaction_boundary="connector"`` (the pipeline file / constructor of the
pipeline must say so; ``start`` refuses otherwise) and one task (task 0 reads the slot;
others would idle). Phases: the snapshot (``op: r``), then the slot's pgoutput stream. The
snapshot is read in chunks by ``snapshot_parallelism`` workers at once (``parallel_snapshot``,
``snapshot_workers``); the task writes each page they read, with the chunk's progress, in
its Kafka transactions (one a poll: the pages that arrived). A Kafka transaction ends only at
a Postgres commit - several small Postgres transactions may share one - unless one
Postgres transaction has more than ``max_records_per_transaction`` changes: it is then split
there, and a read_committed reader sees its first part before the rest. The source offset
(``progress.Progress``) is committed with the records; the slot's confirmed flush LSN moves
only in ``commit()``, after Kafka committed, to the commit LSN of the last transaction
written (Postgres then sends that one again on restart, and the offset skips it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Any

from rayconnect import ray_internals
from rayconnect.errors import ConfigError, OffsetsOutOfRangeError
from rayconnect.kafka.topics import TopicSpec
from rayconnect.source_tasks.base import (
    ConfiguredTask,
    SourceLag,
    SourceRecord,
    SourceTaskContext,
    encode_partition,
)
from rayconnect.source_tasks.cut_markers import cut_markers
from rayconnect.source_tasks.postgres import catalog, window_reader
from rayconnect.source_tasks.postgres.change_records import ChangeRecords
from rayconnect.source_tasks.postgres.chunk_offsets import merge_committed, snapshot_ids
from rayconnect.source_tasks.postgres.chunk_writer import fence_and_read
from rayconnect.source_tasks.postgres.events import (
    EventBuilder,
    Headers,
    RowCodec,
    TableShape,
    key_values,
)
from rayconnect.source_tasks.postgres.incremental_snapshot import (
    Window,
    decode_request,
    request_prefix,
    watermark_prefix,
)
from rayconnect.source_tasks.postgres.parallel_snapshot import ParallelSnapshot
from rayconnect.source_tasks.postgres.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Relation,
    Truncate,
    Update,
    decode,
    format_lsn,
    ms_of,
    parse_lsn,
)
from rayconnect.source_tasks.postgres.progress import Progress, comparable_key
from rayconnect.source_tasks.postgres.settings import PostgresSettings
from rayconnect.source_tasks.postgres.snapshot import SqlTypes
from rayconnect.source_tasks.postgres.snapshot_workers import Producing, Tables
from rayconnect.source_tasks.postgres.stream import WalStream
from rayconnect.source_tasks.postgres.window_reader import WindowReader

#: how long a task waits at start for the walsender of its killed predecessor to end
SLOT_RELEASE_WAIT_S = 30.0
#: a poll in the middle of a Postgres transaction waits this long for its next message
POLL_BUDGET_S = 0.5


log = logging.getLogger(__name__)


class PostgresSource(ConfiguredTask[PostgresSettings]):
    settings_type = PostgresSettings
    transaction_boundary = "connector"

    @property
    def source_partition(self) -> dict[str, str]:
        return {"postgres": self.settings.slot}

    # -- outside the actor ----------------------------------------------------------------

    def check(self) -> None:
        """The pre-start checks (ConfigError naming the setting), from the starting
        process: Postgres reachable, wal_level, permission, tables, slot free."""
        conn = catalog.connect(self.settings)
        try:
            catalog.check(self.settings, conn)
        finally:
            conn.close()

    def drop_slot(self, wait_s: float = 30.0) -> bool:
        """Drop the replication slot (and so stop Postgres keeping WAL for it): for a
        pipeline deleted for good. A later start snapshots again. False if there was none.
        The publication goes too when it is the pipeline's own (``own_publication``)."""
        conn = catalog.connect(self.settings)
        try:
            dropped = catalog.drop_slot(self.settings, conn, wait_s=wait_s)
            if self.settings.own_publication:
                catalog.drop_publication(self.settings, conn)
            return dropped
        finally:
            conn.close()

    async def release(self) -> None:
        await asyncio.to_thread(self.drop_slot)

    # -- the task ---------------------------------------------------------------------------

    async def start(self, context: SourceTaskContext) -> None:
        self.context = context
        self.active = context.task_index == 0
        self._stream: WalStream | None = None
        self._snapshot: ParallelSnapshot | None = None
        self._flushes: collections.deque[int] = collections.deque()
        self._last_commit_ms: int | None = None
        self._records_polled = self._truncates_skipped = 0
        #: snapshot rows the workers committed, of snapshots finished in this incarnation
        self._rows_written = 0
        if not self.active:
            return
        if context.transaction_context is None:
            raise ConfigError(
                "transaction_boundary: the postgres source needs 'connector' (a Postgres "
                "transaction is one Kafka transaction)"
            )
        committed = context.offset(self.source_partition)
        chunk_offsets: dict[str, Any] = {}
        if self._producing() is not None:
            chunk_offsets = await self._fenced_offsets(committed)
            committed = chunk_offsets.get(encode_partition(self.source_partition))
        await asyncio.to_thread(self._prepare, committed, chunk_offsets)

    def _producing(self) -> Producing | None:
        """The snapshot workers write their chunks themselves in a task actor (the
        pipeline's settings known, Ray up); else the task writes what they read."""
        import ray

        context = self.context
        pipeline = context.pipeline_settings
        if pipeline is None or not ray.is_initialized():
            return None
        tid = pipeline.transactional_id(context.task_index)
        return Producing(pipeline, context.transactional, tid, plan=0)

    def helper_transactional_ids(self, transactional_id: str) -> list[str]:
        """The snapshot's ids (``chunk_offsets``): as many workers as this start may use or
        an earlier start of this task used (``_remember_workers``)."""
        workers = max(self._parallelism(), _workers_used(transactional_id))
        return snapshot_ids(transactional_id, workers)

    async def _fenced_offsets(self, committed: Any) -> dict[str, Any]:
        """The offsets, read again if the committed plan has more snapshot workers than the
        runner fenced (``helper_transactional_ids``) - once those are fenced too."""
        producing = self._producing()
        assert producing is not None
        fenced = max(self._parallelism(), _workers_used(producing.transactional_id))
        offsets = dict(self.context.offsets)
        workers = Progress.from_offset(committed).snapshot_workers if committed else 0
        while workers > fenced:
            ids = snapshot_ids(producing.transactional_id, workers)
            offsets = await fence_and_read(producing.pipeline, ids)
            fenced = workers
            found = offsets.get(encode_partition(self.source_partition))
            workers = Progress.from_offset(found).snapshot_workers if found else 0
        return offsets

    def _prepare(self, committed: Any, chunk_offsets: dict[str, Any]) -> None:
        s = self.settings
        #: tables found while streaming that are not captured, and why (``route_keys_for``:
        #: no primary key); looked at again at each discovery
        self.refused: dict[str, str] = {}
        conn = catalog.connect(s)
        try:
            catalog.check(s, conn, slot_wait_s=SLOT_RELEASE_WAIT_S)
            catalog.ensure_publication(s, conn)
            self.tables = catalog.tables_of(s, conn)
            resumed = None if committed is None else Progress.from_offset(committed)
            if resumed is not None and resumed.chunks:  # what the workers committed since
                merge_committed(resumed, chunk_offsets, s.slot)
            if resumed is not None:  # and the tables added to the publication since
                known = set(resumed.known) - {f"{schema}.{table}" for schema, table in self.tables}
                self.tables += [
                    (schema, table)
                    for schema, table in sorted(
                        catalog.tables_of_publication(conn, s.publication_name)
                    )
                    if f"{schema}.{table}" in known
                ]
            self.shapes: dict[str, TableShape] = {}
            self.sql_types: dict[str, dict[str, tuple[str, bool]]] = {}
            for schema, table in self.tables:
                shape, types = catalog.table_shape(conn, schema, table)
                self.shapes[shape.name] = shape
                self.sql_types[shape.name] = types
                self._publish_key(shape)
            start_over = resumed is not None and self._out_of_range(conn, resumed)
            catalog.ensure_slot(s, conn)
            (self.database,) = catalog.query(conn, "SELECT current_database()")[0]
        finally:
            conn.close()
        self.events = EventBuilder(s.topic_prefix, s.topic, s.tombstones, self.database)
        self.relations: dict[int, RowCodec] = {}
        self._codecs: dict[str, RowCodec] = {}
        if start_over and s.offsets_out_of_range == "snapshot":
            self.progress = Progress(table=0) if self.tables else Progress()
        elif start_over:  # latest: the new slot's stream, from now on
            self.progress = Progress()
        elif resumed is not None:
            self.progress = resumed
        elif s.snapshot and self.tables:
            self.progress = Progress(table=0)
        else:
            self.progress = Progress()
        if not self.progress.known:  # a new offset, or one from before ``known``
            self.progress.known = [f"{schema}.{table}" for schema, table in self.tables]
        if self.progress.snapshotting:
            self._begin_snapshot()
        else:
            self._begin_stream()

    def _parallelism(self) -> int:
        """``snapshot_parallelism``, or as many workers as the cluster has CPUs."""
        if self.settings.snapshot_parallelism is not None:
            return self.settings.snapshot_parallelism
        import ray

        if not ray.is_initialized():
            return 1
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def _out_of_range(self, conn: Any, resumed: Progress) -> bool:
        """Can the slot serve the committed offsets? No when it is gone (the changes since
        the committed LSN went with it) or the committed LSN is past the server's WAL end
        (another database, or one restored from a backup). Then by ``offsets_out_of_range``:
        raise (``fail``; nothing is created, so the next start finds the same), or True (start
        over: the caller snapshots again or streams from the new slot)."""
        s = self.settings
        (current,) = catalog.query(conn, "SELECT pg_current_wal_lsn()::text")[0]
        end = parse_lsn(current)
        exists = catalog.slot_exists(s, conn)
        committed = max(resumed.lsn, resumed.highest_segment_lsn())
        if exists and committed <= end:
            return False
        problem = (
            f"replication slot {s.slot!r} does not exist: the changes after the committed "
            f"LSN {format_lsn(committed)} went with it (the server's WAL is at "
            f"{format_lsn(end)})"
            if not exists
            else f"the committed LSN {format_lsn(committed)} is past the server's WAL end "
            f"{format_lsn(end)}: another database, or one restored from a backup"
        )
        if s.offsets_out_of_range == "fail":
            raise OffsetsOutOfRangeError(
                f"{problem}; stopping (offsets_out_of_range: fail - set it to 'snapshot' to "
                "start over with a new snapshot, or 'latest' to stream from now on)"
            )
        log.error("postgres source %s: %s; %s", s.slot, problem, s.offsets_out_of_range)
        return True

    def _begin_snapshot(self) -> None:
        """A new exported snapshot, its chunks planned (or the committed plan's unfinished
        ones, each continuing from its key in a new segment at the snapshot's LSN: see
        ``progress``), its workers started."""
        import ray

        tables = Tables(self.shapes, self.sql_types, self.database)
        order = [f"{schema}.{table}" for schema, table in self.tables]
        self._source_partition = self.source_partition
        producing = self._producing()
        if producing is not None:  # before any of them writes: a later start fences them
            _remember_workers(producing.transactional_id, self._parallelism())
        self._snapshot = ParallelSnapshot(
            self.settings, self.progress, tables, order, self._parallelism(),
            ray.is_initialized(), producing, self._source_partition,
        )  # fmt: skip

    def _begin_stream(self) -> None:
        self._stream = WalStream(self.settings, self.settings.publication_name)
        self._highest_segment = self.progress.highest_segment_lsn()
        self._segments_offset = self.progress.to_offset().get("segments")
        #: the chunk read between watermarks, until the stream meets its high one
        self._window: Window | None = None
        self._window_reader: WindowReader | None = None
        self._watermarks = watermark_prefix(self.settings.slot)
        self._requests = request_prefix(self.settings.slot)
        self._discover_at = 0.0  # the first poll looks for tables added while down
        self._refresh_extra()
        self._txn: Begin | None = None
        self._n = -1
        #: plain inserts and updates as records in one step (``change_records``)
        self._source_partition = self.source_partition
        self._changes = ChangeRecords(self.events, self._source_partition)
        #: the transaction under way is new (none of it written before a restart, nor in
        #: the snapshot's segments): its plain changes take the one step
        self._fresh = False
        #: the source block of each table's events in the transaction under way
        self._sources: dict[str, bytes] = {}
        self._now_ms = 0
        self._open = 0
        self._poll_bytes = 0

    async def poll(self) -> list[SourceRecord]:
        if not self.active:
            await asyncio.sleep(self.settings.idle_s)
            return []
        if self.progress.snapshotting:
            return await self._snapshot_poll()
        return await self._stream_poll()

    # -- snapshot ---------------------------------------------------------------------------

    async def _snapshot_poll(self) -> list[SourceRecord]:
        """The pages the workers read since the last poll, as records that all carry the
        progress after them (they commit together); the transaction ends here unless a
        keyless table is in it in part. The last poll starts the stream."""
        snap, p = self._snapshot, self.progress
        assert snap is not None
        pages = await snap.pages(POLL_BUDGET_S)
        if snap.done:
            self._rows_written += snap.rows_written
            snap.close()
            self._snapshot = None
            p.finish_snapshot()
            await asyncio.to_thread(self._begin_stream)
        offset = p.to_offset()
        partition = self._source_partition
        records: list[SourceRecord] = []
        for chunk, page in pages:
            shape = self.shapes[chunk.table]
            topic, headers = self.events.topic(shape), self._codec(shape).headers
            records += [
                SourceRecord(
                    topic, value, key=key, partition=None if key is not None else 0,
                    headers=headers, source_partition=partition, source_offset=offset,
                )
                for key, value in zip(page.keys, page.values, strict=True)
            ]  # fmt: skip
        txn = self.context.transaction_context
        if records and txn is not None and (snap.done or snap.may_commit):
            txn.commit_transaction()
            self._flushes.append(0)
        self._records_polled += len(records)
        return records

    # -- stream -----------------------------------------------------------------------------

    def _refresh_extra(self) -> None:
        """What every stream record's offset carries besides its place: the tables known
        and those still to snapshot while streaming. Changed: not saved until a record
        carries it (the slot is not confirmed past it before: ``_caught_up``)."""
        p = self.progress
        extra: dict[str, Any] = {"known": list(p.known)}
        if p.pending:
            extra["pending"] = list(p.pending)
            if p.pending_after is not None:
                extra["pending_after"] = list(p.pending_after)
        self._extra = extra
        self._extra_saved = False

    async def _between_transactions(self) -> None:
        """Look for tables added to the publication (every ``discovery_interval_s``), and
        read the next chunk of a table to snapshot while streaming."""
        s = self.settings
        if time.monotonic() >= self._discover_at:
            self._discover_at = time.monotonic() + s.discovery_interval_s
            added = await asyncio.to_thread(self._added_tables)
            if added:
                for (schema, table), (shape, types) in added.items():
                    if (schema, table) not in self.tables:
                        self.tables.append((schema, table))
                    self.refused.pop(shape.name, None)
                    self.shapes[shape.name] = shape
                    self.sql_types[shape.name] = types
                self._request([shape.name for shape, _ in added.values()])
        if self._window is None and self.progress.pending:
            self._window = await asyncio.to_thread(self._read_window)

    def _added_tables(self) -> dict[tuple[str, str], tuple[TableShape, SqlTypes]]:
        """Tables of the publication not yet known, with their shapes, their keys
        published (blocking). With ``route_keys_for`` a table without a primary key is
        refused instead (and looked at again next time: a key may be added)."""
        conn = catalog.connect(self.settings)
        try:
            known = set(self.progress.known)
            found = catalog.tables_of_publication(conn, self.settings.publication_name)
            added = {
                (schema, table): catalog.table_shape(conn, schema, table)
                for schema, table in sorted(found)
                if f"{schema}.{table}" not in known
            }
        finally:
            conn.close()
        for where, (shape, _) in list(added.items()):
            if not self._publish_key(shape):
                del added[where]
        return added

    def _publish_key(self, shape: TableShape) -> bool:
        """With ``route_keys_for``: ``shape``'s primary key published for the sink that
        keys its table by it (``route_keys``), before any record of it; False (the table
        refused, logged once) for a table without one. Blocking (a GCS write)."""
        sink = self.settings.route_keys_for
        if sink is None:
            return True
        if not shape.primary_key:
            if shape.name not in self.refused:
                self.refused[shape.name] = (
                    f"{shape.name} is not captured: it has no primary key, and sink pipeline "
                    f"{sink} keeps each table's rows by key (add a primary key: it is "
                    "captured and snapshotted then)"
                )
                log.error("postgres source %s: %s", self.settings.slot, self.refused[shape.name])
            return False
        from rayconnect import route_keys
        from rayconnect.source_tasks.postgres.column_types import lake_type

        types = {c.name: lake_type(c.type_oid, c.type_modifier) for c in shape.columns}
        key = {name: types[name] for name in shape.primary_key}
        route_keys.publish(sink, self.settings.topic(shape.schema, shape.table), key)
        self.refused.pop(shape.name, None)  # (it may have gained its key since)
        return True

    def _request(self, tables: list[str]) -> None:
        """Snapshot ``tables`` while streaming: those captured (a table without a key by
        heap page ranges: ``incremental_snapshot``)."""
        names = [t if "." in t else f"public.{t}" for t in tables]
        ok = [t for t in names if t in self.shapes and t not in self.refused]
        for name in sorted(set(names) - set(ok)):
            log.error(
                "postgres source %s: no snapshot of %s while streaming: it is not captured",
                self.settings.slot,
                name,
            )
        self.progress.known += [
            t for t in names if t in self.shapes and t not in self.progress.known
        ]
        if self.progress.request(ok):
            log.info("postgres source %s: snapshot while streaming: %s", self.settings.slot, ok)
        self._refresh_extra()

    def _read_window(self) -> Window:
        """The next chunk of the first pending table, read between watermarks (blocking)."""
        if self._window_reader is None:
            self._window_reader = WindowReader(self.settings, self.events)
        name = self.progress.pending[0]
        shape = self.shapes[name]
        window_id, chunk = self._window_reader.read(
            shape, self.sql_types[name], self._codec_of(shape), self.progress.pending_after
        )
        return Window(window_id, chunk)

    def _codec_of(self, shape: TableShape) -> RowCodec:
        """``shape``'s codec, made once per shape."""
        cached = self._codecs.get(shape.name)
        if cached is None or cached.shape is not shape:
            cached = self._codecs[shape.name] = self._codec(shape)
        return cached

    def _on_logical_message(self, message: LogicalMessage, records: list[SourceRecord]) -> None:
        """A watermark (the window's high one: its chunk goes out here) or a request to
        snapshot tables. Each is a change of its transaction, as a row's is."""
        txn = self._txn
        if not message.transactional or txn is None:
            return
        self._n += 1
        if self.progress.already_written(txn.final_lsn, self._n):
            return
        if message.prefix == self._watermarks:
            window = self._window
            if window is not None and window.on_watermark(message.content):
                self._window = None
                self._emit_window(window, records)
        elif message.prefix == self._requests:
            self._request(decode_request(message.content))

    def _emit_window(self, window: Window, records: list[SourceRecord]) -> None:
        """The chunk's rows not changed in the window, as ``op: r`` records with the
        table's progress after them, here in the stream."""
        txn = self._txn
        assert txn is not None
        chunk = window.chunk
        self.progress.chunk_written(chunk.last_key, chunk.exhausted)
        self._refresh_extra()
        keys, values = window.rows()
        if not keys:
            return
        lsn = txn.final_lsn
        offset = {"lsn": lsn, "n": self._n, **self._extra}
        shape = self.shapes[chunk.table]
        topic, headers = self.events.topic(shape), self._codec_of(shape).headers
        partition = self.source_partition
        records += [
            SourceRecord(
                topic, value, key=key, partition=None if key is not None else 0,
                headers=headers, source_partition=partition, source_offset=offset,
            )
            for key, value in zip(keys, values, strict=True)
        ]  # fmt: skip
        self._extra_saved = True
        self._open += len(keys)
        self._flush_point = lsn
        if chunk.exhausted:
            log.info(
                "postgres source %s: %s snapshotted while streaming",
                self.settings.slot,
                chunk.table,
            )

    async def _stream_poll(self) -> list[SourceRecord]:
        stream = self._stream
        assert stream is not None
        if self._txn is None:
            await self._between_transactions()
        records: list[SourceRecord] = []
        limit, bound = self.settings.batch_size, self.settings.max_records_per_transaction
        max_bytes = self.settings.batch_bytes
        deadline = time.monotonic() + POLL_BUDGET_S
        self._poll_bytes = 0
        one_step = self._changes.record
        # The flush policy: a poll - one Kafka transaction - ends at the first Postgres
        # commit after batch_size records or batch_bytes of events, or as soon as the stream
        # has nothing more (at a low rate each Postgres transaction is in Kafka at once).
        # Not mid-transaction: a poll that ends inside one cannot end the Kafka
        # transaction, and with a backlog every poll would.
        while self._open < bound and not (
            (len(records) >= limit or self._poll_bytes >= max_bytes) and self._txn is None
        ):
            payload = stream.read()
            if payload is None:
                if self._txn is None and records:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await stream.wait(min(remaining, self.settings.idle_s))
                if self._txn is None and not records and not self._flushes:
                    self._caught_up(stream)
                continue
            kind = payload[0]  # an insert or update of a new transaction: in one step
            if (kind == 0x49 or kind == 0x55) and self._fresh and self._window is None:
                begun = self._txn
                assert begun is not None  # (fresh: inside one)
                lsn = begun.final_lsn
                record = one_step(payload, {"lsn": lsn, "n": self._n + 1, **self._extra})
                if record is not None:
                    self._n += 1
                    self._flush_point = lsn
                    records.append(record)
                    self._open += 1
                    self._poll_bytes += len(record.value)
                    self._extra_saved = True
                    continue
            self._on_message(decode(payload), records)
        txn = self.context.transaction_context
        markers: list[SourceRecord] = []
        if records and txn is not None and (self._txn is None or self._open >= bound):
            if self._txn is None and self.settings.cut_markers:  # ends at a database commit
                markers = cut_markers([t.name for t in self.topics()], self._flush_point)
            txn.commit_transaction()
            self._open = 0
            self._flushes.append(self._flush_point)
        self._records_polled += len(records)
        records += markers
        return records

    def _on_message(self, message: Any, records: list[SourceRecord]) -> None:
        if isinstance(message, Insert | Update | Delete):
            self._on_change(message, records)
        elif isinstance(message, Begin):
            self._txn, self._n = message, -1
            self._sources = {}
            self._now_ms = int(time.time() * 1000)
            lsn = message.final_lsn
            self._fresh = lsn > self.progress.lsn and lsn >= self._highest_segment
            self._changes.begin(message, self._now_ms)
        elif isinstance(message, Commit):
            self._txn, self._fresh = None, False
            self._last_commit_ms = ms_of(message.commit_ts_us)
            self._flush_point = message.commit_lsn
        elif isinstance(message, Relation):
            self._on_relation(message)
        elif isinstance(message, Truncate):
            self._on_truncate(message, records)
        elif isinstance(message, LogicalMessage):
            self._on_logical_message(message, records)
        # Origin, Type: not events

    def _on_relation(self, rel: Relation) -> None:
        """A table's (new) shape: columns added or dropped since flow through from here on."""
        self._changes.relation(rel.relation_id, None)  # until the new shape is known
        name = f"{rel.schema}.{rel.table}"
        known = self.shapes.get(name)
        pk = tuple(
            c
            for c in (known.primary_key if known else ())
            if any(col.name == c for col in rel.columns)
        )
        if known is None:  # a table added to the publication later: its key as pgoutput says
            pk = tuple(c.name for c in rel.columns if c.key) if rel.replica_identity == "d" else ()
            shape = TableShape(rel.schema, rel.table, rel.columns, pk)
            self.relations[rel.relation_id] = self._codec(shape)
            if not self._publish_key(shape):
                return  # its changes are skipped (``refused``)
            self.tables.append((rel.schema, rel.table))  # its topic is made before its records
        shape = self.shapes[name] = TableShape(rel.schema, rel.table, rel.columns, pk)
        codec = self.relations[rel.relation_id] = self._codec(shape)
        self._changes.relation(rel.relation_id, None if name in self.refused else codec)

    def _codec(self, shape: TableShape) -> RowCodec:
        s = self.settings
        return RowCodec(shape, s.unavailable_value, types=s.column_types == "header")

    def _on_truncate(self, message: Truncate, records: list[SourceRecord]) -> None:
        """TRUNCATE of captured tables: a truncate event per table, or (``truncate: skip``)
        nothing but a count and a log line - never silently nothing (the guide's
        "TRUNCATE"). Each table's is one change of the transaction, as a row's is."""
        txn = self._txn
        assert txn is not None, "pgoutput: a truncate outside a transaction"
        for relation_id in message.relation_ids:
            self._n += 1
            if self.progress.already_written(txn.final_lsn, self._n):
                continue
            codec = self.relations[relation_id]
            if self.refused and codec.shape.name in self.refused:
                continue
            if self.settings.truncate == "skip":
                self._truncates_skipped += 1
                log.warning("TRUNCATE of %s skipped (truncate: skip)", codec.shape.name)
                continue
            self._emit(codec, "t", None, None, None, records)

    def _on_change(self, change: Insert | Update | Delete, records: list[SourceRecord]) -> None:
        txn = self._txn
        assert txn is not None, "pgoutput: a change outside a transaction"
        self._n += 1
        if self.progress.already_written(txn.final_lsn, self._n):
            return
        codec = self.relations[change.relation_id]
        if self.refused and codec.shape.name in self.refused:
            return
        old, key_only = (
            (None, False) if isinstance(change, Insert) else (change.old, change.old_is_key)
        )
        full_old = None if key_only else old  # REPLICA IDENTITY FULL: the whole old row
        before = None
        if old is not None:
            before = codec.identity(old) if full_old is None else codec.row(old)
        if isinstance(change, Insert):
            self._emit(codec, "c", None, codec.row(change.new), codec.key(change.new), records)
        elif isinstance(change, Delete):
            self._emit(codec, "d", before, None, codec.key(change.old), records)
        elif old is not None and not codec.same_key(old, change.new):
            # the primary key changed: the old key is deleted, the new one created
            self._emit(codec, "d", before, None, codec.key(old), records)
            after = codec.row(change.new, full_old)
            headers = codec.unchanged(change.new, full_old)
            self._emit(codec, "c", None, after, codec.key(change.new), records, headers)
        else:
            after = codec.row(change.new, full_old)
            headers = codec.unchanged(change.new, full_old)
            self._emit(codec, "u", before, after, codec.key(change.new), records, headers)

    def _emit(
        self,
        codec: RowCodec,
        op: str,
        before: bytes | None,
        after: bytes | None,
        key: bytes | None,
        records: list[SourceRecord],
        headers: Headers | None = None,
    ) -> None:
        """``headers``: the record's (default: ``codec.headers``)."""
        txn = self._txn
        assert txn is not None
        lsn, shape = txn.final_lsn, codec.shape
        if lsn < self._highest_segment:
            if self.progress.in_snapshot(shape.name, comparable_key(key_values(key)), lsn):
                return
            offset = {"lsn": lsn, "n": self._n, "segments": self._segments_offset, **self._extra}
        else:
            offset = {"lsn": lsn, "n": self._n, **self._extra}
        self._extra_saved = True
        window = self._window
        if window is not None:  # newer than the chunk's row of this key
            if op == "t":
                window.on_truncate(shape.name)
            else:
                window.on_change(shape.name, key)
        source = self._sources.get(shape.name)
        if source is None:
            source = self._sources[shape.name] = self.events.source(
                shape, lsn=lsn, txid=txn.xid, commit_ms=ms_of(txn.commit_ts_us), snapshot=False
            )
        new = self.events.records(
            shape, op, before, after, key, source=source, now_ms=self._now_ms,
            offset=offset, source_partition=self._source_partition,
            headers=codec.headers if headers is None else headers,
        )  # fmt: skip
        records += new
        self._open += len(new)
        self._poll_bytes += len(new[0].value)
        self._flush_point = lsn  # split here: Postgres sends this transaction again

    def _caught_up(self, stream: WalStream) -> None:
        """Idle with everything written: the WAL up to the server's position holds nothing
        for us, so the slot may confirm it (else it keeps WAL for other databases' work)."""
        if stream.wal_end > stream.confirmed and self._extra_saved and self._window is None:
            stream.confirm(stream.wal_end)

    async def commit(self) -> None:
        """A Kafka transaction committed: Postgres may forget the WAL it came from."""
        if not self._flushes:
            return
        lsn = self._flushes.popleft()
        if self._stream is not None and lsn:
            self._stream.confirm(lsn)

    def helper_records_committed(self) -> int:
        """The snapshot's rows its workers committed (in their own transactions)."""
        snap = getattr(self, "_snapshot", None)
        return getattr(self, "_rows_written", 0) + (snap.rows_written if snap else 0)

    def lag(self) -> SourceLag | None:
        """Replication lag: bytes of WAL between the slot's confirmed position (what is in
        Kafka) and the server's, and, while that is > 0, seconds since the commit in
        Postgres of the last transaction read. None before the stream (the snapshot)."""
        stream = self._stream if getattr(self, "active", False) else None
        if stream is None:
            return None
        behind = max(0, stream.wal_end - stream.confirmed)
        seconds = 0.0
        if behind and self._last_commit_ms is not None:
            seconds = max(0.0, time.time() - self._last_commit_ms / 1000)
        return SourceLag(bytes=behind, seconds=round(seconds, 3))

    def topics(self) -> list[TopicSpec]:
        """Each captured table's topic (``topic_partitions``); none for an idle task."""
        if not getattr(self, "active", False):  # not started (``tables``: the setting)
            return []
        s = self.settings
        return [
            TopicSpec(s.topic(schema, table), s.topic_partitions, s.topic_replication_factor)
            for schema, table in self.tables
        ]

    def lag_at_rest(self) -> SourceLag | None:
        """The slot's lag as Postgres counts it (``pg_replication_slots``: the server's WAL
        position - the confirmed flush LSN), for status while the task is not streaming;
        its age is not known then. None for an idle task (index > 0), without a slot, or
        when Postgres does not answer."""
        context = getattr(self, "context", None)
        if context is not None and context.task_index != 0:
            return None
        try:
            conn = catalog.connect(self.settings)
        except Exception:
            return None
        try:
            behind = catalog.slot_lag(self.settings, conn)
        except Exception:
            return None
        finally:
            conn.close()
        return None if behind is None else SourceLag(bytes=behind)

    def metrics(self) -> dict[str, Any]:
        """The phase, the slot's confirmed LSN and the server's WAL end as last seen."""
        if not getattr(self, "active", False):
            return {}
        stream = self._stream
        if stream is None:
            snap = self._snapshot
            done, planned = snap.counts() if snap else (0, 0)
            return {
                "phase": "snapshot",
                "records_polled": self._records_polled,
                "chunks_done": done,
                "chunks": planned,
                "snapshot_worker_pids": sorted(snap.pids.values()) if snap else [],
            }
        return {
            "phase": "stream",
            "confirmed_lsn": stream.confirmed,
            "server_wal_end": stream.wal_end,
            "records_polled": self._records_polled,
            "truncates_skipped": self._truncates_skipped,
            "snapshot_pending": list(self.progress.pending),
            "tables_refused": dict(sorted(self.refused.items())),
        }

    def problem(self) -> str | None:
        """What is wrong without stopping the task: the tables found while streaming that
        it does not capture, and why (the status's ``last_error``)."""
        refused = getattr(self, "refused", None)
        return "; ".join(refused[name] for name in sorted(refused)) if refused else None

    def request_snapshot(self, tables: list[str]) -> None:
        """Snapshot ``tables`` (``schema.table``; ``table``: public) again while the
        stream flows, exactly once, without stopping (``rayconnect snapshot``): a request
        written into the WAL, which the running task meets in order. ConfigError for a
        table not captured (blocking: from the caller's process)."""
        names = [t if "." in t else f"public.{t}" for t in tables]
        if not names:
            raise ConfigError("snapshot: name the tables to snapshot")
        conn = catalog.connect(self.settings)
        try:
            captured = {f"{s}.{t}" for s, t in catalog.tables_of_publication(
                conn, self.settings.publication_name
            )}  # fmt: skip
            for name in names:
                if name not in captured:
                    raise ConfigError(
                        f"snapshot: {name} is not captured (not in publication "
                        f"{self.settings.publication_name}: {', '.join(sorted(captured))})"
                    )
                schema, _, table = name.partition(".")
                shape, _ = catalog.table_shape(conn, schema, table)
                sink = self.settings.route_keys_for
                if not shape.primary_key and sink is not None:
                    raise ConfigError(
                        f"snapshot: {name} is not captured: it has no primary key, and sink "
                        f"pipeline {sink} keeps each table's rows by key"
                    )
        finally:
            conn.close()
        window_reader.request_snapshot(self.settings, names)

    async def stop(self) -> None:
        window_reader = getattr(self, "_window_reader", None)
        if window_reader is not None:
            with contextlib.suppress(Exception):
                window_reader.close()
        for part in (self._stream, self._snapshot):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.close()
        self._stream = self._snapshot = None


def _workers_key(transactional_id: str) -> bytes:
    return f"{transactional_id}/snapshot-workers".encode()


def _workers_used(transactional_id: str) -> int:
    """How many snapshot workers earlier starts of the task used - Ray's key-value store
    knows before the offsets are read (0 without Ray)."""
    with contextlib.suppress(Exception):
        kept = ray_internals.kv_get(_workers_key(transactional_id), namespace="rayconnect")
        return int(kept or 0)
    return 0


def _remember_workers(transactional_id: str, workers: int) -> None:
    """Before ``workers`` snapshot workers write: later starts fence that many ids."""
    if workers > _workers_used(transactional_id):
        key = _workers_key(transactional_id)
        ray_internals.kv_put(key, str(workers).encode(), namespace="rayconnect")
