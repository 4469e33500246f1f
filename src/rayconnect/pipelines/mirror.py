"""``rc.Mirror``: a PostgreSQL database kept equal to lake tables - the Postgres source
pipeline and the routed upsert sink pipeline of one ``MirrorConfig``, started, watched and
stopped as one.

Nothing here moves data: the two pipelines do, exactly as when started from two files
(docs/guides/database-mirror.md). What the mirror adds is the order and the pairing:

- ``start``: every check before anything starts (the table location, Postgres: reachable,
  ``wal_level``, permission, tables, slot), the tables listed when none are named, an
  embedded broker when no Kafka is given, then the source (which makes each table's topic
  with ``partitions`` before it is ready: ``kafka.topics``, the same as any Postgres source),
  then the sink; a sink that fails to start stops the source again;
- a record in Ray's GCS (``mirror/<name>``) says which two pipelines make mirror ``name``, so
  ``rayconnect status NAME`` / ``stop NAME`` from any process treat them as one;
- ``stop``: the source first (its open transaction committed), then the sink once it has
  read everything the source wrote (its lag 0) and committed it, so a stopped mirror's tables
  hold every change the source took; ``drop_slot`` then also drops the replication slot (and
  the mirror's own publication), for a mirror deleted for good.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import msgspec

from rayconnect.config.mirror import MirrorConfig
from rayconnect.config.source import SourcePipelineConfig
from rayconnect.errors import (
    ConfigError,
    PipelineAlreadyRunningError,
    PipelineNotFoundError,
    no_such,
)
from rayconnect.protocol.source_status import SourcePipelineStatus, SourceTaskReport
from rayconnect.protocol.status import PipelineStatus, StopResult

__all__ = ["Mirror", "MirrorHandle", "MirrorRecord", "MirrorStatus", "find_mirror"]

_KV_NAMESPACE = "rayconnect"


class MirrorRecord(msgspec.Struct, frozen=True):
    """What a running mirror leaves in Ray's GCS: its two pipelines, so any process finds
    the pair by the mirror's name."""

    name: str
    source: str
    sink: str
    #: the lake tables' location (``to``) and format, for the read-back command
    to: str
    format: str
    #: Kafka between the pipelines lives in the process that started the mirror
    embedded_broker: bool = False
    #: Iceberg on the embedded catalog (in ``to``): the tables' namespace; None otherwise
    iceberg_namespace: str | None = None


class MirrorStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Both pipelines' status (None: that one did not answer - restarting, or stopped)."""

    name: str
    source: SourcePipelineStatus | None
    sink: PipelineStatus | None

    def table_lags(self) -> dict[str, int | None]:
        """Lake table -> records in Kafka not in it yet (the sink's route tables; a table
        whose topic has no record yet is not there)."""
        if self.sink is None:
            return {}
        return {name: t.lag for name, t in sorted(self.sink.tables.items())}


class MirrorStopResult(msgspec.Struct, frozen=True, kw_only=True):
    source: dict[str, SourceTaskReport]
    sink: StopResult
    #: the sink read everything the source wrote before its last round (False: the drain
    #: timed out; what it had not read is read again on the next start)
    drained: bool
    slot_dropped: bool


def _kv_key(name: str) -> bytes:
    return f"mirror/{name}".encode()


def find_mirror(name: str) -> MirrorRecord | None:
    """The running mirror ``name`` (Ray connected), or None."""
    from rayconnect import ray_internals

    raw = ray_internals.kv_get(_kv_key(name), namespace=_KV_NAMESPACE)
    return None if raw is None else msgspec.json.decode(raw, type=MirrorRecord)


class Mirror:
    """A PostgreSQL database mirrored into Delta or Iceberg tables, exactly once.

    >>> handle = rc.Mirror("shop", "postgresql://cdc@db:5432/shop", to="/data/lake/shop",
    ...                    password_env="PGPASSWORD").start()
    >>> handle.status().table_lags()
    >>> handle.stop()                      # or stop(drop_slot=True): deleted for good

    Keyword arguments: ``MirrorConfig``'s fields (an unknown one is a ConfigError naming the
    closest). Without ``kafka`` an embedded broker runs for the handle's lifetime (in this
    process): stop the mirror through this handle then."""

    def __init__(self, name: str, database: str, *, to: str, **settings: Any) -> None:
        fields = MirrorConfig.__struct_fields__
        for key in settings:
            if key not in fields:
                raise no_such("rc.Mirror", key, fields)
        self.config = MirrorConfig(name=name, database=database, to=to, **settings)

    @classmethod
    def from_config(cls, config: MirrorConfig) -> Mirror:
        self = cls.__new__(cls)
        self.config = config
        return self

    def check(self) -> SourcePipelineConfig:
        """Every check that needs no Ray and no Kafka: the table location can be written,
        Postgres is reachable and can replicate the tables (ConfigError naming the setting).
        Returns the source pipeline's config with the tables it will capture."""
        from rayconnect.pipelines.sink import check_sink

        c = self.config
        try:
            check_sink(c.sink_config().sink)
        except ConfigError as e:
            raise ConfigError(f"to: {e}") from None
        if c.kafka is None:
            _check_no_tables_of_a_gone_broker(c)
        source = c.source_config(c.tables or list_tables(c))
        task = source.task.build()
        try:
            task.check()
        except ConfigError as e:
            message = str(e)
            if message.startswith("dsn:"):
                message = "database:" + message.removeprefix("dsn:")
            raise ConfigError(message) from None
        if c.key_schema is None:
            self.config = msgspec.structs.replace(c, table_keys=table_keys(source))
        return source

    def start(self, *, address: str | None = None, timeout_s: float = 120.0) -> MirrorHandle:
        """Check, then start the source and the sink (see the module docstring)."""
        from rayconnect import ray_internals
        from rayconnect.pipelines.sink import SinkPipeline
        from rayconnect.pipelines.source import SourcePipeline
        from rayconnect.runtime import check_ray, ensure_ray

        source = self.check()
        check_ray(address)
        ensure_ray(address, own_session=True)
        c = self.config
        if find_mirror(c.name) is not None:
            raise PipelineAlreadyRunningError(
                f"mirror {c.name!r} is already running: see `rayconnect status {c.name}`"
            )
        with contextlib.ExitStack() as undo:
            broker = None
            if c.kafka is None:
                from rayconnect.kafka.embedded import EmbeddedBroker

                broker = EmbeddedBroker("mirror", own_session=True).start()
                undo.callback(broker.stop)
                c = c.with_kafka(broker.bootstrap_servers)
                source = msgspec.structs.replace(
                    source, target=msgspec.structs.replace(source.target, bootstrap_servers=c.kafka)
                )
            # the source makes each table's topic (``partitions``) before it is ready
            source_handle = SourcePipeline.from_config(source).start(
                address=address, timeout_s=timeout_s
            )
            undo.callback(source_handle.stop)
            sink_config = c.sink_config()
            SinkPipeline.from_config(sink_config).start(address=address)
            embedded_catalog = c.format == "iceberg" and not (c.catalog or c.rest_catalog)
            record = MirrorRecord(
                c.name,
                source.name,
                sink_config.name,
                c.to,
                c.format,
                broker is not None,
                c.iceberg_namespace if embedded_catalog else None,
            )
            ray_internals.kv_put(
                _kv_key(c.name), msgspec.json.encode(record), namespace=_KV_NAMESPACE
            )
            undo.pop_all()
        return MirrorHandle(c.name, record, broker)


def list_tables(config: MirrorConfig) -> list[str]:
    """With no ``tables``: every table of schema public (or, given a ``publication``, [] -
    the source captures that publication's tables). ConfigError if there are none."""
    from rayconnect.source_tasks.postgres import PostgresSettings, catalog

    if config.publication is not None:
        return []
    settings = config.source_config(["public.none"]).task
    assert isinstance(settings, PostgresSettings)
    try:
        conn = catalog.connect(settings)
    except ConfigError as e:
        raise ConfigError("database:" + str(e).removeprefix("dsn:")) from None
    try:
        rows = catalog.query(
            conn,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "AND table_type = 'BASE TABLE' ORDER BY table_name",
        )
    finally:
        conn.close()
    if not rows:
        raise ConfigError(
            f"tables: database {config.database_name!r} has no table in schema public; name "
            "the tables to mirror (tables: [schema.table, ...])"
        )
    return [f"public.{name}" for (name,) in rows]


def _check_no_tables_of_a_gone_broker(config: MirrorConfig) -> None:
    """An embedded broker's log ends with the command that ran it, while the lake tables keep
    the offsets of that log: a new broker's topics start at 0, behind every table - refused
    before anything starts, rather than found by the sink's first round."""
    from rayconnect.tables.factory import route_tables

    sink = config.sink_config()
    found = route_tables(sink.sink, sink.name)
    if found:
        raise ConfigError(
            f"to: {config.to} already holds mirrored tables ({', '.join(found[:5])}"
            f"{', ...' if len(found) > 5 else ''}) whose offsets are those of an embedded "
            "broker that is gone (it lives as long as the command that ran it); mirror into a "
            "new `to` (after `rayconnect stop NAME --drop-slot`), or give the mirror a Kafka "
            "of its own (kafka:) from the start"
        )


def table_keys(source: SourcePipelineConfig) -> dict[str, dict[str, str]]:
    """Each captured table's primary key as the record key's fields and lake types (what
    the sink keys its table by); ConfigError naming a table without one: its rows could not
    be kept by key."""
    from rayconnect.source_tasks.postgres import PostgresSettings, catalog
    from rayconnect.source_tasks.postgres.column_types import lake_type

    settings = source.task
    assert isinstance(settings, PostgresSettings)
    conn = catalog.connect(settings)
    try:
        tables = catalog.tables_of(settings, conn)
        keys = catalog.primary_keys(conn, tables)
    finally:
        conn.close()
    keyless = [f"{schema}.{table}" for schema, table in tables if f"{schema}.{table}" not in keys]
    if keyless:
        raise ConfigError(
            f"tables: {', '.join(keyless)} ha{'ve' if len(keyless) > 1 else 's'} no primary "
            "key: a mirror keeps each lake table equal to its Postgres table by key; add one, "
            "or leave the table out (tables: [...])"
        )
    return {
        name: {column: lake_type(oid, modifier) for column, oid, modifier in columns}
        for name, columns in keys.items()
    }


class MirrorHandle:
    """Watch and stop a running mirror; holds its name (and, for an embedded broker, the
    broker: it stops with the mirror)."""

    def __init__(self, name: str, record: MirrorRecord, broker: Any = None) -> None:
        from rayconnect.pipelines.sink import PipelineHandle
        from rayconnect.pipelines.source import SourcePipelineHandle

        self.name, self.record, self.broker = name, record, broker
        self.source = SourcePipelineHandle(record.source)
        self.sink = PipelineHandle(record.sink)

    @classmethod
    def attach(cls, name: str) -> MirrorHandle:
        """The running mirror ``name`` (Ray connected); PipelineNotFoundError if none."""
        record = find_mirror(name)
        if record is None:
            raise PipelineNotFoundError(f"no running mirror named {name!r}")
        return cls(name, record)

    def status(self, timeout_s: float = 10.0, *, actors: bool = False) -> MirrorStatus:
        from rayconnect.runtime import task_actor_names

        source = sink = None
        with contextlib.suppress(Exception):  # a pipeline restarting is a state
            if task_actor_names(self.source.name):
                source = self.source.status(timeout_s=timeout_s)
        with contextlib.suppress(Exception):
            sink = self.sink.status(timeout_s=timeout_s, actors=actors)
        return MirrorStatus(name=self.name, source=source, sink=sink)

    def running(self) -> bool:
        """Either pipeline still has actors (False: stopped, e.g. from another process)."""
        from rayconnect.actors.directory import pipeline_actor_names

        return bool(pipeline_actor_names(self.source.name) or pipeline_actor_names(self.sink.name))

    def stop(
        self,
        *,
        commit: bool = True,
        drop_slot: bool = False,
        drain_timeout_s: float = 60.0,
        timeout_s: float = 120.0,
    ) -> MirrorStopResult:
        """The source, then the sink once it read all the source wrote (``commit``: and
        committed it in a last round); ``drop_slot``: then the replication slot (and the
        mirror's own publication) is dropped - Postgres stops keeping WAL for the mirror, and
        a later start snapshots again. The record goes; an embedded broker stops."""
        from rayconnect import ray_internals

        source = self.source.stop(timeout_s=min(timeout_s, 60.0), release=drop_slot)
        drained = commit and self._drain(drain_timeout_s)
        sink = self.sink.stop(commit=commit, timeout_s=timeout_s)
        with contextlib.suppress(Exception):
            ray_internals.kv_del(_kv_key(self.name), namespace=_KV_NAMESPACE)
        if drop_slot:  # deleted for good: the keys its source published go too
            from rayconnect import route_keys

            with contextlib.suppress(Exception):
                route_keys.forget(self.record.sink)
        if self.broker is not None:
            self.broker.stop()
        return MirrorStopResult(source=source, sink=sink, drained=drained, slot_dropped=drop_slot)

    def _drain(self, timeout_s: float) -> bool:
        """Wait until the sink's lag is 0 on every partition (the source stopped: nothing
        more comes); False if ``timeout_s`` ran out first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                s = self.sink.status(timeout_s=10)
                lags = [p.lag for p in s.partition_status.values()]
                if lags and all(lag == 0 for lag in lags):
                    return True
            time.sleep(0.5)
        return False
