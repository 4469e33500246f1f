"""PostgresSource's parameters: its constructor's and a pipeline file's ``task:`` block's.

The password is never a parameter: ``password_env`` names an environment variable and
``password_file`` a file that hold it, read where the connection is made (the task actor's
process), so it is in no settings, status, log or pickled task. A DSN that carries a
``password=`` is refused for the same reason.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import msgspec

from rayconnect.errors import ConfigError, require
from rayconnect.redact import redacted_repr
from rayconnect.settings_types import NonNegativeFloat, PositiveFloat, PositiveInt
from rayconnect.source_tasks.base import check_topic

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PASSWORD_IN_DSN = re.compile(r"(^|\s)password\s*=|://[^/@:]*:[^/@]*@", re.IGNORECASE)


class PostgresSettings(msgspec.Struct, frozen=True):
    """``dsn``: libpq connection string or URI, without password. ``tables``: the
        ``schema.table`` names to capture (a table without a schema is ``public``); the task
        creates publication ``publication`` for them if it does not exist. Without ``tables``,
        ``publication`` must exist and its tables are captured. ``slot``: the logical
        replication slot (created if missing, else reused from where it confirmed).
        ``topic_template``: ``{prefix}``, ``{schema}``, ``{table}``. ``max_records_per_transaction``
        bounds a Kafka transaction: a Postgres transaction with more changes is split (see
        docs/guides/postgres-source.md). ``batch_size`` / ``batch_bytes``: a poll - one Kafka
    transaction - ends at the first Postgres commit after this many records / bytes of events,
    or when the stream has nothing more. ``unavailable_value``: what ``after`` holds for a
        TOASTed value an update did not change and Postgres did not send (REPLICA IDENTITY FULL
        sends it). ``truncate``: what a ``TRUNCATE`` of a captured table becomes - ``event``, a
        Debezium truncate event (``op: t``, no key, no row) per table in each partition of the
        table's topic (header ``rayconnect.truncate: partition``), in its place in the
        transaction; ``skip``, nothing (counted as ``truncates_skipped`` and logged):
        Debezium's default, for readers that cannot take ``op: t``. ``own_publication``: the
        publication is this pipeline's alone (a mirror's): ``release`` (``stop --drop-slot``)
        drops it with the slot; otherwise it is kept. ``column_types``: ``header`` (default)
        puts each row record's column types in its ``rayconnect.value_schema`` header (the
        sink types its tables by it: docs/guides/database-mirror.md#types); ``none``: no
        header. ``topic_partitions`` / ``topic_replication_factor``: each captured table's
        topic is made by the task, at every start, with these if it does not exist (an
        existing topic is kept as it is; a broker that refuses stops the start naming the
        topics - docs/guides/postgres-source.md#topics). ``snapshot_parallelism``: how many
        snapshot workers (Ray actors, spread over the cluster) read the initial snapshot at
        once; unset, as many as the cluster has CPUs. ``snapshot_chunk_rows``: about how many
        rows a chunk holds - the tables are cut into chunks (key ranges; heap page ranges of
        a table without a key) that the workers share, each chunk's progress committed with
        its rows, so a killed worker or task redoes only unfinished chunks from where they
        were; each worker reads a chunk ``batch_size`` rows at a time
        (docs/guides/postgres-source.md#parallel-snapshot). ``discovery_interval_s``: how
        often the streaming task looks for tables added to the publication; each one found
        is captured and snapshotted while the stream flows (watermarked chunks of
        ``batch_size`` rows: docs/guides/postgres-source.md#snapshots-while-streaming).
        ``cut_markers``: end each Kafka transaction that ends at a Postgres commit with a
        cut marker in every partition of every captured table's topic, for sinks with
        ``commit.consistent_cuts`` (docs/guides/database-mirror.md#consistent-cuts); other
        consumers of the topics see them as tombstones without a key.
        ``schemas``: capture every table of these schemas, those created later too - the
        task's publication is made ``FOR TABLES IN SCHEMA`` (Postgres 15; a superuser's
        right: without it, the tables there at start), so a new table's changes flow from
        its creation and its rows are snapshotted while streaming once it is found.
        ``route_keys_for``: the routed sink pipeline that keys each table by its primary key
        as this task publishes it (``rayconnect.route_keys``: a mirror's sink); a table
        found while streaming is published before its first record, and one without a
        primary key is refused (no records; the status names it) - that sink could not keep
        its rows by key."""

    dsn: str
    slot: str
    tables: list[str] = []
    publication: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    topic_prefix: str = "pg"
    topic_template: str = "{prefix}.{schema}.{table}"
    tombstones: bool = False
    snapshot: bool = True
    batch_size: PositiveInt = 5000
    batch_bytes: PositiveInt = 16 << 20
    max_records_per_transaction: PositiveInt = 100_000
    idle_s: NonNegativeFloat = 0.2
    unavailable_value: str = "__debezium_unavailable_value"
    connect_timeout_s: PositiveInt = 10
    truncate: Literal["event", "skip"] = "event"
    offsets_out_of_range: Literal["fail", "snapshot", "latest"] = "fail"
    own_publication: bool = False
    column_types: Literal["header", "none"] = "header"
    topic_partitions: PositiveInt = 2
    topic_replication_factor: PositiveInt = 1
    snapshot_parallelism: PositiveInt | None = None
    snapshot_chunk_rows: PositiveInt = 100_000
    discovery_interval_s: PositiveFloat = 10.0
    cut_markers: bool = False
    schemas: list[str] = []
    route_keys_for: str | None = None

    __repr__ = redacted_repr

    def __post_init__(self) -> None:
        require(bool(self.dsn), "dsn: must not be empty")
        require(
            not _PASSWORD_IN_DSN.search(self.dsn),
            "dsn: must not hold the password; give it by password_env (an environment "
            "variable's name) or password_file",
        )
        require(
            bool(_NAME.match(self.slot)),
            f"slot: {self.slot!r} is no replication slot name (lower-case letters, digits, _)",
        )
        require(
            self.publication is None or bool(_NAME.match(self.publication)),
            f"publication: {self.publication!r} is no publication name (lower-case letters, digits, _)",
        )
        require(
            bool(self.tables) or self.publication is not None,
            "tables: name the tables to capture, or an existing publication",
        )
        require(
            not (self.password_env and self.password_file),
            "password_env, password_file: give one, not both",
        )
        for schema in self.schemas:
            require(bool(_NAME.match(schema)), f"schemas: {schema!r} is no schema name")
        for table in self.tables:
            require(
                table.count(".") <= 1 and all(table.split(".")),
                f"tables: {table!r} is not 'schema.table' or 'table'",
            )
        try:
            sample = self.topic_template.format(prefix=self.topic_prefix, schema="s", table="t")
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(
                f"topic_template: {self.topic_template!r}: {e} (fields: prefix, schema, table)"
            ) from None
        check_topic("topic_template", sample)

    @property
    def publication_name(self) -> str:
        return self.publication or f"{self.slot}_pub"

    @property
    def qualified_tables(self) -> list[tuple[str, str]]:
        split = (name.partition(".") for name in self.tables)
        return [(schema, table) if table else ("public", schema) for schema, _, table in split]

    def topic(self, schema: str, table: str) -> str:
        return self.topic_template.format(prefix=self.topic_prefix, schema=schema, table=table)

    @property
    def password_hint(self) -> str | None:
        """Why a failed login may have had no password: ``password_env`` not set here."""
        if self.password_env and os.environ.get(self.password_env) is None:
            return (
                f"password_env: environment variable {self.password_env} is not set in this "
                "process, so no password was sent"
            )
        return None

    def password(self) -> str | None:
        """The password, read now from ``password_env`` / ``password_file`` (None: libpq's
        own ways, e.g. ``PGPASSWORD`` or ``~/.pgpass``). A ``password_env`` that is not set
        means no password - a server that asks none (trust, peer) works with the same file
        - and a login that then fails says the variable was not set (``password_hint``)."""
        if self.password_env:
            return os.environ.get(self.password_env)
        if self.password_file:
            try:
                return Path(self.password_file).read_text().rstrip("\n")
            except OSError as e:
                raise ConfigError(
                    f"password_file: cannot read {self.password_file}: {e.strerror}"
                ) from None
        return None
