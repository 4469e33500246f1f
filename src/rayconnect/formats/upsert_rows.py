"""The rows of an upsert table's round: each with its key and whether it deletes it.

Which change a record is: with ``envelope: debezium``, the event's ``op`` (``formats.debezium``);
with plain records, a null value (a tombstone) deletes its key and any other value writes
its row. The key columns come from the row (the value, or a change event's ``before`` for a
delete); where the row has none of a key column - a tombstone has no row at all - from the
record key's field of the same name (``key_format: json``). A change whose key is still
incomplete cannot apply to any row: it is a bad record, with that reason - unless it is
a truncate, which is about no key (``TRUNCATE_COLUMNS``, only in a block that has one).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.write_modes.fold import DELETE_COLUMN, TRUNCATE_COLUMNS, missing_key

KEY_COLUMN = "_kafka_key"


def keyed_rows(
    rows: pa.Table,
    deletes: pa.Array,
    key_columns: tuple[str, ...],
    origin: np.ndarray,
    marks: Mapping[str, pa.Array] = {},
) -> tuple[pa.Table, dict[int, str]]:
    """``rows`` with their key columns completed from the record key, ``DELETE_COLUMN``
    set from ``deletes`` (one per row) and the ``marks`` columns added (the truncates,
    ``TRUNCATE_COLUMNS``, need no key); the other rows without a whole key removed and
    returned as bad, by their index in the block (``origin[row]``)."""
    for name in key_columns:
        rows = _with_key_column(rows, name)
    missing = missing_key(rows, list(key_columns))
    rows = rows.append_column(DELETE_COLUMN, deletes)
    for name, column in marks.items():
        rows = rows.append_column(name, column)
    for name in TRUNCATE_COLUMNS:
        if name in marks:
            missing = pc.and_(missing, pc.invert(marks[name]))
    bad: dict[int, str] = {}
    if pc.any(missing).as_py():
        reason = f"key column(s) {list(key_columns)}: not all in the row or the record key"
        bad = {int(origin[i]): reason for i in pc.indices_nonzero(missing).to_pylist()}
        rows = rows.filter(pc.invert(missing))
    untyped = [n for n in key_columns if pa.types.is_null(rows.schema.field(n).type)]
    return rows.drop_columns(untyped), bad  # (a key column no row had says nothing of its type)


def _with_key_column(rows: pa.Table, name: str) -> pa.Table:
    from_key = _key_field(rows, name)
    if name not in rows.column_names:
        if from_key is None:
            return rows.append_column(name, pa.nulls(rows.num_rows))
        return rows.append_column(name, from_key)
    if from_key is None:
        return rows
    column = rows.column(name)
    index = rows.column_names.index(name)
    return rows.set_column(index, name, pc.coalesce(column, from_key.cast(column.type)))


def _key_field(rows: pa.Table, name: str) -> pa.ChunkedArray | None:
    if KEY_COLUMN not in rows.column_names:
        return None
    key = rows.column(KEY_COLUMN)
    if not pa.types.is_struct(key.type) or key.type.get_field_index(name) < 0:
        return None
    return pc.struct_field(key, name)
