"""The Arrow data a write is handed: object refs, or ``Rows`` - one partition's rows inside an
object that several partitions share - and how a writer gets them back as tables.

A reader puts ONE object per participant host per fetch (the pieces of all the host's
partitions concatenated), not one per partition: at 1,024 partitions a ``ray.put`` per
partition per fetch was most of the reader's time, and the objects' bookkeeping most of the
object store's. Each partition's piece is a ``Rows(ref, start, count)`` handle, which its
participant buffers (opaquely) and hands to the writer in its flush. The writer fetches each
distinct object once and slices it (zero-copy) per handle.

Memory: an object lives until every partition holding a slice of it has flushed (their
handles are the refs that keep it). That is bounded as a partition's own buffer is: each
partition flushes at every round's END-COMMIT, and within a round by size and age
(``flush_max_records``/``flush_max_bytes``/``flush_max_age_s``), so an object outlives its
put by at most the longest of its partitions' flush bounds - and since a host's partitions
flush together at END, its objects of a round go together. The concatenation is a copy, so an
object never carries the buffers of a bigger fetched batch it was cut from (what a slice
would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import msgspec
import pyarrow as pa
import ray


class Rows(msgspec.Struct, frozen=True):
    """Rows ``start`` to ``start + count`` of the Arrow table or batch at ``ref``."""

    #: an object ref; inside a Struct Ray still hands the ref, not the data
    ref: Any
    start: int
    count: int


#: what a write is handed per block: a ref to a whole table or batch, or rows inside one
Block: TypeAlias = "ray.ObjectRef[Any] | Rows"


def put_together(
    pieces: Sequence[pa.RecordBatch],
    whole: bool = False,
    put: Callable[[pa.RecordBatch], Any] = ray.put,
) -> list[Rows]:
    """Put ``pieces`` as ONE object: concatenated, which copies them out of the (maybe much
    bigger) batches they were sliced from. ``whole``: a lone piece is a whole fetched batch,
    put as it is. Returns each piece's handle, in order."""
    batch = pieces[0] if len(pieces) == 1 and whole else pa.concat_batches(list(pieces))
    ref = put(batch)
    rows, start = [], 0
    for piece in pieces:
        rows.append(Rows(ref, start, piece.num_rows))
        start += piece.num_rows
    return rows


def as_table(data: pa.Table | pa.RecordBatch) -> pa.Table:
    return data if isinstance(data, pa.Table) else pa.Table.from_batches([data])


def ref_of(block: Block) -> Any:
    """The object a block is (a ref) or lies in (``Rows``)."""
    return block.ref if isinstance(block, Rows) else block


def resolve(
    blocks: Sequence[Block],
    fetched: dict[Any, pa.Table] | None = None,
    fetch: Callable[[list[Any]], list[Any]] = ray.get,
) -> list[pa.Table]:
    """The tables of ``blocks`` (object refs, or ``Rows`` handles), in order. Each distinct
    object is fetched once, all in one ``fetch``; ``fetched`` keeps what was fetched for later
    calls (a Spark task resolving its blocks batch by batch)."""
    fetched = {} if fetched is None else fetched
    refs = [ref_of(b) for b in blocks]
    missing = list(dict.fromkeys(r for r in refs if r not in fetched))
    if missing:
        fetched.update(zip(missing, (as_table(d) for d in fetch(missing)), strict=True))
    return [
        fetched[ref].slice(b.start, b.count) if isinstance(b, Rows) else fetched[ref]
        for b, ref in zip(blocks, refs, strict=True)
    ]
