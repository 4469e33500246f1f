"""Reading a chunk between watermarks while the stream flows (blocking; the task runs it in
a thread): low watermark, the chunk by ``COPY`` (read committed: what is committed when it
starts; a keyless table's by a page range, ``keyless_chunk``), high watermark, on one
autocommit connection. The pure part - which rows go out -
is ``incremental_snapshot``; requests for a snapshot are written here too."""

from __future__ import annotations

import math
import time
from typing import Any

from rayconnect.source_tasks.postgres import catalog
from rayconnect.source_tasks.postgres.events import (
    EventBuilder,
    RowCodec,
    TableShape,
    key_values,
    read_events,
)
from rayconnect.source_tasks.postgres.incremental_snapshot import (
    HIGH,
    LOW,
    ChunkRead,
    encode_request,
    mark,
    new_window_id,
    request_prefix,
    watermark_prefix,
)
from rayconnect.source_tasks.postgres.progress import Chunk, Key, comparable_key
from rayconnect.source_tasks.postgres.settings import PostgresSettings
from rayconnect.source_tasks.postgres.snapshot import SnapshotReader, SqlTypes


class WindowReader:
    def __init__(self, settings: PostgresSettings, events: EventBuilder) -> None:
        self.settings = settings
        self.events = events
        self.reader = SnapshotReader(catalog.connect(settings), None)
        self.prefix = watermark_prefix(settings.slot)

    def read(
        self, shape: TableShape, sql_types: SqlTypes, codec: RowCodec, after: Key | None
    ) -> tuple[str, ChunkRead]:
        """The window's id and the chunk of ``shape`` after ``after`` (``batch_size``
        rows), read between its two watermarks."""
        limit, conn = self.settings.batch_size, self.reader.conn
        window_id = new_window_id()
        keyed = bool(shape.primary_key)
        if keyed:
            chunk = Chunk(shape.name, None, None, after)
        else:
            pages, per_page = catalog.table_pages(conn, shape.schema, shape.table)
            chunk = keyless_chunk(shape.name, after, pages, per_page, limit)
        catalog.emit_message(conn, self.prefix, mark(window_id, LOW))
        rows = self.reader.read(shape, sql_types, chunk, limit)
        lsn = catalog.emit_message(conn, self.prefix, mark(window_id, HIGH))
        now_ms = int(time.time() * 1000)
        source = self.events.source(shape, lsn=lsn, txid=None, commit_ms=now_ms, snapshot=True)
        keys, values = read_events(codec, rows, source, now_ms)
        if not keyed:
            return window_id, ChunkRead(
                shape.name, keys, values, chunk.hi, chunk.hi is None, keyed=False
            )
        last: Key | None = comparable_key(key_values(keys[-1])) if keys else None
        return window_id, ChunkRead(shape.name, keys, values, last, len(rows) < limit)

    def close(self) -> None:
        self.reader.close()


#: rows a heap page is taken to hold when Postgres has no estimate (a table never analysed)
ROWS_PER_PAGE_GUESS = 50


def keyless_chunk(table: str, after: Key | None, pages: int, per_page: float, rows: int) -> Chunk:
    """A keyless table's next chunk: heap pages from ``after`` (``[page]``; None: the first)
    for about ``rows`` rows at ``per_page`` rows a page; open at the end (the pages the table
    gains while read too) when it reaches the table's last page of now, ``pages``."""
    start = int(after[0]) if after else 0
    span = max(1, math.ceil(rows / (per_page if per_page > 0 else ROWS_PER_PAGE_GUESS)))
    hi = None if start + span >= pages else [start + span]
    return Chunk(table, [start], hi, None)


def request_snapshot(settings: PostgresSettings, tables: list[str]) -> int:
    """Ask the pipeline reading ``settings.slot`` to snapshot ``tables`` while it streams:
    a message in the WAL, which its task meets in order (durable: the slot keeps it until
    the task committed what it started). Its LSN."""
    conn: Any = catalog.connect(settings)
    try:
        return catalog.emit_message(conn, request_prefix(settings.slot), encode_request(tables))
    finally:
        conn.close()
