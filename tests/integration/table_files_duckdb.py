"""Read a Delta table back the way users would with DuckDB's ``delta_scan`` (its extension
comes from the duckdb-ext-delta wheel: DuckDB cannot download it here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import duckdb_ext


def duckdb_delta_rows(table: Path | str, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` with ``TABLE`` standing for ``delta_scan(table)``."""
    extensions = Path(next(iter(duckdb_ext.__path__))) / "extensions"
    con = duckdb.connect(
        config={"extension_directory": str(extensions), "autoinstall_known_extensions": False}
    )
    try:
        con.sql("LOAD delta;")
        return con.sql(sql.replace("TABLE", f"delta_scan('{table}')")).fetchall()
    finally:
        con.close()
