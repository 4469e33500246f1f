"""Snapshots while streaming, the pure part: which chunk rows a watermark window lets out,
the progress of the pending tables, logical messages decoded - and a property test: any
interleaving of writes with chunk reads, replayed as the task sees it (stream + windows),
leaves an upsert reader equal to the table."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from rayconnect.source_tasks.postgres.incremental_snapshot import (
    HIGH,
    LOW,
    ChunkRead,
    Window,
    decode_request,
    encode_request,
    mark,
)
from rayconnect.source_tasks.postgres.pgoutput import LogicalMessage, decode
from rayconnect.source_tasks.postgres.progress import Progress


def _chunk(keys: list[int], *, exhausted: bool = True, table: str = "public.t") -> ChunkRead:
    return ChunkRead(
        table,
        [b'{"id":%d}' % k for k in keys],
        [b"row %d" % k for k in keys],
        [keys[-1]] if keys else None,
        exhausted,
    )


def test_a_window_drops_the_keys_changed_between_its_watermarks_only() -> None:
    window = Window("w1", _chunk([1, 2, 3]))
    window.on_change("public.t", b'{"id":1}')  # before the low watermark: older than the chunk
    assert not window.on_watermark(mark("w0", LOW))  # a killed incarnation's window
    assert not window.on_watermark(mark("w1", LOW))
    window.on_change("public.t", b'{"id":2}')
    window.on_change("public.other", b'{"id":3}')  # another table's key 3
    assert not window.on_watermark(mark("w0", HIGH))
    assert window.on_watermark(mark("w1", HIGH))
    assert window.rows() == ([b'{"id":1}', b'{"id":3}'], [b"row 1", b"row 3"])


def test_a_truncate_in_the_window_drops_the_whole_chunk() -> None:
    window = Window("w", _chunk([1, 2]))
    window.on_watermark(mark("w", LOW))
    window.on_truncate("public.t")
    assert window.on_watermark(mark("w", HIGH))
    assert window.rows() == ([], [])


def test_a_keyless_chunk_goes_out_whole_unless_truncated_in_its_window() -> None:
    """No key tells which row a change touched: every row goes out (an append sink keeps
    them beside the changes); a truncate in the window still drops them."""
    rows = ChunkRead("public.k", [None, None], [b"a", b"b"], [8], False, keyed=False)
    window = Window("w", rows)
    window.on_watermark(mark("w", LOW))
    window.on_change("public.k", None)
    assert window.on_watermark(mark("w", HIGH))
    assert window.rows() == ([None, None], [b"a", b"b"])
    truncated = Window("v", rows)
    truncated.on_watermark(mark("v", LOW))
    truncated.on_truncate("public.k")
    truncated.on_watermark(mark("v", HIGH))
    assert truncated.rows() == ([], [])


def test_keyless_chunks_are_page_ranges_open_at_the_table_end() -> None:
    from rayconnect.source_tasks.postgres.window_reader import ROWS_PER_PAGE_GUESS, keyless_chunk

    first = keyless_chunk("public.k", None, pages=100, per_page=40.0, rows=400)
    assert (first.lo, first.hi) == ([0], [10])
    middle = keyless_chunk("public.k", [90], pages=100, per_page=40.0, rows=400)
    assert (middle.lo, middle.hi) == ([90], None)  # reaches the end: the pages added too
    guessed = keyless_chunk("public.k", [3], pages=1000, per_page=0.0, rows=500)
    assert (guessed.lo, guessed.hi) == ([3], [3 + 500 // ROWS_PER_PAGE_GUESS])
    empty = keyless_chunk("public.k", None, pages=0, per_page=0.0, rows=500)
    assert (empty.lo, empty.hi) == ([0], None)


def test_pending_tables_move_on_chunk_by_chunk_and_are_asked_once() -> None:
    p = Progress(known=["public.a"])
    assert p.request(["public.b", "public.c", "public.b"]) == ["public.b", "public.c"]
    assert p.request(["public.b"]) == []
    assert p.known == ["public.a", "public.b", "public.c"]
    p.chunk_written([10], exhausted=False)
    assert (p.pending, p.pending_after) == (["public.b", "public.c"], [10])
    p.chunk_written(None, exhausted=True)
    assert (p.pending, p.pending_after) == (["public.c"], None)
    again = Progress.from_offset(msgspec.json.decode(msgspec.json.encode(p.to_offset())))
    assert again == p


def test_requests_and_logical_messages_decode() -> None:
    assert decode_request(encode_request(["public.a", "b"])) == ["public.a", "b"]
    assert decode_request(b"not json") == []
    content = b"w:high"
    payload = (
        b"M" + b"\x01" + struct.pack(">Q", 0x16B3748) + b"rayconnect.watermark.s\x00"
        + struct.pack(">i", len(content)) + content
    )  # fmt: skip
    assert decode(payload) == LogicalMessage(True, "rayconnect.watermark.s", content)


# -- the property: random interleavings against a model table ------------------------------

KEYS = st.integers(min_value=0, max_value=12)
WRITE = st.tuples(st.sampled_from(["upsert", "delete"]), KEYS, st.integers(0, 99))
#: per chunk: writes before its low watermark, between low and the read, between the read
#: and the high watermark
CHUNK_WRITES = st.tuples(*(st.lists(WRITE, max_size=4) for _ in range(3)))


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(KEYS, st.integers(0, 99)),
    chunks=st.lists(CHUNK_WRITES, min_size=1, max_size=8),
    chunk_rows=st.integers(1, 5),
    after=st.lists(WRITE, max_size=4),
)
def test_any_interleaving_of_writes_and_chunk_reads_ends_equal_to_the_table(
    initial: dict[int, int],
    chunks: list[tuple[list[tuple[str, int, int]], ...]],
    chunk_rows: int,
    after: list[tuple[str, int, int]],
) -> None:
    """A table the reader never saw (added to the publication while streaming): the WAL is
    the writes and the watermarks in commit order; the task reads chunks (``chunk_rows``
    keys after the last written) between watermarks, and the reader applies what the task
    emits in order. Once every chunk is read and the stream drained, the reader equals the
    table - a chunk row never overwrote a newer write, and no row was missed."""
    table = dict(initial)
    wal: list[tuple[str, Any]] = []  # ("write", (op, key, value)) / ("mark", bytes)
    progress = Progress(known=[])
    progress.request(["public.t"])
    reads: dict[str, ChunkRead] = {}

    def write(op: str, key: int, value: int) -> None:
        if op == "upsert":
            table[key] = value
        else:
            table.pop(key, None)
        wal.append(("write", (op, key, value)))

    # the task: chunks read one after another (the next once the stream met the high
    # watermark of the one before: here the WAL is replayed after all were read, so the
    # chunk boundaries come from reading the table itself as it was at each read)
    last: int | None = None
    for n, (before_low, before_read, before_high) in enumerate(chunks):
        for w in before_low:
            write(*w)
        wid = f"w{n}"
        wal.append(("mark", mark(wid, LOW)))
        for w in before_read:
            write(*w)
        keys = sorted(k for k in table if last is None or k > last)[:chunk_rows]
        exhausted = len(keys) < chunk_rows
        reads[wid] = ChunkRead(
            "public.t", [b"%d" % k for k in keys], [b"%d" % table[k] for k in keys],
            [keys[-1]] if keys else None, exhausted,
        )  # fmt: skip
        for w in before_high:
            write(*w)
        wal.append(("mark", mark(wid, HIGH)))
        if exhausted:
            break
        last = keys[-1]
    else:  # the table was not read to its end: read the rest in one chunk, quiet
        keys = sorted(k for k in table if last is None or k > last)
        wal.append(("mark", mark("rest", LOW)))
        reads["rest"] = ChunkRead(
            "public.t", [b"%d" % k for k in keys], [b"%d" % table[k] for k in keys],
            [keys[-1]] if keys else None, True,
        )  # fmt: skip
        wal.append(("mark", mark("rest", HIGH)))
    for w in after:
        write(*w)

    # the stream, as the task meets it: changes go out, windows drop what they changed
    reader: dict[int, int] = {}
    window: Window | None = None
    for kind, item in wal:
        if kind == "write":
            op, key, value = item
            if op == "upsert":
                reader[key] = value
            else:
                reader.pop(key, None)
            if window is not None:
                window.on_change("public.t", b"%d" % key)
        else:
            content: bytes = item
            wid = content.decode().partition(":")[0]
            if window is None or window.id != wid:
                window = Window(wid, reads[wid])
            if window.on_watermark(content):
                keys_out, values_out = window.rows()
                for k, v in zip(keys_out, values_out, strict=True):
                    reader[int(k or b"")] = int(v)
                progress.chunk_written(window.chunk.last_key, window.chunk.exhausted)
                window = None
    assert reader == table
    assert progress.pending == []
