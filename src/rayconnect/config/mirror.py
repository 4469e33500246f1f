"""A database mirror's settings (``kind: mirror``, ``rc.Mirror``, ``rayconnect mirror``), and
the two pipelines they stand for.

A mirror is not a third kind of pipeline: it is a Postgres source pipeline (every change of
the captured tables into one topic per table, exactly once) and ONE routed upsert sink
pipeline (each ``<prefix>.<schema>.<table>`` topic into its own upsert table, made at its
first record), written as one short config. Why derive rather than run anything new: the two
pipelines already hold every guarantee (KIP-618 offsets with the LSN, one table version per
round per table); the mirror only has to name them consistently - slot, publication, topics,
route - so the user cannot get the pairing wrong. Everything here is pure (no IO): the tables
of an empty ``tables`` are listed at start (``pipelines.mirror``), then passed to
``source_config``.

Names derived from ``name`` (each may be given instead):

- the sink pipeline is ``name``, the source pipeline ``<name>-source``;
- the replication slot ``name`` in lower case with ``-``/``.`` as ``_``; the publication
  ``<slot>_pub``, made by the source for the captured tables and, being the mirror's own,
  dropped with the slot by ``stop --drop-slot`` (a publication named here is the user's: kept);
- topics ``<topic_prefix>.<schema>.<table>`` with ``topic_prefix`` = ``name``.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any, Literal

import msgspec

from rayconnect.config.rest_catalog import RestCatalog
from rayconnect.config.routes import Route, Routes
from rayconnect.config.sink import (
    DeltaSink,
    IcebergSink,
    KafkaSource,
    SinkPipelineConfig,
    SparkSettings,
    TableSink,
)
from rayconnect.config.source import KafkaTarget, PostgresTask, SourcePipelineConfig
from rayconnect.errors import ConfigError, require
from rayconnect.formats.settings import UpsertMode
from rayconnect.metadata.single_cluster import SingleClusterMetadataService
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import check_name
from rayconnect.redact import redacted_repr
from rayconnect.settings_types import PositiveFloat, PositiveInt

__all__ = ["CHANGE_FORMAT", "MirrorConfig", "source_name", "topic_pattern"]

#: how the mirror's sink decodes the source's records (``KafkaSource`` settings): Debezium
#: events with inferred JSON rows (columns grow with ALTER TABLE), keyed by the JSON key
CHANGE_FORMAT: dict[str, Any] = {
    "value_format": "json",
    "key_format": "json",
    "include_key": True,
    "envelope": "debezium",
    "errors": "dead_letter",
}

_SCHEMES = ("postgresql", "postgres")


def source_name(mirror: str) -> str:
    """The source pipeline of mirror ``mirror`` (its sink pipeline is ``mirror`` itself)."""
    return f"{mirror}-source"


def topic_pattern(prefix: str, schema: str = "public") -> str:
    """The topics of ``schema``'s tables, the table's name as group 1."""
    return rf"{re.escape(prefix)}\.{re.escape(schema)}\.(.*)"


def _identifier(name: str) -> str:
    """``name`` as a Postgres / Iceberg identifier: lower case, ``-`` and ``.`` as ``_``."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


class MirrorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A ``kind: mirror`` file, ``rc.Mirror``'s keyword arguments: a PostgreSQL database's
    tables kept equal to tables in the lake, exactly once (docs/guides/database-mirror.md)."""

    #: the mirror's name: its sink pipeline's; the source pipeline is ``<name>-source``
    name: str
    #: ``postgresql://USER@HOST:PORT/DATABASE`` (libpq URI, query parameters too) - without a
    #: password: give it by ``password_env`` (or PGPASSWORD / ~/.pgpass, libpq's own ways)
    database: str
    #: where the tables go: a folder or ``s3://bucket/prefix`` of Delta tables
    #: (``<to>/<table>``), or with ``format: iceberg`` the embedded catalog's warehouse folder
    #: (or a ``catalog``/``rest_catalog``'s warehouse)
    to: str
    #: ``delta`` (one Delta table per Postgres table) or ``iceberg``
    format: Literal["delta", "iceberg"] = "delta"
    #: the tables to capture (``table`` is ``public.table``); empty: every table of schema
    #: public when the mirror starts (or, with ``publication``, that publication's tables)
    tables: list[str] = []
    #: an existing publication to capture (yours: kept by ``stop --drop-slot``); None: the
    #: mirror's own ``<slot>_pub`` for ``tables``
    publication: str | None = None
    #: the logical replication slot; None: the name in lower case, ``-`` and ``.`` as ``_``
    slot: str | None = None
    #: the environment variable holding the database password, read in the source task's
    #: process (never logged); None: libpq's own ways (PGPASSWORD, ~/.pgpass)
    password_env: str | None = None
    #: a file holding the password, instead of ``password_env``
    password_file: str | None = None
    #: Kafka bootstrap servers between the two pipelines; None: an embedded broker (tansu)
    #: that lives as long as the command (or ``rc.Mirror`` handle) running the mirror
    kafka: str | None = None
    #: Kafka client properties (``security.protocol``, SASL...) for both pipelines
    kafka_properties: dict[str, str] = {}
    #: topics are ``<topic_prefix>.<schema>.<table>``; None: the mirror's name
    topic_prefix: str | None = None
    #: partitions of each table's topic, made by the source at its start if missing (the
    #: source's ``topic_partitions``)
    partitions: PositiveInt = 2
    #: the primary key every mirrored table shares, as the record key's fields and types (the
    #: upsert key); None: each table's own primary key, read from the database at start
    #: (``table_keys``)
    key_schema: dict[str, str] | None = None
    #: each captured table's key (``schema.table`` -> the record key's fields and types):
    #: filled at start from the tables' primary keys (``pipelines.mirror``); a table missing
    #: here (one that appears later) is keyed by ``key_schema``, else by its own primary key
    #: as the source publishes it (``rayconnect.route_keys``)
    table_keys: dict[str, dict[str, str]] = {}
    #: how a round updates a table (None: the format's default: Delta ``copy_on_write``,
    #: Iceberg ``merge_on_read``)
    upsert_mode: UpsertMode | None = None
    #: for ``to`` on S3: endpoint and credentials (as ``DeltaSink.storage_options``)
    storage_options: dict[str, str] = {}
    #: iceberg: pyiceberg catalog properties instead of the embedded catalog
    catalog: dict[str, str] = {}
    #: iceberg: an Iceberg REST catalog instead of the embedded one
    rest_catalog: RestCatalog | None = None
    #: seconds a new table may take to flow: how often the source looks for tables added
    #: to the publication, and the sink for their topics
    discovery_interval_s: PositiveFloat = 5.0
    #: the sink's rounds (``rc.CommitSettings``); ``consistent_cuts: true`` makes the source
    #: write the cut markers it needs (docs/guides/database-mirror.md#consistent-cuts)
    commit: CommitSettings = CommitSettings(commit_interval_s=5.0)
    #: the sink's Spark (``rc.SparkSettings``)
    spark: SparkSettings = SparkSettings()

    __repr__ = redacted_repr  # storage options, catalog and Kafka properties hold credentials

    def __post_init__(self) -> None:
        try:
            check_name("mirror name", self.name)
        except ValueError as e:
            raise ConfigError(f"name: {e}") from None
        check_database_url(self.database)
        require(
            self.kafka is None or bool(self.kafka.strip()),
            "kafka: empty; give bootstrap servers (host:port,...) or leave it out for an "
            "embedded broker",
        )
        require(bool(self.to), "to: say where the tables go (a folder, s3://..., a warehouse)")
        require(
            self.key_schema is None or bool(self.key_schema),
            "key_schema: name the key column(s) of the tables, or leave it out (each table's "
            "primary key)",
        )
        require(
            self.format == "iceberg" or not (self.catalog or self.rest_catalog),
            "catalog, rest_catalog: for format: iceberg only",
        )
        # the derived pipelines check every other setting, each naming its field
        self.source_config(self.tables or ["public.checked"])
        self.sink_config()

    # -- derived names ----------------------------------------------------------------------

    @property
    def source_name(self) -> str:
        return source_name(self.name)

    @property
    def slot_name(self) -> str:
        return self.slot or _identifier(self.name)

    @property
    def publication_name(self) -> str:
        return self.publication or f"{self.slot_name}_pub"

    @property
    def owns_publication(self) -> bool:
        """The publication is the mirror's (made by it, dropped with its slot)."""
        return self.publication is None

    @property
    def whole_schema(self) -> bool:
        """Every table of schema public is mirrored, those created later too (no ``tables``
        or ``publication`` named): the publication is ``FOR TABLES IN SCHEMA public``."""
        return not self.tables and self.publication is None

    @property
    def prefix(self) -> str:
        return self.topic_prefix or self.name

    @property
    def database_name(self) -> str:
        return urllib.parse.urlsplit(self.database).path.lstrip("/")

    # -- the two pipelines --------------------------------------------------------------------

    def source_config(self, tables: list[str]) -> SourcePipelineConfig:
        """The source pipeline capturing ``tables`` (this config's, or the ones listed at
        start): one task, connector boundaries (a Postgres transaction is a Kafka one)."""
        task = _with_setting(
            "",
            lambda: PostgresTask(
                dsn=self.database,
                slot=self.slot_name,
                tables=list(tables),
                publication=self.publication,
                password_env=self.password_env,
                password_file=self.password_file,
                topic_prefix=self.prefix,
                own_publication=self.owns_publication,
                topic_partitions=self.partitions,
                discovery_interval_s=self.discovery_interval_s,
                schemas=["public"] if self.whole_schema else [],
                route_keys_for=self.name if self.key_schema is None else None,
                cut_markers=self.commit.consistent_cuts,
            ),
        )
        return SourcePipelineConfig(
            name=self.source_name,
            task=task,
            target=KafkaTarget(self.bootstrap_servers, self.kafka_properties),
            transaction_boundary="connector",
            exactly_once="required",
        )

    def sink_config(self) -> SinkPipelineConfig:
        """ONE sink pipeline: every topic of the mirror into its own upsert table."""
        source = _with_setting(
            "kafka",
            lambda: KafkaSource(
                SingleClusterMetadataService(
                    self.bootstrap_servers,
                    properties=self.kafka_properties,
                    topic_pattern=rf"{re.escape(self.prefix)}\..*",
                ),
                key_schema=self.fallback_key,
                discovery_interval_s=self.discovery_interval_s,
                properties=self.kafka_properties,
                **CHANGE_FORMAT,
            ),
        )
        return SinkPipelineConfig(
            name=self.name,
            source=source,
            sink=_with_setting("to", self._table_sink),
            commit=self.commit,
            spark=self.spark,
        )

    @property
    def bootstrap_servers(self) -> str:
        """The Kafka between the pipelines; before an embedded broker started, a placeholder
        (``with_kafka`` puts the broker's address in)."""
        return self.kafka or "127.0.0.1:9092"

    def with_kafka(self, bootstrap_servers: str) -> MirrorConfig:
        return msgspec.structs.replace(self, kafka=bootstrap_servers)

    @property
    def iceberg_namespace(self) -> str:
        """The Iceberg namespace of the mirror's tables (``format: iceberg``)."""
        return _identifier(self.prefix)

    @property
    def fallback_key(self) -> dict[str, str]:
        """The key of a table ``table_keys`` does not name."""
        return self.key_schema or {"id": "long"}

    def _rules(self) -> tuple[Route, ...]:
        """public's tables keep their name; another schema's are ``<schema>_<table>``. A
        table of ``table_keys`` has a rule of its own, keyed by its primary key."""
        own = tuple(
            Route(
                table=lake_table(name),
                topic=f"{self.prefix}.{name}",
                key_schema=dict(key),
                key_columns=tuple(key),
            )
            for name, key in sorted(self.table_keys.items())
        )
        return own + (
            Route(table="{1}", topic_pattern=topic_pattern(self.prefix)),
            Route(table="{1}_{2}", topic_pattern=rf"{re.escape(self.prefix)}\.(\w+)\.(\w+)"),
        )

    def _table_sink(self) -> TableSink:
        upsert: dict[str, Any] = {
            "write_mode": "upsert",
            "key_columns": tuple(self.fallback_key),
            # a table found later is keyed by the key its source publishes (``route_keys``)
            "routes": Routes(rules=self._rules(), published_keys=self.key_schema is None),
            "storage_options": self.storage_options,
        }
        if self.upsert_mode is not None:
            upsert["upsert_mode"] = self.upsert_mode
        if self.format == "iceberg":
            return IcebergSink(
                f"{self.iceberg_namespace}.unrouted",
                warehouse=self.to,
                catalog=self.catalog,
                rest_catalog=self.rest_catalog,
                **upsert,
            )
        return DeltaSink(self.to, **upsert)


def lake_table(name: str) -> str:
    """The lake table of Postgres table ``schema.table``: ``table`` for schema public, else
    ``<schema>_<table>`` (as the mirror's pattern rules name them)."""
    schema, _, table = name.rpartition(".")
    return table if schema in ("", "public") else f"{schema}_{table}"


def check_database_url(url: str) -> None:
    """``url`` is a ``postgresql://`` URL naming a database, without a password. The URL is
    never quoted in the error: it may hold the password."""
    try:
        parts = urllib.parse.urlsplit(url)
        has_password = parts.password is not None
    except ValueError as e:
        raise ConfigError(f"database: not a URL ({e})") from None
    require(
        parts.scheme in _SCHEMES,
        "database: expected postgresql://USER@HOST:PORT/DATABASE, got "
        + (f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"),
    )
    require(
        not has_password,
        "database: the URL holds a password; leave it out and give it by an environment "
        "variable (password_env, or PGPASSWORD)",
    )
    require(
        bool(parts.path.lstrip("/")),
        "database: the URL names no database (postgresql://USER@HOST:PORT/DATABASE)",
    )


def _with_setting(setting: str, build: Any) -> Any:
    """``build()``, its error a ConfigError prefixed with the mirror's setting it comes from
    (``""``: the error names a field the mirror has too; ``dsn`` is the mirror's
    ``database``)."""
    try:
        return build()
    except Exception as e:  # ConfigError, or a metadata service's own error type
        message = str(e)
        if message.startswith("dsn:"):
            message = "database:" + message.removeprefix("dsn:")
        raise ConfigError(f"{setting}: {message}" if setting else message) from None
