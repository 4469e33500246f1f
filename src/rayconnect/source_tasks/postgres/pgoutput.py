"""Decoding of pgoutput's logical replication messages (protocol version 1), pure.

Postgres sends each transaction whole, at its commit, as ``Begin``, the changes (each
preceded by a ``Relation`` message the first time a table is used, and again after its
definition changed - how ``ALTER TABLE`` add/drop column reaches us), ``Commit``. Column
values arrive in their text output form; ``values`` types them. See
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


#: a column's value as sent: text, NULL, or an unchanged TOASTed value
Cell = str | None | Unchanged


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
    """Origin, Type and logical-decoding messages: nothing for a change stream."""

    kind: str


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | Ignored

_I16, _I32, _I64, _U64 = (
    struct.Struct(">h"),
    struct.Struct(">i"),
    struct.Struct(">q"),
    struct.Struct(">Q"),
)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def byte(self) -> str:
        b = self.buf[self.pos : self.pos + 1].decode()
        self.pos += 1
        return b

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

    def int64(self) -> int:
        (v,) = _I64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def lsn(self) -> int:
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def cstring(self) -> str:
        end = self.buf.index(b"\0", self.pos)
        s = self.buf[self.pos : end].decode()
        self.pos = end + 1
        return s

    def tuple_data(self) -> tuple[Cell, ...]:
        n = self.int16()
        cells: list[Cell] = []
        buf = self.buf
        for _ in range(n):
            kind = buf[self.pos]
            self.pos += 1
            if kind == 0x74:  # 't'
                size = self.int32()
                cells.append(buf[self.pos : self.pos + size].decode())
                self.pos += size
            elif kind == 0x6E:  # 'n'
                cells.append(None)
            elif kind == 0x75:  # 'u'
                cells.append(Unchanged.TOAST)
            else:
                raise ValueError(f"pgoutput: tuple column kind {chr(kind)!r} (binary?) unsupported")
        return tuple(cells)


def decode(payload: bytes) -> Message:
    """One pgoutput message -> its Struct; ValueError for a malformed or unknown one."""
    r = _Reader(payload)
    kind = r.byte()
    if kind == "B":
        return Begin(r.lsn(), r.int64(), r.int32() & 0xFFFFFFFF)
    if kind == "C":
        r.int8()  # flags, unused
        return Commit(r.lsn(), r.lsn(), r.int64())
    if kind == "I":
        rel = r.int32()
        if r.byte() != "N":
            raise ValueError("pgoutput: Insert without a new tuple")
        return Insert(rel, r.tuple_data())
    if kind == "U":
        rel = r.int32()
        tag = r.byte()
        old, old_is_key = None, False
        if tag in ("K", "O"):
            old, old_is_key = r.tuple_data(), tag == "K"
            tag = r.byte()
        if tag != "N":
            raise ValueError("pgoutput: Update without a new tuple")
        return Update(rel, r.tuple_data(), old, old_is_key)
    if kind == "D":
        rel = r.int32()
        tag = r.byte()
        return Delete(rel, r.tuple_data(), tag == "K")
    if kind == "R":
        rel, schema, table, identity = r.int32(), r.cstring(), r.cstring(), chr(r.int8())
        columns = []
        for _ in range(r.int16()):
            flags, name, oid, typmod = r.int8(), r.cstring(), r.int32(), r.int32()
            columns.append(Column(name, oid & 0xFFFFFFFF, typmod, bool(flags & 1)))
        return Relation(rel, schema, table, identity, tuple(columns))
    if kind == "T":
        n = r.int32()
        r.int8()  # options: CASCADE / RESTART IDENTITY
        return Truncate(tuple(r.int32() for _ in range(n)))
    if kind in ("O", "Y", "M"):
        return Ignored(kind)
    raise ValueError(f"pgoutput: unknown message kind {kind!r}")


def ms_of(pg_ts_us: int) -> int:
    """A pgoutput timestamp (microseconds since 2000-01-01) as Unix milliseconds."""
    return (pg_ts_us + PG_EPOCH_US) // 1000


def format_lsn(lsn: int) -> str:
    """An LSN as Postgres writes it: ``16/B374D848``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)
