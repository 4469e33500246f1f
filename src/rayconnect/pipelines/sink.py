"""The sink pipeline (Kafka -> Delta or Iceberg): build it, ``start()`` it, watch it, ``stop()`` it.

``start()`` validates everything it can before any actor exists (configuration, Java, every
cluster reachable, every topic present), then creates the pipeline's named, detached actors in
Ray namespace ``rayconnect``. The actors, not the driver, hold the pipeline: the driver may
exit, and ``rc.attach(name)`` from any process finds the pipeline again by name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import ray

from rayconnect.actors import names
from rayconnect.actors.directory import get_actor, pipeline_actor_names
from rayconnect.aio import run_sync
from rayconnect.config.placement import Placement
from rayconnect.config.sink import (
    DEFAULT_PARTITIONS_PER_HOST,
    DeltaSink,
    IcebergSink,
    KafkaSource,
    SinkPipelineConfig,
    SparkSettings,
    TableSink,
)
from rayconnect.errors import (
    ConfigError,
    PipelineAlreadyRunningError,
    PipelineNotFoundError,
    TableRecoveryError,
    no_such,
)
from rayconnect.protocol.actor_status import DiscoveryStatus, HostStatus, ReaderStatus
from rayconnect.protocol.outages import DEFAULT_GIVE_UP_AFTER_S
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.status import PartitionStatus, PipelineStatus, StopResult, WriterStatus
from rayconnect.protocol.table_offsets import table_lag
from rayconnect.protocol.types import TopicPartition
from rayconnect.runtime import Handle, actor_statuses, ensure_ray
from rayconnect.tables.factory import open_committer

log = logging.getLogger(__name__)


def commit_settings_of(commit: CommitSettings | None, fields: dict[str, Any]) -> CommitSettings:
    """``CommitSettings`` from a Struct or from keyword fields; an unknown keyword is a
    ConfigError that suggests the closest setting."""
    for key in fields:
        if key not in CommitSettings.__struct_fields__:
            raise no_such("CommitSettings", key, CommitSettings.__struct_fields__)
    if commit is not None and fields:
        raise ConfigError(f"give commit=CommitSettings(...) or {sorted(fields)}, not both")
    return commit if commit is not None else CommitSettings(**fields)


class SinkPipeline:
    """Kafka -> Delta or Iceberg, exactly once (Hudi RFC-32 rounds, KIP-89 flushes).

    >>> rc.SinkPipeline("orders", source=rc.KafkaSource(meta), sink=rc.DeltaSink("/data/t"),
    ...                 commit_interval_s=5).start()
    """

    def __init__(
        self,
        name: str,
        source: KafkaSource,
        sink: TableSink,
        *,
        commit: CommitSettings | None = None,
        spark: SparkSettings | None = None,
        placement: Placement | None = None,
        give_up_after_s: float | None = DEFAULT_GIVE_UP_AFTER_S,
        partitions_per_host: int = DEFAULT_PARTITIONS_PER_HOST,
        topic_groups: int | None = None,
        transform: str | None = None,
        **commit_settings: Any,
    ) -> None:
        """``commit_settings``: any field of ``rc.CommitSettings`` by name (its defaults are
        the defaults), or a whole ``commit=rc.CommitSettings(...)``; not both.
        ``give_up_after_s``: see ``SinkPipelineConfig`` (None: wait out any outage).
        ``partitions_per_host``: partitions of one topic per participant host process.
        ``topic_groups``: topics hashed into this many groups of hosts (None: a host per
        topic, unless ``start()`` finds more than 16 topics: ``SinkPipelineConfig``).
        ``transform``: Spark SQL over each write's decoded rows, the view ``records``
        (docs/guides/typed-tables.md, "Transforms")."""
        self.config = SinkPipelineConfig(
            name=name,
            source=source,
            sink=sink,
            commit=commit_settings_of(commit, commit_settings),
            spark=spark or SparkSettings(),
            placement=placement or Placement(),
            give_up_after_s=give_up_after_s,
            partitions_per_host=partitions_per_host,
            topic_groups=topic_groups,
            transform=transform,
        )

    @classmethod
    def from_config(cls, config: SinkPipelineConfig) -> SinkPipeline:
        self = cls.__new__(cls)
        self.config = config
        return self

    def discover(self) -> dict[str, list[TopicPartition]]:
        """Cluster id -> partitions of the subscribed topics, as the metadata service has
        them now. Raises ConfigError for a failing service, DiscoveryError for a cluster
        that cannot be reached or lacks a topic: before any actor starts."""
        from rayconnect.kafka.discovery import discover_partitions
        from rayconnect.metadata import poll_service

        source = self.config.source
        _, error = run_sync(poll_service(source.metadata))
        if error is not None and not source.streams():
            raise ConfigError(f"source.metadata: {error}")
        clusters = source.clusters()
        if not clusters:
            raise ConfigError(f"pipeline {self.config.name!r}: no stream is subscribed")

        async def all_clusters() -> dict[str, list[TopicPartition]]:
            return {cid: await discover_partitions(cid, meta) for cid, meta in clusters.items()}

        return run_sync(all_clusters())

    def start(
        self, *, address: str | None = None, timeout_s: float = 300.0, wait_for_spark: bool = True
    ) -> PipelineHandle:
        """Validate, then start the writer, participants, coordinator and enumerator (which
        starts the readers); returns once every reader reads and (``wait_for_spark``) Spark
        is up - when it starts with the pipeline (``spark.start: with_pipeline``; the
        default, ``when_needed``, starts it once the writer's process is busy). Records are
        read, written and committed while Spark starts (the writer writes without it
        meanwhile): without ``wait_for_spark`` start() returns 10-20 s sooner, and a Spark
        that cannot start shows in ``status().writer.problem`` instead of raising here."""
        from rayconnect.actors.coordinator import CoordinatorActor
        from rayconnect.actors.enumerator import EnumeratorActor
        from rayconnect.actors.participant_host import start_participants
        from rayconnect.actors.writer import start_writer
        from rayconnect.spark_bridge.session import require_java

        phases = StartupPhases(self.config.name)
        require_java()
        cfg = self.config = self.config.analysed()  # a transform's SQL: checked here
        check_sink(cfg.sink)
        by_cluster = self.discover()
        keys = [tp.key for tps in by_cluster.values() for tp in tps]
        if not keys:
            raise ConfigError(f"pipeline {cfg.name!r}: the subscribed topics have no partitions")
        cfg = self.config = cfg.with_topic_groups(keys)  # many topics share hosts
        phases.done("checks and discovery")
        ensure_ray(address)
        cfg.placement.check()
        if get_actor(names.coordinator(cfg.name)) is not None:
            raise PipelineAlreadyRunningError(
                f"pipeline {cfg.name!r} is already running: use rayconnect.attach({cfg.name!r})"
            )
        detached = {"namespace": names.NAMESPACE, "lifetime": "detached"}
        # Spark's start-up (~20-30 s) overlaps everything else: the writer writes without
        # Spark until Spark is up (actors/writer.py), so the first rounds read, write and
        # commit meanwhile; start() still waits for Spark last, to report a Spark that
        # cannot start.
        record_format = cfg.record_format()
        routing, route_schemas = _routing(cfg)
        writer = start_writer(
            names.writer(cfg.name),
            spark=cfg.spark,
            warm_up_table=cfg.sink.location(),
            wait=False,
            placement=cfg.placement,
            record_format=record_format,
            table_schema=(
                open_committer(cfg.sink, cfg.name, record_format).current_schema
                if record_format.typed and routing is None
                else None
            ),
            routing=routing,
            route_schemas=route_schemas,
        )
        # The partitions known now get their participants before the first START; the
        # enumerator adds and retires partitions from then on.
        hosts_ready = start_participants(cfg, keys, cfg.source.clusters())
        spark_ready: Any = writer.ready.remote()  # an ObjectRef
        ray.get(hosts_ready, timeout=timeout_s)
        phases.done(f"participants of {len(keys)} partitions in {len(hosts_ready)} hosts")
        coordinator = CoordinatorActor.options(
            name=names.coordinator(cfg.name),
            **detached,
            **cfg.placement.actor_options("coordinator"),
        ).remote(cfg, keys)
        # The enumerator and its readers start while the coordinator recovers the table (they
        # took 2.4 s after its 1.3 s, one after the other): a reader reads nothing of a
        # partition until that partition's participant, told the offsets by the first START,
        # resumes it; the enumerator's calls to the coordinator wait for it to be ready.
        EnumeratorActor.options(
            name=names.enumerator(cfg.name), **detached, **cfg.placement.actor_options("enumerator")
        ).remote(cfg)
        handle = PipelineHandle(cfg.name)
        try:
            # fail_fast: a table that cannot be recovered ends start() at once (the
            # coordinator would retry it until the timeout)
            ray.get(coordinator.ready.remote(fail_fast=True), timeout=timeout_s)
        except Exception as e:
            handle.stop(commit=False)  # no reader, host or writer left behind
            cause = getattr(e, "cause", None)  # a RayTaskError carries the actor's error
            if isinstance(cause, TableRecoveryError):
                raise TableRecoveryError(str(cause)) from None  # one line, no traceback
            raise
        phases.done("coordinator (table recovered)")
        handle.wait_for(lambda s: s["readers_ready"], timeout_s=timeout_s, poll_s=0.2)
        phases.done("enumerator and readers")
        if wait_for_spark:
            try:
                ray.get(spark_ready, timeout=timeout_s)
            except Exception:
                handle.stop(commit=False)  # a pipeline that cannot start Spark does not stay
                raise
            phases.done("writer (Spark), after the others")
        handle.startup = phases.seconds
        log.info("pipeline %s started in %.1f s: %s", cfg.name, phases.total, phases)
        return handle


def _routing(cfg: SinkPipelineConfig) -> tuple[Any, Any]:
    """A sink with routes: what the writer needs to write each record into its table
    (``RoutedWrite``) and to read the tables' schemas (typed formats); else (None, None)."""
    if cfg.sink.routes is None:
        return None, None
    from rayconnect.spark_bridge.task_writes import RoutedWrite
    from rayconnect.tables.route_formats import sink_formats
    from rayconnect.tables.table_set import RouteSchemas

    formats = sink_formats(cfg)
    schemas = RouteSchemas(cfg.sink, cfg.name, formats) if formats.typed else None
    return RoutedWrite(cfg.sink.routes, cfg.sink.route_location, formats), schemas


class StartupPhases:
    """How long each step of ``start()`` took: start-up grows with partitions (one host
    process per ``partitions_per_host``), and a user waiting a minute should see where it
    goes (``handle.startup``, and a log line)."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.seconds: dict[str, float] = {}
        self._started = self._last = time.monotonic()

    def done(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._last, 2)
        self._last = now
        log.info("pipeline %s: %s ready after %.1f s", self.pipeline, phase, now - self._started)

    @property
    def total(self) -> float:
        return self._last - self._started

    def __str__(self) -> str:
        return ", ".join(f"{phase} {s:.1f} s" for phase, s in self.seconds.items())


def check_sink(sink: TableSink) -> None:
    """Before any actor starts, the table's location can be written - a local folder
    (``storage.check.check_local_folder``: a folder, writable, a probe file made and
    removed), an object store's endpoint, credentials and bucket (``check_table_store``) -
    and an Iceberg sink's catalog opens (its sqlite folder writable first); else a
    ConfigError naming the setting. Route tables live under the sink's path or warehouse:
    the root's check covers them. No table is created."""
    from rayconnect.storage.check import check_local_folder, check_table_store
    from rayconnect.storage.location import StorageError

    location = sink.location()
    try:
        if location.is_local:
            check_local_folder(location.uri, _location_setting(sink))
        else:
            check_table_store(location)
    except StorageError as e:
        raise ConfigError(str(e) if location.is_local else f"sink {sink.path}: {e}") from None
    if isinstance(sink, IcebergSink):
        try:
            for folder, setting in _catalog_folders(sink):
                check_local_folder(folder, setting)
        except StorageError as e:
            raise ConfigError(str(e)) from None
        check_catalog(sink)


def _location_setting(sink: TableSink) -> str:
    """The setting that says where the table's files go (as ``location()`` picks it)."""
    if isinstance(sink, DeltaSink):
        return "sink.path"
    if sink.table_location:
        return "sink.table_location"
    if sink.warehouse:
        return "sink.warehouse"
    return "sink.rest_catalog.warehouse" if sink.rest_catalog else "sink.catalog.warehouse"


def _catalog_folders(sink: IcebergSink) -> list[tuple[str, str]]:
    """The local folders an SQL catalog on sqlite keeps its file in, with their setting:
    the embedded catalog's warehouse, or a ``sink.catalog`` uri ``sqlite:///...``."""
    from rayconnect.storage.location import TableLocation

    if sink.rest_catalog is not None:
        return []
    if not sink.catalog:
        warehouse = TableLocation.parse(sink.warehouse)
        return [(warehouse.uri, "sink.warehouse")] if warehouse.is_local else []
    uri = sink.catalog.get("uri", "")
    database = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ":memory:"
    if database == ":memory:":
        return []
    return [(os.path.dirname(database) or ".", "sink.catalog.uri")]


def check_catalog(sink: IcebergSink) -> None:
    """The Iceberg catalog opens (the embedded one is created): else a ConfigError naming
    ``sink.catalog``, not a coordinator retrying its recovery for ever."""
    from rayconnect.tables.factory import iceberg_committer

    try:
        iceberg_committer(sink, "check", None).catalog()
    except Exception as e:
        if sink.rest_catalog is not None:  # its errors name the setting already
            raise ConfigError(f"cannot open the Iceberg REST catalog: {e}") from None
        setting = "sink.catalog" if sink.catalog else "sink.warehouse"
        raise ConfigError(f"{setting}: cannot open the Iceberg catalog: {e}") from None


def _writer_status(pipeline: str, timeout_s: float) -> WriterStatus:
    """The Spark side: executors wanted / started with / registered now, and ``problem``
    (degraded, waiting for CPUs) - or why the writer did not answer (it is restarting)."""
    writer = get_actor(names.writer(pipeline))
    if writer is None:
        return WriterStatus(error="no writer actor")
    try:
        stats: WriterStatus = ray.get(writer.stats.remote(), timeout=timeout_s)
    except Exception as e:  # restarting after a node loss is a state, not an error
        return WriterStatus(error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}")
    return stats


#: the roles that start rounds (coordinator) and actors (enumerator): ``stop`` ends them
#: before the others, which then close together
STARTERS = frozenset({"enumerator", "coordinator"})


@dataclass(frozen=True)
class _PartitionState:
    """A partition's ``state`` and ``reason`` (``PartitionStatus``' fields)."""

    state: str = "ok"
    reason: str | None = None


def _partition_states(actor_names: list[str], timeout_s: float) -> dict[str, _PartitionState]:
    """Partition -> its state where a participant says it is stalled (the liveness rule,
    ``protocol.participant``) or, with consistent cuts, holds records that no cut marker
    follows (``no_cut_markers``: its ``last_error`` says why); hosts (among the pipeline's
    ``actor_names``) that do not answer are left out."""
    hosts = [get_actor(n) for n in actor_names if "/participants/" in n]
    refs = [h.status.remote() for h in hosts if h is not None]
    states: dict[str, _PartitionState] = {}
    for ref in refs:
        try:
            report: HostStatus = ray.get(ref, timeout=timeout_s)
        except Exception:  # a host restarting is a state, not an error
            continue
        for key, part in report.partitions.items():
            if part.stalled:
                states[key] = _PartitionState(
                    "stalled",
                    f"nothing read for {part.idle_rounds_behind} rounds while its log has "
                    f"data to offset {part.data_end} (reader at {part.position}); "
                    f"reader re-synced {part.resyncs} times",
                )
            if part.unmarked:  # the cause, where both hold: the rounds take nothing
                states[key] = _PartitionState("no_cut_markers", part.last_error)
    return states


class PipelineHandle(Handle):
    """Watch and stop a running sink pipeline; holds only its name."""

    transient = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)

    def __init__(self, name: str) -> None:
        super().__init__(name)
        #: seconds per step of the ``start()`` that returned this handle (empty for
        #: ``attach``)
        self.startup: dict[str, float] = {}

    def _coordinator(self) -> Any:
        actor = get_actor(names.coordinator(self.name))
        if actor is None:
            raise PipelineNotFoundError(f"pipeline {self.name!r} is not running")
        return actor

    def status(self, timeout_s: float = 30.0, *, actors: bool = False) -> PipelineStatus:
        """The coordinator's status with what the other actors know: discovery, readers,
        the writer, lag and high watermark per partition; with ``actors``, every actor's
        process (Ray's state API: slower, what ``rayconnect status`` shows)."""
        status: PipelineStatus = ray.get(self._coordinator().status.remote(), timeout=timeout_s)
        enumerator = get_actor(names.enumerator(self.name))
        discovery: DiscoveryStatus | None = (
            ray.get(enumerator.status.remote(), timeout=timeout_s) if enumerator else None
        )
        readers: dict[str, ReaderStatus] = {}
        actor_names = pipeline_actor_names(self.name)
        for name in actor_names:
            if "/reader/" in name and (actor := get_actor(name)) is not None:
                try:
                    readers[name] = ray.get(actor.status.remote(), timeout=timeout_s)
                except Exception as e:  # a reader restarting is a state, not an error
                    readers[name] = ReaderStatus(error=f"{type(e).__name__}: {e}")
        expected = set(discovery.splits_per_reader) if discovery is not None else set()
        hws: dict[str, int | None] = {}
        for r in readers.values():
            for key, p in r.partitions.items():
                hws[key] = p.high_watermark
        states = _partition_states(actor_names, timeout_s)
        lag: dict[str, int | None] = {}
        for key, hw in hws.items():
            committed = status.offsets.get(key)
            lag[key] = None if hw is None or committed is None else hw - committed
            if (lag[key] or 0) < 0:  # never lag 0: the table is past the log's end
                lag[key] = None
                states[key] = _PartitionState(
                    "offsets_ahead", f"committed offset {committed:,} > high watermark {hw:,}"
                )
        for key, report in status.out_of_range.items():
            lag[key] = None
            states[key] = _PartitionState(report.state, report.describe())
        keys = sorted(set(status.partitions) | set(status.offsets) | set(hws))
        return msgspec.structs.replace(
            status,
            discovery=discovery,
            readers=readers,
            readers_ready=bool(expected)
            and all(
                names.reader_of(self.name, r) in readers
                and readers[names.reader_of(self.name, r)].metadata_updates > 0
                for r in expected
            ),
            writer=_writer_status(self.name, timeout_s),
            lag=lag,
            partition_status={
                key: PartitionStatus(
                    committed_offset=status.offsets.get(key),
                    high_watermark=hws.get(key),
                    lag=lag.get(key),
                    host=status.participant_hosts.get(key),
                    state=s.state,
                    reason=s.reason,
                )
                for key in keys
                for s in [states.get(key, _PartitionState())]
            },
            actors=actor_statuses(self.name) if actors else None,
            tables={
                name: msgspec.structs.replace(table, lag=table_lag(table.offsets, hws))
                for name, table in status.tables.items()
            },
        )

    def stop(self, *, commit: bool = True, timeout_s: float = 120.0) -> StopResult:
        """Commit what was read (one last round) unless ``commit=False``, then end every actor.

        Nothing is lost either way: what was not committed is read again on the next start.
        """
        result = StopResult()
        coordinator = get_actor(names.coordinator(self.name))
        if coordinator is not None:
            try:
                final = ray.get(coordinator.last_round.remote(commit), timeout=timeout_s)
                result = StopResult(final=final)
            except Exception as e:
                result = StopResult(error=f"final round not committed: {type(e).__name__}: {e}")
        # Those that start rounds and actors first, then the rest together: closed one after
        # another, the demo's stop took 13.6 s (Spark's JVMs last, after every host's).
        listed = pipeline_actor_names(self.name)
        drivers = [n for n in listed if names.role_of(n) in STARTERS]
        for wave in (drivers, [n for n in listed if n not in drivers]):
            actors = [a for a in map(get_actor, wave) if a is not None]
            closing = [actor.close.remote() for actor in actors]
            with contextlib.suppress(Exception):  # an actor's failed close still ends it
                ray.wait(closing, num_returns=len(closing), timeout=30)
            for actor in actors:
                ray.kill(actor, no_restart=True)
        return result
