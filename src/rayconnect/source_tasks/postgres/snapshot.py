"""Reading the tables as of an exported snapshot, a page at a time (blocking psycopg2).

One REPEATABLE READ transaction imports the snapshot and stays open across polls. A table
with a primary key is read in key order by keyset (``WHERE (k1, k2) > (...) ORDER BY k1,
k2 LIMIT n``, text keys in the "C" collation: byte order, which is Python's order of the
same strings, so ``Progress.in_snapshot`` compares keys as Postgres did). A table without
one is read through a server-side cursor. Every column is read as text and typed like the
stream's values (``values``).
"""

from __future__ import annotations

from typing import Any

from rayconnect.source_tasks.postgres.events import TableShape


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SnapshotReader:
    def __init__(self, conn: Any, snapshot_name: str) -> None:
        self.conn = conn
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
        self._cursor: Any = None

    def page(
        self,
        shape: TableShape,
        sql_types: dict[str, tuple[str, bool]],
        after: list[Any] | None,
        limit: int,
    ) -> list[tuple[str | None, ...]]:
        """The next ``limit`` rows (as text) of ``shape`` after key ``after``."""
        # ``src.col``: a bare name in ORDER BY would mean the output column (the text cast)
        table = f"{_ident(shape.schema)}.{_ident(shape.table)} AS src"
        select = ", ".join(f"{_ident(c.name)}::text" for c in shape.columns)
        if not shape.primary_key:
            if self._cursor is None:
                self._cursor = self.conn.cursor(name="rayconnect_snapshot")
                self._cursor.itersize = limit
                self._cursor.execute(f"SELECT {select} FROM {table}")
            rows = self._cursor.fetchmany(limit)
            if len(rows) < limit:
                self._cursor.close()
                self._cursor = None
            return rows

        def sort_key(name: str) -> str:
            return "src." + _ident(name) + (' COLLATE "C"' if sql_types[name][1] else "")

        order = ", ".join(sort_key(c) for c in shape.primary_key)
        sql = f"SELECT {select} FROM {table}"
        params: list[Any] = []
        if after is not None:
            casts = ", ".join(f"%s::{sql_types[c][0]}" for c in shape.primary_key)
            sql += f" WHERE ({order}) > ({casts})"
            params = [_param(v) for v in after]
        sql += f" ORDER BY {order} LIMIT {int(limit)}"
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def close(self) -> None:
        try:
            self.conn.rollback()
        finally:
            self.conn.close()


def _param(value: Any) -> Any:
    """A key value back as the text Postgres casts to the key column's type."""
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)
