"""Cutting a table into snapshot chunks (pure): what several workers read at once.

Every plan covers the whole key space - the first chunk is open below, the last open above -
so an estimate that is off (rows added since ``ANALYZE``, keys denser than thought) makes
chunks uneven, never leaves a row out. Chunk boundaries are keys as the records carry them
(``progress.comparable_key`` of the record key's JSON), so ``Progress.in_snapshot`` compares
a streamed change's key with them as it does with ``after``.

- one integer key column: the value range ``[min, max]`` cut evenly (``min``/``max`` come
  from the key's index: no scan);
- any other key: boundaries sampled every ``chunk_rows`` keys in key order (one pass over
  the key, ``key_boundaries`` in ``snapshot``);
- no key: heap page ranges (``ctid``), sized by the table's rows per page.
"""

from __future__ import annotations

import math

from rayconnect.source_tasks.postgres.progress import Chunk, Key


def _chunks(table: str, cuts: list[Key], start: Key | None) -> list[Chunk]:
    """Chunks between consecutive ``cuts`` (each a chunk's ``hi``, the next one's ``lo``),
    open at both ends; ``start``: the first chunk's ``lo`` (a resumed table's key)."""
    bounds: list[Key | None] = [start, *cuts, None]
    return [Chunk(table, lo, hi, lo) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def int_chunks(
    table: str, low: int | None, high: int | None, rows: float, chunk_rows: int,
    start: Key | None = None,
) -> list[Chunk]:  # fmt: skip
    """An integer key's range ``[low, high]`` cut into about ``rows / chunk_rows`` equal
    value ranges (one chunk for an empty table: ``low`` None)."""
    if low is None or high is None:
        return _chunks(table, [], start)
    count = max(1, math.ceil(rows / chunk_rows))
    step = max(1, math.ceil((high - low + 1) / count))
    cuts = [[low - 1 + step * i] for i in range(1, count) if low - 1 + step * i < high]
    if start is not None:
        cuts = [c for c in cuts if c > start]
    return _chunks(table, cuts, start)


def boundary_chunks(table: str, boundaries: list[Key], start: Key | None = None) -> list[Chunk]:
    """Chunks between sampled keys (ascending, each the last key of its chunk)."""
    cuts = [b for b in boundaries if start is None or b > start]
    return _chunks(table, cuts, start)


def page_chunks(table: str, pages: int, rows: float, chunk_rows: int) -> list[Chunk]:
    """A keyless table's heap pages ``[0, pages)`` in ranges of about ``chunk_rows`` rows;
    the last range is open (pages the table gained since ``pages`` was read)."""
    per_page = rows / pages if pages > 0 and rows > 0 else 0.0
    span = max(1, math.ceil(chunk_rows / per_page)) if per_page else max(1, pages)
    starts = list(range(0, max(pages, 1), span))
    return [
        Chunk(table, [lo], [starts[i + 1]] if i + 1 < len(starts) else None, None)
        for i, lo in enumerate(starts)
    ]
