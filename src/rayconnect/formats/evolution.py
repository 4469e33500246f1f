"""How a table's schema may grow: the pure rules the committer applies to a round's files.

- a column the table lacks -> added, nullable (older rows read as null);
- the same column, the same type -> fine; a narrower int or float in the file (int -> long,
  float -> double) -> fine, the table keeps the wider type (readers upcast);
- any other difference (string vs long, a struct vs a number, a table type narrower than the
  file's) -> a conflict. Values that conflict are caught earlier, by the decoder, as bad
  records; a conflict here means a file that must not be committed.

A raw table never grows: a file must have exactly its columns (``schema_differences``).
Both compare types as ``normalize_type`` spells them.
"""

from __future__ import annotations

import pyarrow as pa


def normalize_type(t: pa.DataType) -> pa.DataType:
    """The part of an Arrow type Delta cares about.

    Dropped: nullability, field metadata and list item names (Spark writes ``element``,
    pyarrow defaults to ``item``), none of which changes how Delta reads the column.
    """
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(normalize_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, normalize_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(normalize_type(t.key_type), normalize_type(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def schema_differences(file_schema: pa.Schema, table_schema: pa.Schema) -> list[str]:
    """Human-readable differences that would make the file unreadable as part of the table.

    Empty list = compatible. Column order and nullability are ignored (the table's columns
    are all nullable; Delta reads files by column name).
    """
    problems: list[str] = []
    file_fields = {f.name: f for f in file_schema}
    for field in table_schema:
        other = file_fields.pop(field.name, None)
        if other is None:
            problems.append(f"missing column {field.name!r}")
        elif normalize_type(other.type) != normalize_type(field.type):
            problems.append(f"column {field.name!r} is {other.type}, table has {field.type}")
    problems.extend(f"extra column {name!r}" for name in file_fields)
    return problems


#: (file type, table type) pairs a reader upcasts: the file may hold the narrower one.
_WIDENING = {
    (pa.int8(), pa.int16()),
    (pa.int8(), pa.int32()),
    (pa.int8(), pa.int64()),
    (pa.int16(), pa.int32()),
    (pa.int16(), pa.int64()),
    (pa.int32(), pa.int64()),
    (pa.float32(), pa.float64()),
}


def compatible(file_type: pa.DataType, table_type: pa.DataType) -> bool:
    """Whether a file column of ``file_type`` can be read as the table's ``table_type``."""
    a, b = normalize_type(file_type), normalize_type(table_type)
    return a == b or (a, b) in _WIDENING


def merge(table: pa.Schema, incoming: pa.Schema) -> tuple[pa.Schema, list[str]]:
    """The table's schema after adding what ``incoming`` (a file's schema) brings, and the
    conflicts that forbid committing it (empty: fine). Never drops or narrows a column."""
    conflicts: list[str] = []
    new_fields: list[pa.Field] = []
    for f in incoming:
        if f.name in table.names:
            t = table.field(f.name).type
            if not compatible(f.type, t):
                conflicts.append(f"column {f.name!r} is {f.type} in the data, {t} in the table")
        elif pa.types.is_null(f.type):
            continue
        else:
            new_fields.append(f.with_nullable(True))
    return pa.schema(list(table) + new_fields), conflicts
