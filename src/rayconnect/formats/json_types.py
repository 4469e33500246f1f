"""Types Arrow's JSON reader does not parse from their JSON form, and the conversion after it.

The reader is told a type it can parse (``parse_type``) and the column is converted to the
table's type afterwards (``convert``):

- ``date``: a ``YYYY-MM-DD`` string (the reader takes only numbers for date32);
- ``binary``: base64 text (the reader would keep the text's own bytes), as Debezium and Kafka
  Connect's JSON converter write bytes;
- a zoned ``timestamp``: parsed without the zone (the reader refuses zoned types; a value's
  offset is applied while parsing) and stamped UTC after;
- lists of them, element by element.

A value that does not convert (``infinity`` as a date, text that is not base64) makes its row
invalid: the caller turns it into a bad record with the reason, never a null.
"""

from __future__ import annotations

import binascii

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def parse_type(t: pa.DataType) -> pa.DataType:
    """What the JSON reader is told for a column of type ``t``."""
    if pa.types.is_date32(t) or pa.types.is_binary(t):
        return pa.string()
    if pa.types.is_timestamp(t) and t.tz is not None:
        return pa.timestamp(t.unit)
    if pa.types.is_list(t):
        inner = parse_type(t.value_type)
        return t if inner == t.value_type else pa.list_(inner)
    return t


def convert(column: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray | None]:
    """``column`` (as parsed with ``parse_type(target)``) as ``target``, and which rows did
    not convert (None: all did)."""
    if pa.types.is_date32(target):
        parsed = pc.strptime(column, format="%Y-%m-%d", unit="s", error_is_null=True)
        return parsed.cast(pa.date32()), _lost(column, parsed)
    if pa.types.is_binary(target):
        return _base64(column)
    if pa.types.is_timestamp(target):
        return column.cast(target), None
    if pa.types.is_list(target):
        return _list(column, target)
    return column, None


def _lost(before: pa.Array, after: pa.Array) -> np.ndarray | None:
    lost = pc.and_(pc.is_valid(before), pc.is_null(after)).to_numpy(zero_copy_only=False)
    return lost if lost.any() else None


def _base64(column: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    out: list[bytes | None] = []
    bad = np.zeros(len(column), dtype=bool)
    for i, text in enumerate(column.to_pylist()):
        if text is None:
            out.append(None)
            continue
        try:
            out.append(binascii.a2b_base64(text, strict_mode=True))
        except (binascii.Error, ValueError):
            out.append(None)
            bad[i] = True
    return pa.array(out, pa.binary()), bad if bad.any() else None


def _list(column: pa.Array, target: pa.ListType) -> tuple[pa.Array, np.ndarray | None]:
    if column.offset:
        column = pa.concat_arrays([column])  # offsets from 0: they index ``values`` as is
    items, bad_items = convert(column.values, target.value_type)
    out = pa.ListArray.from_arrays(column.offsets, items, type=target, mask=column.is_null())
    if bad_items is None:
        return out, None
    bad = np.zeros(len(column), dtype=bool)
    parents = pc.list_parent_indices(column).to_numpy()
    bad[parents[bad_items[: len(parents)]]] = True
    return out, bad
