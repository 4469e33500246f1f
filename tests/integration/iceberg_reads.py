"""Read an Iceberg sink's table back the way users would: pyiceberg's scan, and DuckDB's
``iceberg_scan`` (its extensions come from the duckdb-ext-* wheels: DuckDB cannot download
them here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import duckdb_ext

import rayconnect as rc
from rayconnect.tables.factory import open_committer

Row = tuple[str, str, int, int]
_COLUMNS = ("cluster", "topic", "partition", "offset")


def load_table(sink: rc.IcebergSink, table: str | None = None) -> Any:
    """The table (``table``, default the sink's) at its latest metadata, through a catalog
    connection of its own."""
    committer = open_committer(sink, "reader")
    return committer.catalog().load_table(table or sink.table)


def iceberg_rows(sink: rc.IcebergSink) -> list[Row]:
    """(cluster, topic, partition, offset) of every row, by pyiceberg's scan."""
    t = load_table(sink).scan(selected_fields=_COLUMNS).to_arrow()
    return list(zip(*(t[c].to_pylist() for c in _COLUMNS), strict=True))


def duckdb_rows(sink: rc.IcebergSink) -> list[Row]:
    """The same rows by DuckDB's ``iceberg_scan`` of the current metadata file."""
    return duckdb_query(sink, 'SELECT "cluster", "topic", "partition", "offset" FROM TABLE')


def duckdb_query(sink: rc.IcebergSink, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` by DuckDB, ``TABLE`` standing for ``iceberg_scan`` of the current metadata."""
    extensions = Path(next(iter(duckdb_ext.__path__))) / "extensions"
    con = duckdb.connect(
        config={"extension_directory": str(extensions), "autoinstall_known_extensions": False}
    )
    try:
        con.sql("LOAD avro; LOAD iceberg;")
        metadata = load_table(sink).metadata_location
        query = sql.replace("TABLE", "iceberg_scan(?)")
        return [tuple(r) for r in con.execute(query, [metadata]).fetchall()]
    finally:
        con.close()
