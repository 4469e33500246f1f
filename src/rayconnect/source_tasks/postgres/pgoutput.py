"""Decoding of pgoutput's logical replication messages (protocol version 1), pure.

Postgres sends each transaction whole, at its commit, as ``Begin``, the changes (each
preceded by a ``Relation`` message the first time a table is used, and again after its
definition changed - how ``ALTER TABLE`` add/drop column reaches us), ``Commit``. Column
values arrive in their text output form; ``values`` writes them as JSON. See
https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import enum
import struct

import msgspec

#: microseconds between the Unix epoch and Postgres's (2000-01-01)
PG_EPOCH_US = 946_684_800 * 1_000_000


class Unchanged(enum.Enum):
    """A TOASTed value the change did not touch: pgoutput does not send it (``'u'``)."""

    TOAST = "unchanged-toast"


#: a column's value as sent: its text form (bytes, UTF-8), NULL, or an unchanged TOASTed value
Cell = bytes | None | Unchanged


class Column(msgspec.Struct, frozen=True):
    name: str
    type_oid: int
    type_modifier: int
    #: part of the replica identity (the primary key, or every column with FULL)
    key: bool


class Relation(msgspec.Struct, frozen=True):
    relation_id: int
    schema: str
    table: str
    #: 'd' default (primary key), 'n' nothing, 'f' full, 'i' index
    replica_identity: str
    columns: tuple[Column, ...]


class Begin(msgspec.Struct, frozen=True):
    #: the LSN of the transaction's commit record (Commit.commit_lsn)
    final_lsn: int
    commit_ts_us: int
    xid: int


class Commit(msgspec.Struct, frozen=True):
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


class Insert(msgspec.Struct, frozen=True):
    relation_id: int
    new: tuple[Cell, ...]


class Update(msgspec.Struct, frozen=True):
    relation_id: int
    new: tuple[Cell, ...]
    #: the old key ('K') or whole old row ('O', REPLICA IDENTITY FULL); None if the key
    #: did not change and identity is the default
    old: tuple[Cell, ...] | None = None
    old_is_key: bool = False


class Delete(msgspec.Struct, frozen=True):
    relation_id: int
    old: tuple[Cell, ...]
    old_is_key: bool


class Truncate(msgspec.Struct, frozen=True):
    relation_ids: tuple[int, ...]


class Ignored(msgspec.Struct, frozen=True):
    """Origin and Type messages: nothing for a change stream."""

    kind: str


class LogicalMessage(msgspec.Struct, frozen=True):
    """A ``pg_logical_emit_message`` (sent with the ``messages`` option): the incremental
    snapshot's watermarks and on-demand snapshot requests (``incremental_snapshot``)."""

    transactional: bool
    prefix: str
    content: bytes


Message = (
    Begin | Commit | Relation | Insert | Update | Delete | Truncate | LogicalMessage | Ignored
)

_I16, _I32, _I64, _U64 = (
    struct.Struct(">h"),
    struct.Struct(">i"),
    struct.Struct(">q"),
    struct.Struct(">Q"),
)
_REL_TAG = struct.Struct(">iB")  # a change's relation id and its first tuple tag
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">xQQq")


class _Reader:
    """Relation and Truncate messages: rare, read field by field."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos

    def int8(self) -> int:
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def int16(self) -> int:
        (v,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return v

    def int32(self) -> int:
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def cstring(self) -> str:
        end = self.buf.index(b"\0", self.pos)
        s = self.buf[self.pos : end].decode()
        self.pos = end + 1
        return s


def _tuple(buf: bytes, pos: int) -> tuple[tuple[Cell, ...], int]:
    """TupleData at ``pos``: its cells (each value's text as bytes, not decoded: most
    become JSON as they are) and the position after it."""
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    cells: list[Cell] = []
    append, unpack = cells.append, _I32.unpack_from
    for _ in range(n):
        kind = buf[pos]
        if kind == 0x74:  # 't'
            (size,) = unpack(buf, pos + 1)
            pos += 5 + size
            append(buf[pos - size : pos])
        elif kind == 0x6E:  # 'n'
            append(None)
            pos += 1
        elif kind == 0x75:  # 'u'
            append(Unchanged.TOAST)
            pos += 1
        else:
            raise ValueError(f"pgoutput: tuple column kind {chr(kind)!r} (binary?) unsupported")
    return tuple(cells), pos


def decode(payload: bytes) -> Message:
    """One pgoutput message -> its Struct; ValueError for a malformed or unknown one."""
    kind = payload[0]
    if kind in (0x49, 0x55, 0x44):  # I U D: the bulk, read without a reader object
        rel, tag = _REL_TAG.unpack_from(payload, 1)
        if kind == 0x49:
            if tag != 0x4E:  # 'N'
                raise ValueError("pgoutput: Insert without a new tuple")
            return Insert(rel, _tuple(payload, 6)[0])
        if kind == 0x44:
            return Delete(rel, _tuple(payload, 6)[0], tag == 0x4B)
        old: tuple[Cell, ...] | None = None
        pos = 6
        if tag in (0x4B, 0x4F):  # 'K' old key, 'O' old row
            old, pos = _tuple(payload, pos)
            pos += 1
        if payload[pos - 1] != 0x4E:
            raise ValueError("pgoutput: Update without a new tuple")
        return Update(rel, _tuple(payload, pos)[0], old, tag == 0x4B)
    if kind == 0x42:  # B
        lsn, ts, xid = _BEGIN.unpack_from(payload, 1)
        return Begin(lsn, ts, xid)
    if kind == 0x43:  # C
        return Commit(*_COMMIT.unpack_from(payload, 1))
    r = _Reader(payload, 1)
    if kind == 0x52:  # R
        rel = r.int32()
        schema, table, identity = r.cstring(), r.cstring(), chr(r.int8())
        columns = []
        for _ in range(r.int16()):
            flags, name, oid, typmod = r.int8(), r.cstring(), r.int32(), r.int32()
            columns.append(Column(name, oid & 0xFFFFFFFF, typmod, bool(flags & 1)))
        return Relation(rel, schema, table, identity, tuple(columns))
    if kind == 0x54:  # T
        n = r.int32()
        r.int8()  # options: CASCADE / RESTART IDENTITY
        return Truncate(tuple(r.int32() for _ in range(n)))
    if kind == 0x4D:  # M: flags, its LSN, prefix, content (no xid: not a streamed txn)
        transactional = bool(r.int8() & 1)
        r.pos += 8
        prefix = r.cstring()
        size = r.int32()
        return LogicalMessage(transactional, prefix, payload[r.pos : r.pos + size])
    if kind in (0x4F, 0x59):  # Origin, Type
        return Ignored(chr(kind))
    raise ValueError(f"pgoutput: unknown message kind {chr(kind)!r}")


def ms_of(pg_ts_us: int) -> int:
    """A pgoutput timestamp (microseconds since 2000-01-01) as Unix milliseconds."""
    return (pg_ts_us + PG_EPOCH_US) // 1000


def format_lsn(lsn: int) -> str:
    """An LSN as Postgres writes it: ``16/B374D848``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)
