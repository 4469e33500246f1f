"""The configuration of a pipeline: typed msgspec Structs, validated when they are built.

The same Structs are the Python API (``rc.KafkaSource(...)``) and the schema of pipeline
files, so a YAML file and Python code can never drift apart. Every check lives in
``__post_init__``, which msgspec also runs when decoding a file: a configuration error is
raised, naming the bad field, before any actor starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from rayconnect.config.placement import Placement
from rayconnect.config.rest_catalog import RestCatalog
from rayconnect.config.routes import Route, RouteFormats, Routes
from rayconnect.config.spark import SparkSettings
from rayconnect.errors import ConfigError, require
from rayconnect.formats.settings import (
    UNAVAILABLE_VALUE,
    Envelope,
    ErrorPolicy,
    KeyFormat,
    RecordFormat,
    TruncateMode,
    UpsertMode,
    ValueFormat,
    WriteMode,
)
from rayconnect.metadata.file_service import FileMetadataService
from rayconnect.metadata.single_cluster import SingleClusterMetadataService
from rayconnect.metadata.static import StaticMetadataService
from rayconnect.properties import check_client_properties
from rayconnect.protocol.offset_range import OutOfRangePolicy
from rayconnect.protocol.outages import DEFAULT_GIVE_UP_AFTER_S
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.streams import (
    MetadataError,
    clusters_of,
    select_streams,
    with_default_properties,
)
from rayconnect.protocol.types import ClusterMetadata, KafkaStream, check_name
from rayconnect.protocol.upkeep import CompactSettings, FoldDeletes, LogSettings
from rayconnect.redact import redacted_repr
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.storage import put_if_absent
from rayconnect.storage.location import StorageError, TableLocation

#: partitions of one topic per participant host, unless the pipeline says otherwise. Measured
#: on 2 cores (bench h, 1,024 partitions of one topic, defaults): 64 a host (16 hosts) 74k
#: rec/s, start-up 39 s, 4.4 GB; 256 (4 hosts) 102k rec/s, 26 s, 3.4 GB. Fewer processes win
#: where cores are few; a host's CPU is one Python thread, so lower it on a big cluster.
DEFAULT_PARTITIONS_PER_HOST = 256
#: more topics than this at start: they share participant hosts (``topic_groups``)
AUTO_GROUP_TOPICS = 16

#: a REST catalog's table is at ``<warehouse>/<namespace>/<name>/data`` (``IcebergSink.location``)
REST_TABLE_FOLDER = "data"

StartingOffsets = Literal["earliest", "latest"]


class KafkaSource(msgspec.Struct, frozen=True):
    """Where a sink pipeline reads: streams of a metadata service, and where new partitions
    start (``earliest``, ``latest`` or an explicit ``{"cluster/topic/partition": offset}``).
    Offsets committed in the table always win over ``starting_offsets``.

    How keys and values are encoded is a property of the stream: ``value_format`` (``raw``,
    the default: today's raw table; ``string``; ``json`` with a declared ``value_schema`` or
    inferred) and the rest of ``formats.settings.RecordFormat``'s settings."""

    #: where the streams are defined: ``StaticMetadataService``, ``FileMetadataService`` (a file you
    #: may edit while the pipeline runs) or ``SingleClusterMetadataService``
    metadata: StaticMetadataService | FileMetadataService | SingleClusterMetadataService
    #: subscribe to these streams; None (and no ``stream_pattern``): every stream
    stream_ids: tuple[str, ...] | None = None
    #: subscribe to the streams whose id matches this regular expression
    stream_pattern: str | None = None
    #: where a partition with no committed offset starts: ``earliest``, ``latest`` or
    #: ``{"cluster/topic/partition": offset}``; offsets in the table always win
    starting_offsets: StartingOffsets | dict[str, int] = "earliest"
    #: a partition whose offset in the table lies outside its log (past its end: the topic
    #: was re-created or the broker lost its log; before its start: retention removed
    #: records never committed): ``fail`` gives the pipeline up with an error naming it;
    #: ``earliest`` / ``latest`` start it over at the log's start / end, the reset recorded
    #: in the table version that lands it (one table; not with routes)
    offsets_out_of_range: OutOfRangePolicy = "fail"
    #: reader actors per cluster; partitions are spread over them
    readers_per_cluster: int = 1
    #: most records a reader hands a participant in one call (one Arrow batch); a larger fetch is
    #: handed in pieces of this size, in order
    max_poll_records: int = 50_000
    #: Kafka client properties (``security.protocol``, ``sasl.*``, ``ssl.*``...) for every cluster; a
    #: cluster's own ``properties`` in the metadata win. Masked in status, logs and reprs
    properties: dict[str, str] = {}
    #: how often the enumerator asks the metadata service for streams, clusters and partitions
    discovery_interval_s: float = 30.0
    #: failed discovery polls in a row that fail the pipeline (a bad edit keeps the last good metadata
    #: until then)
    discovery_failure_threshold: int = 5
    #: how values are decoded: ``raw`` (bytes, the raw record table), ``string``, ``json``, ``avro``
    #: (binary datums of ``value_avro_schema``); anything but raw gives a typed table
    value_format: ValueFormat = "raw"
    #: the type of ``_kafka_key``: ``raw``, ``string``, or ``json`` (with ``key_schema``)
    key_format: KeyFormat = "raw"
    #: json only: column -> type (``long``, ``string``, ``timestamp``, ``array<T>``, a mapping = a
    #: struct...); declared: other fields are ignored; None: inferred, and the table grows
    value_schema: dict[str, Any] | None = None
    #: json with ``value_schema``: other fields are inferred too and the table grows with
    #: them (the declared columns keep their types; declare what ``partition_by`` names)
    infer_other_fields: bool = False
    #: avro only: path to the writer schema (an ``.avsc`` record), read and checked at start; needs
    #: ``rayconnect[avro]``
    value_avro_schema: str | None = None
    #: key_format json: the key's fields (column -> type, as value_schema)
    key_schema: dict[str, Any] | None = None
    #: add the ``_kafka_key`` column
    include_key: bool = False
    #: add the ``_kafka_headers`` column
    include_headers: bool = False
    #: what a bad record (not decodable, a type conflict, too long) does: ``stop`` its partition, or
    #: go to the ``dead_letter`` table
    errors: ErrorPolicy = "stop"
    #: a longer value is a bad record; 0: no limit
    max_value_bytes: int = 0
    #: ``debezium``: each value is a Debezium change event (op c/r/u/d, before/after), and
    #: the row is ``after`` (``before`` for a delete); needs ``sink.write_mode: upsert``
    envelope: Envelope = "none"
    #: ``envelope: debezium`` into an upsert table: a text or binary value equal to this is
    #: one the change does not carry (Postgres's unchanged TOAST: Debezium's
    #: ``unavailable.value.placeholder``); the table keeps the value it has
    #: (docs/guides/upserts.md#unchanged-toast-values). None: no value is a placeholder
    unavailable_value: str | None = UNAVAILABLE_VALUE

    __repr__ = redacted_repr

    def __post_init__(self) -> None:
        self.record_format()  # checks the format settings
        require(self.readers_per_cluster >= 1, "source.readers_per_cluster must be >= 1")
        require(self.max_poll_records >= 1, "source.max_poll_records must be >= 1")
        for problem in check_client_properties(self.properties):
            raise ConfigError(f"source.properties: {problem}")
        require(self.discovery_interval_s > 0, "source.discovery_interval_s must be > 0")
        require(
            self.discovery_failure_threshold >= 1, "source.discovery_failure_threshold must be >= 1"
        )
        if self.stream_pattern is not None:
            try:
                re.compile(self.stream_pattern)
            except re.error as e:
                raise ConfigError(f"source.stream_pattern {self.stream_pattern!r}: {e}") from None
        if self.stream_ids is not None and isinstance(self.metadata, StaticMetadataService):
            # Dynamic services may gain a stream later; a static one never will.
            known = {s.stream_id for s in self.metadata.streams}
            missing = [s for s in self.stream_ids if s not in known]
            require(
                not missing, f"source.stream_ids: unknown streams {missing}, known {sorted(known)}"
            )
        if isinstance(self.starting_offsets, dict):
            for key, offset in self.starting_offsets.items():
                require(
                    key.count("/") == 2,
                    f"source.starting_offsets: key {key!r} is not 'cluster/topic/partition'",
                )
                require(offset >= 0, f"source.starting_offsets[{key!r}] must be >= 0")

    def record_format(self) -> RecordFormat:
        """How this source's records are decoded (checked: ConfigError naming the setting)."""
        return RecordFormat(
            value_format=self.value_format,
            key_format=self.key_format,
            value_schema=self.value_schema,
            infer_other_fields=self.infer_other_fields,
            avro_schema=_read_avsc(self.value_avro_schema),
            key_schema=self.key_schema,
            include_key=self.include_key,
            include_headers=self.include_headers,
            errors=self.errors,
            max_value_bytes=self.max_value_bytes,
            envelope=self.envelope,
            unavailable_value=self.unavailable_value,
        )

    def streams(self) -> tuple[KafkaStream, ...]:
        """The subscribed streams, as the metadata service has them now, with the
        source-wide ``properties`` under each cluster's own."""
        return with_default_properties(
            select_streams(self.metadata.get_all_streams(), self.stream_ids, self.stream_pattern),
            self.properties,
        )

    def clusters(self) -> dict[str, ClusterMetadata]:
        """Cluster id -> its metadata, with the topics of all subscribed streams merged."""
        try:
            return clusters_of(self.streams())
        except MetadataError as e:
            raise ConfigError(f"source.metadata: {e}") from None


class DeltaSink(msgspec.Struct, frozen=True, tag="delta"):
    """A Delta table on a local path or object storage (``s3://``, ``gs://``, ``az://``);
    files are written by Spark straight to it, committed by delta-rs.

    ``storage_options`` are delta-rs's (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``...);
    settings left out come from the environment of each actor (see ``storage.location``).
    ``vacuum_retention_hours`` must outlast the longest round: files of an open round are not
    in the table yet, and vacuum would delete them; files compacted away are deleted after
    it too (readers of older versions need them until then). ``compact`` and ``log``: table
    upkeep by the pipeline (``protocol.upkeep``; docs/guides/upkeep.md)."""

    #: the table: a local folder or ``s3://``, ``gs://``, ``az://``; created if missing
    path: str
    #: uncommitted files and files compacted away older than this are removed (every
    #: ``log.tidy_every_s``); must outlast the longest round
    vacuum_retention_hours: float = 24.0
    #: delta-rs storage options of a table on object storage (``AWS_ENDPOINT_URL``,
    #: ``AWS_ACCESS_KEY_ID``...); left out: the environment of each actor
    storage_options: dict[str, str] = {}
    #: table partition columns of a typed table: ``col`` or ``name=day(col)``/``hour(col)``;
    #: ``col`` declared (``source.value_schema``, also with ``infer_other_fields``) or a
    #: ``_kafka_*`` column. Upsert tables too: an update may move its key between partitions
    partition_by: tuple[str, ...] = ()
    #: compaction of the table's small files
    compact: CompactSettings = CompactSettings()
    #: checkpoints, log retention, how often upkeep runs
    log: LogSettings = LogSettings()
    #: ``append``: every record is a row; ``upsert``: the table holds one row per key, the
    #: last change of each (a tombstone or a Debezium delete removes it) - ``write_modes``
    write_mode: WriteMode = "append"
    #: upsert: the key's columns; empty: the record key's fields (``source.key_schema``)
    key_columns: tuple[str, ...] = ()
    #: upsert: ``copy_on_write`` (the default) rewrites the files holding a round's keys;
    #: ``merge_on_read`` writes deletion vectors instead (a round's cost follows its changes,
    #: not the table; readers must read deletion vectors - docs/guides/upserts.md)
    upsert_mode: UpsertMode = "copy_on_write"
    #: merge-on-read with one integer key column: the pipeline keeps where each key lives
    #: (``write_modes.key_index``; ~17 bytes a row in the coordinator's memory) for tables
    #: of up to this many rows, so a round's cost follows its changes; a larger table (or 0)
    #: reads its files' key columns every round
    key_index_rows: int = 64_000_000
    #: upsert with ``source.envelope: debezium``: a truncate event (``op: t``) ``apply``:
    #: empties the table at its place in the round (docs/guides/upserts.md#truncate);
    #: ``dead_letter``: a dead letter, the table keeps its rows
    truncate: TruncateMode = "apply"
    #: write many tables instead of one (docs/guides/routes.md): rules that give each record
    #: its table; the tables are made on the fly as ``<path>/<name>``; ``path`` itself then holds only
    #: the records no rule took (``_dead_letters``)
    routes: Routes | None = None

    __repr__ = redacted_repr  # storage options hold credentials

    def __post_init__(self) -> None:
        require(bool(self.path), "sink.path is empty")
        check_write_mode(self.write_mode, self.key_columns)
        require(self.key_index_rows >= 0, "sink.key_index_rows must be >= 0")
        require(self.vacuum_retention_hours > 0, "sink.vacuum_retention_hours must be > 0")
        unknown = [c for c in self.compact.zorder_by if c not in RAW_RECORD_SCHEMA.names]
        require(
            not unknown,
            f"sink.compact.zorder_by: no column {unknown} in the table "
            f"(columns: {RAW_RECORD_SCHEMA.names})",
        )
        try:
            location = self.location()
        except StorageError as e:
            raise ConfigError(f"sink.path: {e}") from None
        why = put_if_absent.problem(location) if self.upsert_mode == "merge_on_read" else None
        require(
            why is None,
            f"sink.upsert_mode: merge_on_read commits with a put-if-absent of the log entry, "
            f"which sink.storage_options rule out: {why}; or use copy_on_write",
        )

    def location(self) -> TableLocation:
        """Where the table lives, with its storage options (a local path made absolute)."""
        return TableLocation.parse(self.path, self.storage_options)

    def route_table(self, name: str) -> DeltaSink:
        """The sink of route table ``name``: this one's settings, at ``<path>/<name>``, with
        its rule's ``compact`` and ``log`` if it sets them."""
        upkeep: dict[str, Any] = {}
        if self.routes is not None and (at := self.routes.rule_of(name)) is not None:
            rule = self.routes.rules[at]
            upkeep = {k: v for k in ("compact", "log") if (v := getattr(rule, k)) is not None}
        return msgspec.structs.replace(self, path=self.location().join(name), routes=None, **upkeep)

    def route_location(self, name: str) -> TableLocation:
        """Where route table ``name``'s files go."""
        return self.route_table(name).location()


class IcebergSink(msgspec.Struct, frozen=True, tag="iceberg"):
    """An Apache Iceberg table ``table`` (``"namespace.name"``) in a pyiceberg catalog;
    files are written by Spark into the table's location, committed by pyiceberg, one
    snapshot per round.

    ``catalog`` is pyiceberg's catalog properties (``{"type": "sql", "uri": ..., "warehouse":
    ...}``); ``rest_catalog`` an Iceberg REST catalog's settings (``config.rest_catalog``: its
    credential never in the configuration). Both left empty, the embedded catalog is used: SQL
    on sqlite in ``warehouse/catalog.db``. ``table_location`` is where the table keeps its
    files; by default ``<warehouse>/<namespace>/<name>`` (where pyiceberg's SQL catalog puts
    it), in a REST catalog's warehouse ``<warehouse>/<namespace>/<name>/data`` (SeaweedFS's
    table buckets take the writer's files only under a table's ``data/``).
    ``vacuum_retention_hours``: as ``DeltaSink``'s - files of an open round are not in the
    table yet. ``keep_snapshots``: older snapshots are expired as rounds commit.
    ``storage_options``: as ``DeltaSink``'s, for a table location on S3 (the Spark tasks
    write there; the catalog's FileIO gets the same endpoint and credentials)."""

    #: ``namespace.name``; namespace and table are created if missing (all columns nullable)
    table: str
    #: with no ``catalog``: the embedded catalog, SQL on sqlite in ``<warehouse>/catalog.db`` (a local
    #: folder)
    warehouse: str = ""
    #: pyiceberg catalog properties (``type``, ``uri``, ``warehouse``, ``s3.*``...) instead of the
    #: embedded one
    catalog: dict[str, str] = {}
    #: an Iceberg REST catalog (``uri``, ``warehouse``, ``credential_env``...) instead of ``catalog``
    rest_catalog: RestCatalog | None = None
    #: the catalog's name (SQL catalogs keep tables of several names apart)
    catalog_name: str = "rayconnect"
    #: where the table's files go; empty: ``<warehouse>/<namespace>/<name>`` (in a REST catalog's
    #: warehouse ``.../<name>/data``); an existing table elsewhere is refused
    table_location: str = ""
    #: files no metadata reaches (aborted rounds' staging files, expired snapshots' manifests) older
    #: than this are removed hourly; must outlast the longest round
    vacuum_retention_hours: float = 24.0
    #: snapshots older than the newest this many are expired as rounds commit
    keep_snapshots: int = 10
    #: for a table location on S3: as ``DeltaSink``'s; pyiceberg's FileIO gets them as ``s3.*``
    storage_options: dict[str, str] = {}
    #: partition spec of a typed table: ``col`` (identity) or ``name=day(col)``/``hour(col)``;
    #: as ``DeltaSink.partition_by`` (upsert tables too)
    partition_by: tuple[str, ...] = ()
    #: ``append``: every record is a row; ``upsert``: the table holds one row per key, the
    #: last change of each (a tombstone or a Debezium delete removes it) - ``write_modes``
    write_mode: WriteMode = "append"
    #: upsert: the key's columns; empty: the record key's fields (``source.key_schema``)
    key_columns: tuple[str, ...] = ()
    #: upsert: ``merge_on_read`` (the default) writes position delete files for the rows a
    #: round replaces (its cost follows its changes, not the table); ``copy_on_write``
    #: rewrites the files holding its keys (docs/guides/upserts.md)
    upsert_mode: UpsertMode = "merge_on_read"
    #: merge-on-read with one integer key column: the pipeline keeps where each key lives
    #: (``write_modes.key_index``; ~17 bytes a row in the coordinator's memory) for tables
    #: of up to this many rows, so a round's cost follows its changes; a larger table (or 0)
    #: reads its files' key columns every round
    key_index_rows: int = 64_000_000
    #: merge-on-read: how upkeep folds the deletes into the data files (docs/guides/upkeep.md)
    fold_deletes: FoldDeletes = FoldDeletes()
    #: upsert with ``source.envelope: debezium``: a truncate event (``op: t``) ``apply``:
    #: empties the table at its place in the round (docs/guides/upserts.md#truncate);
    #: ``dead_letter``: a dead letter, the table keeps its rows
    truncate: TruncateMode = "apply"
    #: write many tables instead of one (docs/guides/routes.md): rules that give each record
    #: its table; the tables are made on the fly as ``<namespace>.<name>``; ``table`` itself then holds only
    #: the records no rule took
    routes: Routes | None = None

    __repr__ = redacted_repr  # catalog properties and storage options may hold credentials

    def __post_init__(self) -> None:
        parts = self.table.split(".")
        require(
            len(parts) >= 2 and all(parts),
            f"sink.table {self.table!r} must be 'namespace.name'",
        )
        rest = self.rest_catalog
        require(
            rest is None or not self.catalog,
            "sink.catalog and sink.rest_catalog are two catalogs: give one",
        )
        require(
            bool(
                self.warehouse
                or self.catalog.get("warehouse")
                or (rest is not None and rest.warehouse_uri)
                or self.table_location
            ),
            "sink.warehouse is empty (and sink.catalog has no warehouse, sink.rest_catalog no "
            "warehouse URL, sink.table_location none): say where the table's files go",
        )
        require(self.vacuum_retention_hours > 0, "sink.vacuum_retention_hours must be > 0")
        require(self.keep_snapshots >= 1, "sink.keep_snapshots must be >= 1")
        check_write_mode(self.write_mode, self.key_columns)
        require(self.key_index_rows >= 0, "sink.key_index_rows must be >= 0")
        try:
            self.location()
        except StorageError as e:
            raise ConfigError(f"sink.table_location: {e}") from None

    @property
    def path(self) -> str:
        """What status lines and errors name the table by."""
        return f"{self.table} (iceberg, {self.location().uri})"

    def catalog_properties(self) -> dict[str, str]:
        """The catalog's properties: the given ones, or the embedded SQL catalog on sqlite
        in the warehouse folder."""
        if self.catalog:
            return dict(self.catalog)
        warehouse = TableLocation.parse(self.warehouse)
        require(
            warehouse.is_local,
            f"sink.warehouse {self.warehouse!r}: the embedded catalog (sqlite) needs a local "
            "folder; give sink.catalog for a warehouse on object storage",
        )
        return {
            "type": "sql",
            "uri": f"sqlite:///{warehouse.uri}/catalog.db",
            "warehouse": warehouse.uri,
        }

    def catalog_config(self) -> dict[str, str] | RestCatalog:
        """The catalog to open: a REST catalog's settings, else ``catalog_properties``."""
        return self.rest_catalog or self.catalog_properties()

    def location(self) -> TableLocation:
        """Where the table's files are (the writer stages Parquet under it)."""
        if self.table_location:
            return TableLocation.parse(self.table_location, self.storage_options)
        rest = self.rest_catalog.warehouse_uri if self.rest_catalog is not None else None
        warehouse = self.warehouse or rest or self.catalog["warehouse"]
        namespace, name = self.table.rsplit(".", 1)
        # A REST catalog's table one folder down: SeaweedFS's table buckets take S3 writes
        # only under a table's data/ (its metadata goes to <location>/metadata: still under it)
        folder = f"/{REST_TABLE_FOLDER}" if self.rest_catalog is not None else ""
        return TableLocation.parse(
            f"{warehouse.rstrip('/')}/{namespace}/{name}{folder}", self.storage_options
        )

    def route_table(self, name: str) -> IcebergSink:
        """The sink of route table ``name``: this one's settings, as ``<namespace>.<name>``
        (its files in ``<table_location>/<name>`` if a ``table_location`` is given, else
        where the catalog's warehouse puts them)."""
        namespace = self.table.rsplit(".", 1)[0]
        location = f"{self.table_location.rstrip('/')}/{name}" if self.table_location else ""
        return msgspec.structs.replace(
            self, table=f"{namespace}.{name}", table_location=location, routes=None
        )

    def route_location(self, name: str) -> TableLocation:
        """Where route table ``name``'s files go."""
        return self.route_table(name).location()


TableSink = DeltaSink | IcebergSink


class SinkPipelineConfig(msgspec.Struct, frozen=True):
    #: the pipeline's name: its actors are ``<name>/...`` and its offsets
    #: ``<name>/<cluster>/<topic>/<partition>`` in the table
    name: str
    #: where it reads (``KafkaSource``)
    source: KafkaSource
    #: where it writes: ``DeltaSink`` or ``IcebergSink`` (a file's ``sink: {type: iceberg, ...}``)
    sink: TableSink
    #: how rounds are paced and when participants flush
    commit: CommitSettings = CommitSettings()
    #: the writer's Spark executors
    spark: SparkSettings = SparkSettings()
    #: where actors and executors run on a Ray cluster
    placement: Placement = Placement()
    #: seconds of one continuous outage (a cluster's broker unreachable, the table's store
    #: failing) after which the pipeline gives up, with the reason (``protocol.outages``);
    #: None: wait for ever
    give_up_after_s: float | None = DEFAULT_GIVE_UP_AFTER_S
    #: partitions of one topic that share a participant host (one actor process): a
    #: process costs ~57 MB and a worker start, a machine in a host a few KB
    partitions_per_host: int = DEFAULT_PARTITIONS_PER_HOST
    #: with many topics: the topics of a cluster share participant hosts, hashed by name
    #: into this many groups (``names.participant_host``); None: a host per topic, unless
    #: ``start()`` finds more than ``AUTO_GROUP_TOPICS`` topics (then one group per
    #: ``partitions_per_host`` partitions found)
    topic_groups: int | None = None
    #: a Spark SQL statement over each write's decoded rows, the view ``records``
    #: (``formats.transform``: its rules); None: rows are written as decoded
    transform: str | None = None
    #: the transform's output schema (Arrow IPC): set by ``analysed()`` at start, not by hand
    transform_schema: bytes | None = None

    __repr__ = redacted_repr

    def __post_init__(self) -> None:
        try:
            check_name("pipeline name", self.name)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_give_up(self.give_up_after_s)
        require(
            self.partitions_per_host >= 1,
            f"partitions_per_host must be >= 1, not {self.partitions_per_host!r}",
        )
        require(
            self.topic_groups is None or self.topic_groups >= 1,
            f"topic_groups must be >= 1 or None, not {self.topic_groups!r}",
        )
        from rayconnect.formats.rows import partition_specs

        require(
            self.sink.routes is None or self.transform is None,
            "sink.routes with a transform is not supported yet: route the transform's rows "
            "in a pipeline of their own",
        )
        require(
            self.sink.routes is None or self.source.offsets_out_of_range == "fail",
            f"source.offsets_out_of_range: {self.source.offsets_out_of_range!r} is not "
            "supported with sink.routes yet (each route table keeps its own offsets): use "
            "'fail'",
        )

        require(
            self.transform is not None or self.transform_schema is None,
            "transform_schema is set by start() from the transform's analysis, not by hand",
        )
        if self.transform is None or self.transform_schema is not None:
            # (a transform's partition columns are known once it is analysed)
            partition_specs(self.record_format())  # ConfigError naming the bad entry
        if self.sink.routes is not None:
            self.route_formats()  # each rule's settings, checked

    def with_topic_groups(self, keys: Sequence[str]) -> SinkPipelineConfig:
        """``topic_groups`` decided from the partitions found at start: left as set, else
        with more than ``AUTO_GROUP_TOPICS`` topics one group per ``partitions_per_host``
        partitions (200 topics of 4 partitions: 4 hosts, not 200)."""
        if self.topic_groups is not None:
            return self
        topics = {k.rsplit("/", 1)[0] for k in keys}
        if len(topics) <= AUTO_GROUP_TOPICS:
            return self
        groups = max(1, -(-len(keys) // self.partitions_per_host))
        return msgspec.structs.replace(self, topic_groups=groups)

    def key_columns(self) -> tuple[str, ...]:
        """An upsert table's key: the sink's ``key_columns``, else the record key's fields."""
        return _upsert_keys(self.sink.key_columns, self.source.record_format())

    def analysed(self) -> SinkPipelineConfig:
        """This config with its transform analysed (a local Spark in a child process, ~5 s;
        ``ConfigError`` if the statement is wrong); itself if it has none."""
        if self.transform is None or self.transform_schema is not None:
            return self
        from rayconnect.formats.transform import analysed

        fmt = analysed(self.record_format())
        return msgspec.structs.replace(self, transform_schema=fmt.transform_schema)

    def record_format(self, route: Route | None = None) -> RecordFormat:
        """How records become rows: the source's format, partitioned and keyed as the sink
        says - or, for the tables of ``route``, with that rule's own settings where it sets
        them (``config.routes``)."""
        fmt = self.source.record_format()
        write_mode, key_columns = self.sink.write_mode, self.sink.key_columns
        partition_by, truncate = self.sink.partition_by, self.sink.truncate
        if route is not None:
            fmt = route.record_format(fmt)
            if route.write_mode is not None:
                write_mode = route.write_mode
            key_columns = route.key_columns if route.key_columns is not None else ()
            if route.key_columns is None and write_mode == self.sink.write_mode:
                key_columns = self.sink.key_columns
            if route.partition_by is not None:
                partition_by = route.partition_by
            if route.truncate is not None:
                truncate = route.truncate
            check_write_mode(write_mode, key_columns)
        if write_mode == "upsert":
            fmt = msgspec.structs.replace(
                fmt, upsert_keys=_upsert_keys(key_columns, fmt), truncate=truncate
            )
        require(
            fmt.envelope == "none" or bool(fmt.upsert_keys),
            "source.envelope debezium needs sink.write_mode upsert (change events fold into "
            "rows by key; to keep the events themselves, read them with envelope none)",
        )
        if self.transform is not None:
            fmt = msgspec.structs.replace(
                fmt, transform=self.transform, transform_schema=self.transform_schema
            )
        if not partition_by:
            return fmt
        return msgspec.structs.replace(
            fmt,
            partition_by=partition_by,
            partition_values_in_files=isinstance(self.sink, IcebergSink),
        )

    def route_formats(self) -> RouteFormats:
        """Each route table's format (``RouteFormats``), every rule's checked: a
        ``ConfigError`` names the rule and the setting."""
        routes = self.sink.routes
        require(routes is not None, "route_formats: the sink has no routes")
        assert routes is not None
        from rayconnect.formats.rows import partition_specs

        by_rule = []
        for i, rule in enumerate(routes.rules):
            try:
                fmt = self.record_format(rule)
                if self.transform is None or self.transform_schema is not None:
                    partition_specs(fmt)
            except ConfigError as e:
                raise ConfigError(f"sink.routes.rules[{i}] (table {rule.table!r}): {e}") from None
            by_rule.append(fmt)
        return RouteFormats(routes, self.record_format(), tuple(by_rule))


def _upsert_keys(key_columns: tuple[str, ...], fmt: RecordFormat) -> tuple[str, ...]:
    """An upsert table's key: ``key_columns``, else the fields of ``fmt``'s record key."""
    if key_columns:
        return key_columns
    require(
        fmt.key_schema is not None,
        "sink.write_mode upsert needs sink.key_columns, or source.key_format json with a "
        "key_schema whose fields are the key",
    )
    assert fmt.key_schema is not None
    return tuple(fmt.key_schema)


def check_write_mode(write_mode: str, key_columns: tuple[str, ...]) -> None:
    """``key_columns`` are an upsert table's, and name each column once."""
    require(
        write_mode == "upsert" or not key_columns,
        "sink.key_columns are for write_mode upsert (an append table keeps every record)",
    )
    require(len(set(key_columns)) == len(key_columns), f"sink.key_columns repeat: {key_columns}")


def _read_avsc(path: str | None) -> str | None:
    """The writer schema's JSON text from an .avsc file (checked: ConfigError)."""
    if path is None:
        return None
    try:
        text = open(os.path.expanduser(path), encoding="utf-8").read()  # noqa: SIM115
    except OSError as e:
        raise ConfigError(f"source.value_avro_schema: cannot read {path!r}: {e}") from None
    try:
        from rayconnect.formats.avro import avro_schema_columns

        avro_schema_columns(text)
    except ImportError:
        raise ConfigError(
            "source.value_format avro needs DuckDB's Avro reader: pip install 'rayconnect[avro]'"
        ) from None
    except ValueError as e:
        raise ConfigError(f"source.value_avro_schema {path!r}: {e}") from None
    return text


def check_give_up(give_up_after_s: float | None) -> None:
    """``give_up_after_s`` is a positive number of seconds, or None (never give up)."""
    require(
        give_up_after_s is None or give_up_after_s > 0,
        f"give_up_after_s must be > 0 (seconds), or null to wait for ever, not {give_up_after_s!r}",
    )
