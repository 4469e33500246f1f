"""Reading a chunk between watermarks while the stream flows (blocking; the task runs it in
a thread): low watermark, the chunk by ``COPY`` (read committed: what is committed when it
starts), high watermark, on one autocommit connection. The pure part - which rows go out -
is ``incremental_snapshot``; requests for a snapshot are written here too."""

from __future__ import annotations

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
        catalog.emit_message(conn, self.prefix, mark(window_id, LOW))
        rows = self.reader.read(shape, sql_types, Chunk(shape.name, None, None, after), limit)
        lsn = catalog.emit_message(conn, self.prefix, mark(window_id, HIGH))
        now_ms = int(time.time() * 1000)
        source = self.events.source(shape, lsn=lsn, txid=None, commit_ms=now_ms, snapshot=True)
        keys, values = read_events(codec, rows, source, now_ms)
        last: Key | None = comparable_key(key_values(keys[-1])) if keys else None
        return window_id, ChunkRead(shape.name, keys, values, last, len(rows) < limit)

    def close(self) -> None:
        self.reader.close()


def request_snapshot(settings: PostgresSettings, tables: list[str]) -> int:
    """Ask the pipeline reading ``settings.slot`` to snapshot ``tables`` while it streams:
    a message in the WAL, which its task meets in order (durable: the slot keeps it until
    the task committed what it started). Its LSN."""
    conn: Any = catalog.connect(settings)
    try:
        return catalog.emit_message(conn, request_prefix(settings.slot), encode_request(tables))
    finally:
        conn.close()
