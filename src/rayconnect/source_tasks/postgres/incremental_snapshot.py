"""Snapshots while streaming (DBLog's watermarks), the window logic - pure.

A table added to the publication while the task streams, or named by ``rayconnect snapshot``
(``SourcePipelineHandle.snapshot``), is read in chunks while the stream flows: per chunk the
task writes a low watermark into the WAL (``pg_logical_emit_message``, which pgoutput sends
with ``messages: true``), reads the chunk's rows (key order, ``batch_size`` of them after
the last key written), and writes a high watermark. The stream meets the low watermark,
then the changes committed while the chunk was read, then the high watermark: a key changed
between the two is newer in the stream than in the chunk (or as new - the chunk read after
that change), so the chunk's row for it is dropped; at the high watermark the chunk's other
rows go out as ``op: r`` events, in the stream's order, with the progress (the table's last
key written) in the same Kafka transaction. A row never overwrites a newer streamed change;
a task killed mid-chunk reads that chunk again after restart (the watermarks of the lost
window carry another id and are ignored).

A table without a primary key (REPLICA IDENTITY FULL: its records have no key) is read by
heap page ranges instead (``ctid``, about ``batch_size`` rows a chunk, ``Progress.pending_after``
the next page): no key says which of its rows a change in the window touched, so every row
of the chunk goes out (none after a truncate in the window) - the rows as read between the
watermarks, beside the window's changes in the stream. An append sink keeps both; a sink
that keeps rows by key cannot take such a table at all. A row an update moves from a page
not read yet to one already read is in no chunk (its change is in the stream), one moved
the other way is in two.

Requests travel the same way: ``rayconnect snapshot`` writes a transactional message with
the tables into the WAL (``request_prefix``), so a request is in order with the changes
and survives the task's restarts until its effect is committed.
"""

from __future__ import annotations

import uuid

import msgspec

from rayconnect.source_tasks.postgres.progress import Key

LOW, HIGH = "low", "high"


def watermark_prefix(slot: str) -> str:
    """The logical message prefix of ``slot``'s watermarks (other slots ignore them)."""
    return f"rayconnect.watermark.{slot}"


def request_prefix(slot: str) -> str:
    """The logical message prefix of snapshot requests to ``slot``'s pipeline."""
    return f"rayconnect.snapshot.{slot}"


def encode_request(tables: list[str]) -> bytes:
    return msgspec.json.encode(tables)


def decode_request(content: bytes) -> list[str]:
    """The tables a request names; [] for a malformed one (logged by the caller)."""
    try:
        return msgspec.json.decode(content, type=list[str])
    except msgspec.DecodeError:
        return []


class ChunkRead(msgspec.Struct):
    """A chunk of ``table`` read between the watermarks: its records' keys and values in key
    order, the last key read and whether the table has no rows after it. ``keyed`` False: a
    table without a key, read by pages - ``last_key`` is then ``[the next page]``."""

    table: str
    keys: list[bytes | None]
    values: list[bytes]
    last_key: Key | None
    exhausted: bool
    keyed: bool = True


def new_window_id() -> str:
    return uuid.uuid4().hex


def mark(window_id: str, kind: str) -> bytes:
    return f"{window_id}:{kind}".encode()


class Window:
    """One chunk between its watermarks, as the stream meets them: which rows still go out."""

    __slots__ = ("id", "chunk", "open", "changed", "truncated")

    def __init__(self, window_id: str, chunk: ChunkRead) -> None:
        self.id = window_id
        self.chunk = chunk
        #: the low watermark was met (the changes from here on are newer than the chunk)
        self.open = False
        self.changed: set[bytes | None] = set()
        self.truncated = False

    def on_watermark(self, content: bytes) -> bool:
        """A watermark of this task's slot; True when it is this window's high one (the
        chunk goes out now). Another window's (a killed incarnation's) is ignored."""
        window_id, _, kind = content.decode(errors="replace").partition(":")
        if window_id != self.id:
            return False
        if kind == LOW:
            self.open = True
            return False
        return kind == HIGH and self.open

    def on_change(self, table: str, key: bytes | None) -> None:
        """A change written to Kafka: newer than the chunk's row of the same key (a keyless
        chunk's rows cannot be told apart: they all go out)."""
        if self.open and table == self.chunk.table and self.chunk.keyed:
            self.changed.add(key)

    def on_truncate(self, table: str) -> None:
        if self.open and table == self.chunk.table:
            self.truncated = True

    def rows(self) -> tuple[list[bytes | None], list[bytes]]:
        """The chunk's keys and values that go out: those of keys not changed in the
        window (none after a truncate of the table in it)."""
        chunk = self.chunk
        if self.truncated:
            return [], []
        if not self.changed:
            return chunk.keys, chunk.values
        changed = self.changed
        kept = [(k, v) for k, v in zip(chunk.keys, chunk.values, strict=True) if k not in changed]
        return [k for k, _ in kept], [v for _, v in kept]
