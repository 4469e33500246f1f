"""How a table's schema may grow: the pure rules the committer applies to a round's files.

- a column the table lacks -> added, nullable (older rows read as null);
- the same column, the same type -> fine; a narrower int or float in the file (int -> long,
  float -> double) -> fine, the table keeps the wider type (readers upcast);
- any other difference (string vs long, a struct vs a number, a table type narrower than the
  file's) -> a conflict. Values that conflict are caught earlier, by the decoder, as bad
  records; a conflict here means a file that must not be committed.
"""

from __future__ import annotations

import pyarrow as pa

from rayconnect.spark_bridge.files import normalize_type

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
