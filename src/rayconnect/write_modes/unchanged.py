"""Values a change does not carry: Postgres's unchanged TOASTed columns, kept as they are.

With the default replica identity, pgoutput does not send a large (TOASTed) column that an
UPDATE did not change; Debezium puts its placeholder ``__debezium_unavailable_value`` in
``after``, and rayconnect's Postgres source does the same for text columns and lists such
columns in the record header ``rayconnect.unchanged`` (every type: a decimal or a list
cannot hold the placeholder). Written as it came, the row would replace a real value by the
placeholder (or a null): the mirror would drift from the database wherever a big value sits
next to a busy column - the hole every CDC tool has (airbyte #30518, ClickHouse #83517) unless
the table is ``REPLICA IDENTITY FULL``.

An upsert table holds the value, so the sink closes the hole itself, in three steps:

1. **Decoding** (``mark``): a change's column that holds the placeholder, or that its header
   names, becomes null and gets a mark - a boolean column ``_rayconnect_unchanged__<name>``,
   true where the change does not carry ``<name>``, only in blocks that have one.
2. **The fold** (``fill_in_round``): the key's last change takes such a value from the
   latest earlier change of the same key in the round that carried it (an insert, a change
   of that column).
3. **The table** (``fill_from_table``): what is left is read from the key's row in the table
   - in the files where the round's key search found the key (merge-on-read: the rows it
   deletes; copy-on-write: the same search for these keys alone), the newest row of the
   key (the greatest ``_kafka_offset``: a key lives in one partition, so its newest row is
   the live one - every older one was replaced). A key the table does not hold keeps the
   null, and the round's log says how many.

The marks are write-mode columns: never written to the table (``fold.CHANGE_COLUMNS``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.protocol.unchanged_marker import UNCHANGED_HEADER, unchanged_columns

log = logging.getLogger(__name__)

#: the mark of a change's column it does not carry: ``UNCHANGED_PREFIX + column``
UNCHANGED_PREFIX = "_rayconnect_unchanged__"

_OFFSET = "_kafka_offset"


def marks_of(table: pa.Table) -> list[str]:
    """The mark columns of ``table``."""
    return [n for n in table.column_names if n.startswith(UNCHANGED_PREFIX)]


def column_of(mark: str) -> str:
    return mark[len(UNCHANGED_PREFIX) :]


def mark(
    columns: pa.Table, headers: pa.ChunkedArray | pa.Array | None, placeholder: str | None
) -> tuple[pa.Table, dict[str, pa.Array]]:
    """``columns`` (decoded change rows) with the values a change does not carry set to
    null, and their marks: columns holding ``placeholder`` (text or binary), and the columns
    each record's ``UNCHANGED_HEADER`` names (``headers``: the records' Kafka headers)."""
    flags: dict[str, np.ndarray] = {}
    n = columns.num_rows
    if placeholder is not None:
        for field in columns.schema:
            if not _holds_text(field.type):
                continue
            found = pc.fill_null(pc.equal(columns.column(field.name), placeholder), False)
            if pc.any(found).as_py():
                flags[field.name] = found.to_numpy(zero_copy_only=False).copy()
    for row, names in _header_lists(headers):
        for name in names:
            if name in columns.column_names:
                flags.setdefault(name, np.zeros(n, dtype=bool))[row] = True
    for name, flag in flags.items():
        index = columns.column_names.index(name)
        column = columns.column(name)
        nulls = pa.nulls(n, column.type)
        columns = columns.set_column(
            index, columns.schema.field(name), pc.if_else(pa.array(flag), nulls, column)
        )
    return columns, {UNCHANGED_PREFIX + name: pa.array(flag) for name, flag in flags.items()}


def _holds_text(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def _header_lists(headers: pa.ChunkedArray | pa.Array | None) -> list[tuple[int, list[str]]]:
    """(row, column names) of the records with an ``UNCHANGED_HEADER`` (vectorized: the
    headers are scanned as Arrow columns; only the matching values are parsed)."""
    if headers is None or len(headers) == 0:
        return []
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    flat = pc.list_flatten(headers)
    if len(flat) == 0:
        return []
    hit = pc.fill_null(pc.equal(pc.struct_field(flat, "key"), UNCHANGED_HEADER), False)
    if not pc.any(hit).as_py():
        return []
    rows = pc.list_parent_indices(headers).filter(hit).to_pylist()
    values = pc.struct_field(flat, "value").filter(hit).to_pylist()
    return [(r, unchanged_columns(v)) for r, v in zip(rows, values, strict=True) if v]


def fill_in_round(ranked: pa.Table, winners: np.ndarray, key_columns: list[str]) -> pa.Table:
    """The winning changes (``ranked.take(winners)``: the last change of each key, ``ranked``
    in fold order) with each marked value taken from the latest earlier change of the same
    key that carried it; marks left where none did."""
    rows = ranked.take(pa.array(winners))
    marks = marks_of(ranked)
    if not marks:
        return rows
    deletes = pc.fill_null(ranked.column("_rayconnect_delete"), False)
    for name in marks:
        need = pc.fill_null(rows.column(name), False)
        if not pc.any(need).as_py():
            continue
        carried = pc.and_(pc.invert(pc.fill_null(ranked.column(name), False)), pc.invert(deletes))
        carriers = ranked.filter(carried).select([*key_columns, "__rank"])
        latest = carriers.group_by(key_columns, use_threads=False).aggregate([("__rank", "max")])
        wanted = rows.filter(need).select([*key_columns, "__rank"])
        joined = wanted.join(latest, key_columns, join_type="inner", use_threads=False)
        if joined.num_rows == 0:
            continue
        column = column_of(name)
        source = ranked.column(column).take(joined.column("__rank_max"))
        at = _positions(rows.column("__rank"), joined.column("__rank"))
        rows = _put(rows, column, at, source)
        rows = _put(rows, name, at, pa.array(np.zeros(len(at), dtype=bool)))
    return rows


def fill_from_table(
    rows: pa.Table,
    key_columns: Sequence[str],
    current: Callable[[pa.Table, list[str]], pa.Table],
) -> pa.Table:
    """``rows`` (a round's folded rows) with the values they still do not carry taken from
    the table, and without the marks. ``current(keys, columns)``: the table's rows of those
    keys (key columns, ``columns`` and ``_kafka_offset``; older rows of a key may be among
    them - the newest is taken)."""
    marks = marks_of(rows)
    if not marks:
        return rows
    need = np.zeros(rows.num_rows, dtype=bool)
    for name in marks:
        need |= pc.fill_null(rows.column(name), False).to_numpy(zero_copy_only=False)
    if need.any():
        wanted = [column_of(m) for m in marks]
        keys = rows.filter(pa.array(need)).select(list(key_columns))
        found = _newest(current(keys, wanted), list(key_columns))
        rows = _take_found(rows, marks, key_columns, found)
    return rows.drop_columns(marks)


def _take_found(
    rows: pa.Table, marks: list[str], key_columns: Sequence[str], found: pa.Table
) -> pa.Table:
    """``rows``' marked values taken from ``found`` (one row a key), where it has the key."""
    missing = sum(pc.sum(pc.fill_null(rows.column(m), False)).as_py() or 0 for m in marks)
    if found.num_rows:
        indexed = rows.select(list(key_columns)).append_column(
            "__row", pa.array(np.arange(rows.num_rows, dtype=np.int64))
        )
        positions = pa.array(np.arange(found.num_rows, dtype=np.int64))
        matched = indexed.join(  # keys and positions only: a join carries no list column
            found.select(list(key_columns)).append_column("__found", positions),
            list(key_columns),
            join_type="inner",
            use_threads=False,
        )
        at_row = matched.column("__row").to_numpy()
        at_found = matched.column("__found")
        for name in marks:
            flag = pc.fill_null(rows.column(name), False).to_numpy(zero_copy_only=False)
            take = flag[at_row]
            missing -= int(take.sum())
            if take.any():
                values = found.column(column_of(name)).take(at_found.filter(pa.array(take)))
                rows = _put(rows, column_of(name), at_row[take], values)
    if missing:
        log.warning("%d unchanged value(s) of keys the table does not hold stay null", missing)
    return rows


def _newest(found: pa.Table, key_columns: list[str]) -> pa.Table:
    """One row a key: the greatest ``_kafka_offset`` (its live row)."""
    if found.num_rows == 0:
        return found
    ranked = found.select([*key_columns, _OFFSET]).append_column(  # (no list column)
        "__i", pa.array(np.arange(found.num_rows, dtype=np.int64))
    )
    order = pc.sort_indices(ranked, [(_OFFSET, "descending")])
    ranked = ranked.take(order)
    first = ranked.group_by(key_columns, use_threads=False).aggregate([("__i", "first")])
    return found.take(first.column("__i_first"))


def _positions(ranks: pa.ChunkedArray, wanted: pa.ChunkedArray) -> np.ndarray:
    """Where each of ``wanted`` (ranks) is in ``ranks`` (unique)."""
    return np.asarray(pc.index_in(wanted, value_set=ranks.combine_chunks()).to_numpy())


def _put(rows: pa.Table, name: str, at: np.ndarray, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``rows`` with column ``name``'s values at rows ``at`` replaced by ``values``."""
    column = rows.column(name).combine_chunks()
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if values.type != column.type:
        values = values.cast(column.type)
    order = np.full(rows.num_rows, -1, dtype=np.int64)
    order[at] = np.arange(len(at))
    chosen = pa.array(order >= 0)
    taken = values.take(pa.array(np.where(order >= 0, order, 0))) if len(values) else column
    index = rows.column_names.index(name)
    return rows.set_column(index, rows.schema.field(name), pc.if_else(chosen, taken, column))
