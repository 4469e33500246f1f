"""The stream's one-step records (``row_reader``, ``change_records``) are the general
path's bytes: any table shape, any row of values and NULLs, inserts and updates; what the
one step does not take (unchanged TOASTed values, old keys, deletes) it leaves to the
general path."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rayconnect.source_tasks.postgres.change_records import ChangeRecords
from rayconnect.source_tasks.postgres.events import EventBuilder, RowCodec, TableShape
from rayconnect.source_tasks.postgres.pgoutput import (
    Begin,
    Cell,
    Column,
    Insert,
    Unchanged,
    Update,
    decode,
    ms_of,
)

_digits = st.integers(-(10**12), 10**12).map(lambda i: str(i).encode())
#: a type's oid and modifier, and the text Postgres writes for a value of it
TYPES: dict[str, tuple[int, int, st.SearchStrategy[bytes]]] = {
    "int4": (23, -1, _digits),
    "int8": (20, -1, _digits),
    "text": (25, -1, st.text().map(str.encode)),
    "numeric": (1700, -1, st.sampled_from([b"1.50", b"-0.001", b"NaN", b"12345678901234567890"])),
    "numeric(12,2)": (1700, (12 << 16 | 2) + 4, st.sampled_from([b"1.50", b"-3.25", b"NaN"])),
    "float8": (701, -1, st.sampled_from([b"1.5", b"-Infinity", b"NaN", b"1e+30"])),
    "bool": (16, -1, st.sampled_from([b"t", b"f"])),
    "timestamptz": (1184, -1, st.just(b"2024-01-02 03:04:05.6+00")),
    "bytea": (17, -1, st.binary(max_size=8).map(lambda b: b"\\x" + b.hex().encode())),
    "int4[]": (1007, -1, st.sampled_from([b"{1,NULL,3}", b"{}", b"{{1,2},{3,4}}"])),
    "jsonb": (3802, -1, st.just(b'{"a": [1, "x"]}')),
}


def tuple_data(cells: list[Cell]) -> bytes:
    out = [struct.pack(">h", len(cells))]
    for cell in cells:
        if cell is None:
            out.append(b"n")
        elif cell is Unchanged.TOAST:
            out.append(b"u")
        else:
            assert isinstance(cell, bytes)
            out.append(b"t" + struct.pack(">i", len(cell)) + cell)
    return b"".join(out)


@st.composite
def tables(draw: Any) -> tuple[TableShape, list[list[Cell]]]:
    kinds = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=6))
    names = [f'c{i}"é' if draw(st.booleans()) else f"c{i}" for i in range(len(kinds))]
    key = draw(st.lists(st.sampled_from(range(len(kinds))), unique=True, max_size=2))
    columns = tuple(
        Column(names[i], TYPES[k][0], TYPES[k][1], i in key) for i, k in enumerate(kinds)
    )
    table = draw(st.sampled_from(["t", "we%ird"]))
    shape = TableShape("public", table, columns, tuple(names[i] for i in key))
    rows = draw(
        st.lists(
            st.tuples(*[st.none() | TYPES[k][2] for k in kinds]).map(list), min_size=1, max_size=5
        )
    )
    return shape, rows


@settings(max_examples=60, deadline=None)
@given(tables())
def test_a_row_read_in_one_step_is_the_general_paths_row_and_key(table: Any) -> None:
    shape, rows = table
    codec = RowCodec(shape)
    for cells in rows:
        assert codec.read(b"xx" + tuple_data(cells), 2) == (codec.row(cells), codec.key(cells))


def test_what_the_one_step_leaves_to_the_general_path() -> None:
    columns = (Column("id", 23, -1, True), Column("big", 25, -1, False))
    codec = RowCodec(TableShape("public", "t", columns, ("id",)))
    assert codec.read(tuple_data([b"1", Unchanged.TOAST]), 0) is None  # unchanged TOAST
    assert codec.read(tuple_data([b"1"]), 0) is None  # not the shape's column count
    assert RowCodec(TableShape("public", "t", (), ())).read is None  # no columns: {}


def _messages(relation_id: int, cells: list[Cell]) -> dict[str, bytes]:
    head = struct.pack(">i", relation_id)
    data = tuple_data(cells)
    return {
        "insert": b"I" + head + b"N" + data,
        "update": b"U" + head + b"N" + data,
        "update with its old key": b"U" + head + b"K" + data + b"N" + data,
        "delete": b"D" + head + b"K" + data,
    }


@settings(max_examples=40, deadline=None)
@given(tables(), st.booleans())
def test_one_step_records_are_the_general_paths_records(table: Any, types: bool) -> None:
    shape, rows = table
    codec = RowCodec(shape, types=types)
    events = EventBuilder("pg", lambda s, t: f"pg.{s}.{t}", True, "db")
    partition = {"postgres": "slot"}
    changes = ChangeRecords(events, partition)
    changes.relation(16384, codec)
    txn = Begin(final_lsn=0x16B374D848, commit_ts_us=817_000_000_123_456, xid=726)
    changes.begin(txn, now_ms=1_700_000_000_123)
    source = events.source(
        shape, lsn=txn.final_lsn, txid=txn.xid, commit_ms=ms_of(txn.commit_ts_us), snapshot=False
    )
    for cells in rows:
        messages = _messages(16384, cells)
        for kind, op in (("insert", "c"), ("update", "u")):
            change = decode(messages[kind])
            assert isinstance(change, Insert | Update)
            offset = {"lsn": txn.final_lsn, "n": 3, "known": ["public.t"]}
            (expected,) = events.records(
                shape, op, None, codec.row(change.new), codec.key(change.new), source=source,
                now_ms=1_700_000_000_123, offset=offset, source_partition=partition,
                headers=codec.headers,
            )  # fmt: skip
            assert changes.record(messages[kind], offset) == expected
        for kind in ("update with its old key", "delete"):
            assert changes.record(messages[kind], {}) is None
    changes.relation(16384, None)  # a new shape on its way: the general path until then
    assert changes.record(_messages(16384, rows[0])["insert"], {}) is None
    assert changes.record(_messages(99, rows[0])["insert"], {}) is None  # not a known table


def test_an_update_with_an_unchanged_toasted_value_goes_the_general_way() -> None:
    columns = (Column("id", 23, -1, True), Column("big", 25, -1, False))
    changes = ChangeRecords(EventBuilder("pg", lambda s, t: t, True, "db"), None)
    changes.relation(7, RowCodec(TableShape("public", "t", columns, ("id",))))
    changes.begin(Begin(1, 1, 1), now_ms=1)
    assert changes.record(_messages(7, [b"1", Unchanged.TOAST])["update"], {}) is None
