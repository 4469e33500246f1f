"""Talking to Postgres outside the stream: connecting, the pre-start checks, the
publication, the replication slots, table shapes and lag (blocking psycopg2 calls: the task
runs them in a thread).

Every check raises ConfigError naming the setting to fix, so ``rayconnect run`` exits 2
with it before any actor starts, and a task that meets it later says it in its status.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from rayconnect.errors import ConfigError
from rayconnect.source_tasks.postgres.events import TableShape
from rayconnect.source_tasks.postgres.pgoutput import Column, parse_lsn
from rayconnect.source_tasks.postgres.settings import PostgresSettings

log = logging.getLogger(__name__)


class PostgresUnreachable(ConfigError):
    """Postgres did not answer (or refused the login) at ``dsn``."""


def connect(settings: PostgresSettings, *, replication: bool = False) -> Any:
    """A connection (autocommit; TimeZone UTC so timestamptz text is UTC); the password is
    read now from where the settings say, and never logged."""
    import psycopg2
    import psycopg2.extras

    extra: dict[str, Any] = {}
    password = settings.password()
    if password is not None:
        extra["password"] = password
    if replication:
        extra["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
    try:
        conn = psycopg2.connect(
            settings.dsn,
            connect_timeout=settings.connect_timeout_s,
            options="-c TimeZone=UTC",
            application_name="rayconnect",
            **extra,
        )
    except psycopg2.OperationalError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = f" ({settings.password_hint})" if settings.password_hint else ""
        raise PostgresUnreachable(f"dsn: cannot connect to Postgres: {reason}{hint}") from None
    if not replication:
        conn.autocommit = True
    return conn


def query(conn: Any, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def check(settings: PostgresSettings, conn: Any, *, slot_wait_s: float = 0.0) -> None:
    """The pre-start checks, each a ConfigError naming what to fix."""
    (level,) = query(conn, "SHOW wal_level")[0]
    if level != "logical":
        raise ConfigError(
            f"dsn: Postgres has wal_level={level}; change data capture needs wal_level=logical "
            "(set it in postgresql.conf and restart Postgres)"
        )
    user, may = query(
        conn,
        "SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user",
    )[0]
    if not may:
        raise ConfigError(
            f"dsn: user {user!r} may not replicate: ALTER ROLE {user} REPLICATION (and give it "
            "SELECT on the tables)"
        )
    for schema, table in settings.qualified_tables:
        (oid,) = query(conn, "SELECT to_regclass(%s)", (f'"{schema}"."{table}"',))[0]
        if oid is None:
            raise ConfigError(f"tables: {schema}.{table} does not exist")
    if not settings.tables:
        found = query(
            conn, "SELECT 1 FROM pg_publication WHERE pubname = %s", (settings.publication,)
        )
        if not found:
            raise ConfigError(
                f"publication: {settings.publication!r} does not exist (create it, or name the "
                "tables to capture and the task creates it)"
            )
    for schema, table in tables_of(settings, conn):
        keyless_problem(conn, schema, table)
    check_slot(settings, conn, wait_s=slot_wait_s)


def keyless_problem(conn: Any, schema: str, table: str) -> None:
    """A table needs a primary key, or REPLICA IDENTITY FULL (then its records have no key
    and keep commit order in Kafka partition 0)."""
    rows = query(
        conn,
        "SELECT c.relreplident, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid "
        "AND i.indisprimary) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    )
    if rows and not rows[0][1] and rows[0][0] != "f":
        raise ConfigError(
            f"tables: {schema}.{table} has no primary key: add one, or "
            f"ALTER TABLE {schema}.{table} REPLICA IDENTITY FULL (its records then have no key)"
        )


def check_slot(settings: PostgresSettings, conn: Any, *, wait_s: float = 0.0) -> None:
    """The slot, if it exists, is pgoutput's, of this database, and not in use - waiting up
    to ``wait_s`` for a consumer that just died (its walsender ends a moment later)."""
    deadline = time.monotonic() + wait_s
    while True:
        rows = query(
            conn,
            "SELECT plugin, database, active, active_pid FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (settings.slot,),
        )
        if not rows:
            return
        plugin, database, active, pid = rows[0]
        (current,) = query(conn, "SELECT current_database()")[0]
        if plugin != "pgoutput" or database != current:
            raise ConfigError(
                f"slot: {settings.slot!r} exists for plugin {plugin!r} in database {database!r}; "
                f"this source needs pgoutput in {current!r}: choose another slot name"
            )
        if not active:
            return
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"slot: {settings.slot!r} is in use by another consumer (walsender pid {pid}); "
                "stop it, or choose another slot name"
            )
        time.sleep(0.2)


def tables_of(settings: PostgresSettings, conn: Any) -> list[tuple[str, str]]:
    if settings.tables:
        return settings.qualified_tables
    rows = query(
        conn,
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
        (settings.publication,),
    )
    return [(s, t) for s, t in rows]


def primary_keys(conn: Any, tables: list[tuple[str, str]]) -> dict[str, list[tuple[str, int, int]]]:
    """``schema.table`` -> its primary key's columns in key order, each (name, type oid,
    type modifier); a table without a primary key is not in it."""
    rows = query(
        conn,
        "SELECT n.nspname, c.relname, a.attname, a.atttypid, a.atttypmod "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indisprimary AND (n.nspname || '.' || c.relname) = ANY(%s) "
        "ORDER BY n.nspname, c.relname, array_position(i.indkey::int2[], a.attnum)",
        ([f"{schema}.{table}" for schema, table in tables],),
    )
    keys: dict[str, list[tuple[str, int, int]]] = {}
    for schema, table, column, oid, modifier in rows:
        keys.setdefault(f"{schema}.{table}", []).append((column, int(oid), int(modifier)))
    return keys


def ensure_publication(settings: PostgresSettings, conn: Any) -> None:
    """With ``tables``: the publication exists and holds each of them; with ``schemas``,
    every table of those schemas, later ones too (``schema_publication``)."""
    if not settings.tables:
        return
    pub = settings.publication_name
    names = ", ".join(f'"{s}"."{t}"' for s, t in settings.qualified_tables)
    if not query(conn, "SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,)):
        if settings.schemas and schema_publication(conn, pub, settings.schemas, create=True):
            ensure_publication(settings, conn)  # and the tables named outside the schemas
            return
        query(conn, f'CREATE PUBLICATION "{pub}" FOR TABLE {names}')
        return
    if settings.schemas:
        schema_publication(conn, pub, settings.schemas, create=False)
    have = set(tables_of_publication(conn, pub))
    missing = [f'"{s}"."{t}"' for s, t in settings.qualified_tables if (s, t) not in have]
    if missing:
        query(conn, f'ALTER PUBLICATION "{pub}" ADD TABLE {", ".join(missing)}')


def schema_publication(conn: Any, pub: str, schemas: list[str], *, create: bool) -> bool:
    """Publication ``pub`` holds ``schemas`` whole - tables created there later too, their
    changes published from their creation (``FOR TABLES IN SCHEMA``, Postgres 15). Only a
    superuser may: for another user False, logged (the publication then holds the tables
    named, and a table created later flows once added: ``ALTER PUBLICATION``)."""
    import psycopg2

    listed = ", ".join(f'"{s}"' for s in schemas)
    if not create:
        have = {s for (s,) in query(
            conn,
            "SELECT n.nspname FROM pg_publication_namespace pn "
            "JOIN pg_publication p ON p.oid = pn.pnpubid "
            "JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = %s",
            (pub,),
        )}  # fmt: skip
        missing = [s for s in schemas if s not in have]
        if not missing:
            return True
        listed = ", ".join(f'"{s}"' for s in missing)
    sql = (
        f'CREATE PUBLICATION "{pub}" FOR TABLES IN SCHEMA {listed}'
        if create
        else f'ALTER PUBLICATION "{pub}" ADD TABLES IN SCHEMA {listed}'
    )
    try:
        query(conn, sql)
    except psycopg2.errors.InsufficientPrivilege as e:
        log.warning(
            "publication %s: not FOR TABLES IN SCHEMA %s (%s): tables created there later "
            "are captured once added to it (ALTER PUBLICATION %s ADD TABLE ...)",
            pub, listed, str(e).strip().splitlines()[0], pub,
        )  # fmt: skip
        return False
    return True


def tables_of_publication(conn: Any, pub: str) -> list[tuple[str, str]]:
    rows = query(
        conn, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (pub,)
    )
    return [(s, t) for s, t in rows]


def slot_exists(settings: PostgresSettings, conn: Any) -> bool:
    return bool(
        query(conn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (settings.slot,))
    )


def ensure_slot(settings: PostgresSettings, conn: Any) -> bool:
    """Create the slot if missing (True if created). On a normal connection, by SQL."""
    if slot_exists(settings, conn):
        return False
    query(conn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (settings.slot,))
    return True


def drop_slot(settings: PostgresSettings, conn: Any, *, wait_s: float = 30.0) -> bool:
    """Drop the slot (waiting up to ``wait_s`` for its consumer to go); False if none."""
    check_slot(settings, conn, wait_s=wait_s)
    if not slot_exists(settings, conn):
        return False
    query(conn, "SELECT pg_drop_replication_slot(%s)", (settings.slot,))
    return True


def drop_publication(settings: PostgresSettings, conn: Any) -> bool:
    """Drop the publication (False if there was none)."""
    pub = settings.publication_name
    if not query(conn, "SELECT 1 FROM pg_publication WHERE pubname = %s", (pub,)):
        return False
    query(conn, f'DROP PUBLICATION "{pub}"')
    return True


def export_snapshot(settings: PostgresSettings) -> tuple[Any, int, str]:
    """A temporary slot's exported snapshot: (its replication connection - keep it open
    until the snapshot is imported -, its consistent point, the snapshot's name)."""
    conn = connect(settings, replication=True)
    with conn.cursor() as cur:
        cur.execute(
            f'CREATE_REPLICATION_SLOT "{settings.slot}_snap_{os.getpid()}" TEMPORARY LOGICAL pgoutput '
            "EXPORT_SNAPSHOT"
        )
        _, consistent_point, snapshot_name, _ = cur.fetchone()
    return conn, parse_lsn(consistent_point), snapshot_name


def table_shape(
    conn: Any, schema: str, table: str
) -> tuple[TableShape, dict[str, tuple[str, bool]]]:
    """The table's shape and, per column, its SQL type and whether it sorts by collation."""
    rows = query(
        conn,
        "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), "
        "t.typcollation <> 0, "
        "  (SELECT array_position(i.indkey::int2[], a.attnum) FROM pg_index i "
        "   WHERE i.indrelid = a.attrelid AND i.indisprimary) "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (f'"{schema}"."{table}"',),
    )
    columns = tuple(Column(name, oid, mod, pk is not None) for name, oid, mod, _, _, pk in rows)
    keyed = sorted((r for r in rows if r[5] is not None), key=lambda r: r[5])
    primary_key = tuple(r[0] for r in keyed)
    sql_types = {name: (sqltype, collatable) for name, _, _, sqltype, collatable, _ in rows}
    return TableShape(schema, table, columns, primary_key), sql_types


def table_pages(conn: Any, schema: str, table: str) -> tuple[int, float]:
    """The table's heap pages now, and its rows per page as last estimated (0: none)."""
    ((pages, estimate, analysed),) = query(
        conn,
        "SELECT pg_relation_size(oid) / current_setting('block_size')::int, reltuples, relpages "
        "FROM pg_class WHERE oid = %s::regclass",
        (f'"{schema}"."{table}"',),
    )
    per_page = float(estimate) / analysed if estimate and estimate > 0 and analysed else 0.0
    return int(pages), per_page


def wal_position(conn: Any) -> int:
    (lsn,) = query(conn, "SELECT pg_current_wal_lsn()::text")[0]
    return parse_lsn(lsn)


def slot_lag(settings: PostgresSettings, conn: Any) -> int | None:
    """Bytes of WAL between the slot's confirmed flush LSN - what is in Kafka - and the
    server's current position (None: no such slot): Postgres's own count, true whether or
    not a task is reading."""
    rows = query(
        conn,
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (settings.slot,),
    )
    if not rows or rows[0][0] is None:
        return None
    return max(0, int(rows[0][0]))


def emit_message(conn: Any, prefix: str, content: bytes) -> int:
    """A transactional logical decoding message (its own transaction on an autocommit
    connection): the stream meets it at its place in commit order. Its LSN."""
    (lsn,) = query(conn, "SELECT pg_logical_emit_message(true, %s, %s)::text", (prefix, content))[0]
    return parse_lsn(lsn)
