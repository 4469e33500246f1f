"""``RowGroupFile``: a Parquet file whose row groups have a useful size, whatever the pieces.

Pyarrow's ``ParquetWriter.write_table`` starts a new row group on every call. A file of a
participant host's flush holds one piece per partition of the host, and at 1,024 partitions
a round's piece is ~60 rows: every file had ~256 row groups of ~60 rows - each with its own
column chunks, statistics and footer entries, slow to write (bench: 42% of the writer's CPU
at 1,024 partitions went to ``write_table``) and slow for every reader of the table, which
plans and reads per row group. So pieces are gathered and written as one row group once
they reach ``ROW_GROUP_ROWS`` rows or ``ROW_GROUP_BYTES`` bytes, and at close.

The pieces gathered are Arrow tables the caller already holds (slices of the fetched data, or
rows decoded from them): gathering keeps them alive until their row group is written. The
byte bound counts the slices; the objects they slice (one per host per poll) stay alive with
them - at most the objects of the write's own flushes, which the writer's process holds all
at once anyway when it writes without Spark.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

#: a row group is written once the gathered pieces reach this many rows (DuckDB's default
#: row group is 122,880 rows; a larger piece is written as it comes)
ROW_GROUP_ROWS = 131_072
#: ... or this many bytes of Arrow data
ROW_GROUP_BYTES = 32 * 1024 * 1024


class RowGroupFile:
    """An open Parquet file that gathers pieces into row groups (the module's why)."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self._writer = writer
        self._pieces: list[pa.Table] = []
        self._rows = 0
        self._bytes = 0

    @property
    def schema(self) -> pa.Schema:
        return self._writer.schema

    def write(self, piece: pa.Table) -> None:
        """Add ``piece`` (the file's schema) to the file; written with the pieces before it
        once they are a row group's worth."""
        self._pieces.append(piece)
        self._rows += piece.num_rows
        self._bytes += piece.nbytes
        if self._rows >= ROW_GROUP_ROWS or self._bytes >= ROW_GROUP_BYTES:
            self._flush()

    def close(self) -> None:
        """Write what is gathered and close the file."""
        try:
            self._flush()
        finally:
            self._writer.close()

    def _flush(self) -> None:
        pieces, self._pieces = self._pieces, []
        self._rows = self._bytes = 0
        if len(pieces) == 1:
            self._writer.write_table(pieces[0])
        elif pieces:
            self._writer.write_table(pa.concat_tables(pieces))
