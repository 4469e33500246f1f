"""The pgoutput stream of the slot, read without blocking the task's event loop.

psycopg2's ``read_message`` returns at once (None when nothing is buffered); ``wait``
sleeps until the socket is readable, through the event loop's reader callbacks. Every call
is made from the event loop's thread: one connection, never shared between threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from rayconnect.source_tasks.postgres.catalog import connect
from rayconnect.source_tasks.postgres.settings import PostgresSettings

#: Postgres ends a replication connection that says nothing for wal_sender_timeout (60 s)
FEEDBACK_EVERY_S = 5.0


class WalStream:
    def __init__(self, settings: PostgresSettings, publication: str) -> None:
        self.conn = connect(settings, replication=True)
        self.cursor = self.conn.cursor()
        self.cursor.start_replication(
            slot_name=settings.slot,
            decode=False,
            # messages: the watermarks and requests of snapshots while streaming
            options={"proto_version": "1", "publication_names": publication, "messages": "true"},
        )
        self.confirmed = 0
        self._feedback_at = time.monotonic()

    def read(self) -> bytes | None:
        """The next message's payload, or None if none is buffered now."""
        message = self.cursor.read_message()
        if message is None:
            if time.monotonic() - self._feedback_at > FEEDBACK_EVERY_S:
                self.confirm(self.confirmed)
            return None
        return message.payload

    async def wait(self, timeout_s: float) -> None:
        """Until the connection has data, or ``timeout_s``."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        fd = self.conn.fileno()
        loop.add_reader(fd, ready.set)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ready.wait(), timeout_s)
        finally:
            loop.remove_reader(fd)

    @property
    def wal_end(self) -> int:
        """The server's WAL position as of its last message or keepalive."""
        return int(self.cursor.wal_end or 0)

    def confirm(self, lsn: int) -> None:
        """Postgres may drop the WAL before ``lsn``: everything before it is in Kafka."""
        self.confirmed = max(self.confirmed, lsn)
        self.cursor.send_feedback(flush_lsn=self.confirmed, write_lsn=self.confirmed)
        self._feedback_at = time.monotonic()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
