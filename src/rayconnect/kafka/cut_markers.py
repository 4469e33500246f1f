"""Find the cut markers (``protocol/cut_marks.py``) among a fetch's records, in Arrow.

Only a sink with consistent cuts looks (the reader, once per fetched batch): the headers
column is scanned in C, and the rows come back as (row, LSN) in row order.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.protocol.cut_marks import CUT_HEADER


def marker_rows(batch: pa.RecordBatch) -> list[tuple[int, int]]:
    """The rows of ``batch`` (the raw record schema) that are cut markers, with their LSN.
    A marker whose value is not a decimal LSN is no marker: it stays a record (and its
    format's decoder says what is wrong with it)."""
    headers = batch.column("headers")
    if headers.null_count == len(headers):
        return []
    flat = pc.list_flatten(headers)
    if not len(flat):
        return []
    hits = pc.indices_nonzero(pc.equal(flat.field("key"), CUT_HEADER))
    if not len(hits):
        return []
    rows = pc.list_parent_indices(headers).take(hits).to_pylist()
    values = flat.field("value").take(hits).to_pylist()
    found: list[tuple[int, int]] = []
    for row, value in zip(rows, values, strict=True):
        try:
            found.append((row, int(value)))
        except (TypeError, ValueError):
            continue
    return found
