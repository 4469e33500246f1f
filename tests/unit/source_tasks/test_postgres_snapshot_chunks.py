"""The parallel snapshot's pure parts: chunk plans cover every key once, COPY text back to
each column's text, a page's events equal the stream encoder's byte for byte, and the
watermark rule holds per chunk across restarts (new exported snapshots)."""

from __future__ import annotations

import random

import pytest

from rayconnect.source_tasks.postgres.copy_text import parse_rows
from rayconnect.source_tasks.postgres.events import (
    EventBuilder,
    RowCodec,
    TableShape,
    read_events,
)
from rayconnect.source_tasks.postgres.pgoutput import Column
from rayconnect.source_tasks.postgres.progress import Chunk, Progress, Segment
from rayconnect.source_tasks.postgres.snapshot_plan import (
    boundary_chunks,
    int_chunks,
    page_chunks,
)


def _owner(chunks: list[Chunk], key: int) -> list[int]:
    """The chunks whose range holds ``key`` (lo < key <= hi, None open)."""
    return [
        i
        for i, c in enumerate(chunks)
        if (c.lo is None or [key] > c.lo) and (c.hi is None or [key] <= c.hi)
    ]


@pytest.mark.parametrize(
    ("low", "high", "rows", "chunk_rows"),
    [(1, 1_000_000, 1e6, 100_000), (-50, 50, 101, 7), (5, 5, 1, 10), (1, 10**9, 1e3, 100)],
)
def test_integer_ranges_cover_every_key_exactly_once(
    low: int, high: int, rows: float, chunk_rows: int
) -> None:
    chunks = int_chunks("public.t", low, high, rows, chunk_rows)
    assert chunks[0].lo is None and chunks[-1].hi is None  # open: estimates may be off
    assert len(chunks) <= max(1, -(-int(rows) // chunk_rows))
    rng = random.Random(1)
    for key in [low - 10, low, high, high + 10, *(rng.randint(low, high) for _ in range(500))]:
        assert len(_owner(chunks, key)) == 1, key
    assert all(c.after == c.lo and not c.done for c in chunks)
    assert int_chunks("public.t", None, None, 0, 10) == [Chunk("public.t", None, None, None)]


def test_a_resumed_table_is_planned_from_its_key() -> None:
    chunks = int_chunks("public.t", 1, 1000, 1000, 100, start=[450])
    assert chunks[0].lo == [450] and chunks[0].after == [450] and chunks[-1].hi is None
    assert all(c.hi is None or c.hi > [450] for c in chunks)
    sampled = boundary_chunks("public.t", [["b"], ["m"], ["t"]], start=["c"])
    assert [(c.lo, c.hi) for c in sampled] == [(["c"], ["m"]), (["m"], ["t"]), (["t"], None)]


def test_pages_of_a_keyless_table() -> None:
    chunks = page_chunks("public.log", pages=1000, rows=100_000, chunk_rows=25_000)
    assert [(c.lo, c.hi) for c in chunks] == [
        ([0], [250]), ([250], [500]), ([500], [750]), ([750], None)
    ]  # fmt: skip
    assert [(c.lo, c.hi) for c in page_chunks("public.log", 0, 0, 10)] == [([0], None)]


def test_copy_text_gives_each_columns_text() -> None:
    data = b'1\tplain\t\\N\tt\n2\ttab\\there\\nnew\\\\line\t{"a\\\\\\\\b"}\tf\n'
    assert parse_rows(data) == [
        [b"1", b"plain", None, b"t"],
        [b"2", b"tab\there\nnew\\line", b'{"a\\\\b"}', b"f"],
    ]
    assert parse_rows(b"") == []
    assert parse_rows(b"\\001x\t\\x41\n") == [[b"\x01x", b"A"]]


def test_a_page_of_reads_is_the_stream_encoders_bytes() -> None:
    columns = (Column("id", 23, -1, True), Column("s", 25, -1, False), Column("ok", 16, -1, False))
    shape = TableShape("public", "t", columns, ("id",))
    codec = RowCodec(shape)
    builder = EventBuilder("pg", lambda s, t: f"pg.{s}.{t}", False, "db")
    source = builder.source(shape, lsn=16, txid=None, commit_ms=7, snapshot=True)
    rows = [[b"1", b'a"b', b"t"], [b"2", None, b"f"]]
    keys, values = read_events(codec, rows, source, 9)
    one_by_one = [
        builder.records(shape, "r", None, codec.row(r), codec.key(r), source=source, now_ms=9,
                        offset={}, source_partition=None)[0]
        for r in rows
    ]  # fmt: skip
    assert values == [r.value for r in one_by_one] and keys == [r.key for r in one_by_one]


def test_the_watermark_rule_per_chunk_across_restarts() -> None:
    """Two chunks of t split at key 100, read at LSN 10; chunk 0 finished, chunk 1 got to
    key 150 when the task died; the new snapshot at LSN 30 continues chunk 1 from 150."""
    p = Progress(chunks=int_chunks("public.t", 1, 200, 200, 100))
    assert p.snapshotting and [(c.lo, c.hi) for c in p.chunks] == [(None, [100]), ([100], None)]
    p.begin_chunks(10)
    p.chunks[0].after, p.chunks[0].done = [100], True
    p.chunks[1].after = [150]
    resumed = Progress.from_offset(p.to_offset())
    assert resumed == p
    resumed.begin_chunks(30)
    assert resumed.chunks[0].segments == [Segment(None, 10)]  # done: not read again
    assert resumed.chunks[1].segments == [Segment([100], 10), Segment([150], 30)]
    resumed.begin_chunks(40)  # died again before writing a row: the segment moves
    assert resumed.chunks[1].segments == [Segment([100], 10), Segment([150], 40)]
    resumed.chunks[1].done = True
    resumed.finish_snapshot()
    assert not resumed.snapshotting and resumed.chunks == []
    t = "public.t"
    assert resumed.segments[t] == [Segment(None, 10), Segment([100], 10), Segment([150], 40)]
    assert resumed.in_snapshot(t, [150], 9) and not resumed.in_snapshot(t, [150], 10)
    assert resumed.in_snapshot(t, [151], 39) and not resumed.in_snapshot(t, [151], 40)
    assert resumed.highest_segment_lsn() == 40


def test_a_keyless_tables_chunks_share_one_segment() -> None:
    p = Progress(chunks=page_chunks("public.log", 10, 100, 30))
    p.begin_chunks(10)
    p.begin_chunks(20)  # a restart before the table's one transaction committed
    for chunk in p.chunks:
        chunk.done = True
    p.finish_snapshot()
    assert p.segments == {"public.log": [Segment(None, 20)]}
