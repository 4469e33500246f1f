"""Reading the tables as of an exported snapshot, a chunk at a time (blocking psycopg2).

One REPEATABLE READ transaction imports the snapshot and stays open across reads (one per
snapshot worker: ``snapshot_workers``). Rows come in bulk, by ``COPY (SELECT ...) TO
STDOUT`` (``copy_text``): a page of a chunk of a keyed table in key order by keyset (``WHERE
(k1, k2) > (after) AND (k1, k2) <= (hi) ORDER BY k1, k2 LIMIT n``, text keys in the "C"
collation: byte order, which is Python's order of the same strings, so
``Progress.in_snapshot`` compares keys as Postgres did); a keyless table's chunk whole, by
its ``ctid`` range (a TID range scan). ``plan`` cuts a table into chunks
(``snapshot_plan``) in the same snapshot.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from rayconnect.source_tasks.postgres.copy_text import parse_columns, parse_rows
from rayconnect.source_tasks.postgres.events import RowCodec, TableShape, key_values
from rayconnect.source_tasks.postgres.progress import Chunk, Key, comparable_key
from rayconnect.source_tasks.postgres.snapshot_plan import (
    boundary_chunks,
    int_chunks,
    page_chunks,
)

SqlTypes = dict[str, tuple[str, bool]]
Rows = list[list[bytes | None]]
_INTEGERS = frozenset({"smallint", "integer", "bigint"})


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SnapshotReader:
    """``snapshot_name`` None: each read sees what is committed when it starts (the
    snapshot while streaming reads between watermarks: ``incremental_snapshot``)."""

    def __init__(self, conn: Any, snapshot_name: str | None) -> None:
        self.conn = conn
        if snapshot_name is None:
            return
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))

    def _copy(self, sql: str, params: list[Any]) -> bytes:
        with self.conn.cursor() as cur:
            query = cur.mogrify(sql, params).decode()
            out = io.BytesIO()
            cur.copy_expert(f"COPY ({query}) TO STDOUT", out)
        return out.getvalue()

    def read(self, shape: TableShape, sql_types: SqlTypes, chunk: Chunk, limit: int) -> Rows:
        """The next rows of ``chunk`` (as Postgres text): up to ``limit`` after its
        ``after`` in key order; a keyless table's chunk all at once."""
        return parse_rows(self._copy(*self._select(shape, sql_types, chunk, limit)))

    def read_columns(
        self, shape: TableShape, sql_types: SqlTypes, chunk: Chunk, limit: int
    ) -> list[Sequence[bytes | None]]:
        """``read``'s rows as columns (``copy_text.parse_columns``); the shape has columns."""
        data = self._copy(*self._select(shape, sql_types, chunk, limit))
        return parse_columns(data, len(shape.columns))

    def _select(
        self, shape: TableShape, sql_types: SqlTypes, chunk: Chunk, limit: int
    ) -> tuple[str, list[Any]]:
        table = f"{_ident(shape.schema)}.{_ident(shape.table)} AS src"
        select = ", ".join("src." + _ident(c.name) for c in shape.columns)
        if not shape.primary_key:
            assert chunk.lo is not None
            sql = f"SELECT {select} FROM {table} WHERE src.ctid >= %s::tid"
            params: list[Any] = [f"({int(chunk.lo[0])},0)"]
            if chunk.hi is not None:
                sql += " AND src.ctid < %s::tid"
                params.append(f"({int(chunk.hi[0])},0)")
            return sql, params
        order = _order(shape, sql_types)
        casts = ", ".join(f"%s::{sql_types[c][0]}" for c in shape.primary_key)
        where = []
        if chunk.after is not None:
            where.append(f"({order}) > ({casts})")
            params = [_param(v) for v in chunk.after]
        else:
            params = []
        if chunk.hi is not None:
            where.append(f"({order}) <= ({casts})")
            params += [_param(v) for v in chunk.hi]
        sql = f"SELECT {select} FROM {table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order} LIMIT {int(limit)}"
        return sql, params

    def plan(
        self, shape: TableShape, sql_types: SqlTypes, chunk_rows: int, start: Key | None = None
    ) -> list[Chunk]:
        """``shape``'s chunks of about ``chunk_rows`` rows (``snapshot_plan``); ``start``:
        only keys above it (a table resumed from an older offset)."""
        name = f"{_ident(shape.schema)}.{_ident(shape.table)}"
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT reltuples, pg_relation_size(oid) / current_setting('block_size')::int "
                "FROM pg_class WHERE oid = %s::regclass",
                (name,),
            )
            estimate, pages = cur.fetchone()
            rows = float(estimate) if estimate and estimate > 0 else None
            if rows is None:  # never analyzed: count (in the snapshot)
                cur.execute(f"SELECT count(*) FROM {name}")
                rows = float(cur.fetchone()[0])
            key = shape.primary_key
            if not key:
                return page_chunks(shape.name, int(pages), rows, chunk_rows)
            if len(key) == 1 and sql_types[key[0]][0] in _INTEGERS:
                cur.execute(f"SELECT min({_ident(key[0])}), max({_ident(key[0])}) FROM {name}")
                low, high = cur.fetchone()
                return int_chunks(shape.name, low, high, rows, chunk_rows, start)
            if rows <= chunk_rows:
                return boundary_chunks(shape.name, [], start)
            order = _order(shape, sql_types)
            texts = ", ".join(f"src.{_ident(c)}::text" for c in key)
            cur.execute(
                f"SELECT {texts} FROM (SELECT src.*, row_number() OVER (ORDER BY {order}) AS rn "
                f"FROM {name} AS src) AS src WHERE rn %% %s = 0",
                (int(chunk_rows),),
            )
            sampled = cur.fetchall()
        codec = RowCodec(shape, types=False)
        position = {c.name: i for i, c in enumerate(shape.columns)}
        boundaries = []
        for texts_row in sampled:
            cells: list[bytes | None] = [None] * len(shape.columns)
            for name_, text in zip(key, texts_row, strict=True):
                cells[position[name_]] = text.encode()
            boundary = comparable_key(key_values(codec.key(cells)))
            assert boundary is not None
            boundaries.append(boundary)
        return boundary_chunks(shape.name, boundaries, start)

    def close(self) -> None:
        try:
            self.conn.rollback()
        finally:
            self.conn.close()


def _order(shape: TableShape, sql_types: SqlTypes) -> str:
    # ``src.col``: a bare name in ORDER BY could mean an output column
    return ", ".join(
        "src." + _ident(name) + (' COLLATE "C"' if sql_types[name][1] else "")
        for name in shape.primary_key
    )


def _param(value: Any) -> Any:
    """A key value back as the text Postgres casts to the key column's type."""
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)
