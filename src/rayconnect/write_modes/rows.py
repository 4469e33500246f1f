"""A folded round as one table of changes, the shape a MERGE or DELETE+APPEND takes."""

from __future__ import annotations

import pyarrow as pa

from rayconnect.write_modes.fold import DELETE_COLUMN, Folded


def with_delete_flag(folded: Folded) -> tuple[pa.Table, str]:
    """The rows to write and the keys to delete in one table (the deleted keys' other
    columns null), with ``DELETE_COLUMN`` saying which is which; and that column's name."""
    rows = folded.rows.append_column(DELETE_COLUMN, pa.repeat(False, folded.rows.num_rows))
    deleted = pa.table(
        {
            f.name: folded.deleted.column(f.name)
            if f.name in folded.deleted.column_names
            else pa.nulls(folded.deleted.num_rows, f.type)
            for f in folded.rows.schema
        },
        schema=folded.rows.schema,
    ).append_column(DELETE_COLUMN, pa.repeat(True, folded.deleted.num_rows))
    return pa.concat_tables([rows, deleted]), DELETE_COLUMN
