"""Column types a block's records declare in their ``rayconnect.value_schema`` header.

A producer that knows its columns' types - rayconnect's Postgres source does, from pgoutput's
Relation messages - puts them on each record as a ``value_schema`` in JSON (``{"amount":
"decimal(12,2)", "day": "date"}``, the names of ``formats.types``). The JSON decoder types
the columns the table does not have yet by it (``JsonDecoder``'s hints); a column the table
has keeps the table's type, so a type change at the source follows the table's rules
(docs/guides/upserts.md#ddl-column-type-changes-and-renames), as with inferred columns.

Read without a Python object per record: the headers are flattened in Arrow and only their
distinct values decoded (a table has one per shape). Several shapes in one block (an ``ALTER
TABLE`` mid-block): the first one's type of a column wins. A header that is not such a JSON
object is ignored (the columns are then inferred): a header is a hint, never a bad record.
"""

from __future__ import annotations

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.formats.types import TypeNameError, declared_fields

VALUE_SCHEMA_HEADER = "rayconnect.value_schema"

_decode = msgspec.json.Decoder(dict[str, str]).decode


def hinted_schema(headers: pa.ChunkedArray | pa.Array) -> pa.Schema | None:
    """The columns the block's ``rayconnect.value_schema`` headers declare (None: none)."""
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if len(headers) == 0 or headers.null_count == len(headers):
        return None
    flat = pc.list_flatten(headers)
    if len(flat) == 0:
        return None
    mine = pc.equal(pc.struct_field(flat, "key"), VALUE_SCHEMA_HEADER)
    values = pc.struct_field(flat, "value").filter(mine)
    fields: dict[str, pa.Field] = {}
    for value in pc.unique(values).to_pylist():
        if value is None:
            continue
        try:
            declared = declared_fields(_decode(value), VALUE_SCHEMA_HEADER)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeNameError):
            continue
        for f in declared:
            fields.setdefault(f.name, f)
    return pa.schema(list(fields.values())) if fields else None
