"""The Python API: build a pipeline, ``start()`` it, watch it, ``stop()`` it, ``attach`` to it.

``start()`` validates everything it can before any actor exists (configuration, Java, every
cluster reachable, every topic present), then creates the pipeline's named, detached actors in
Ray namespace ``rayconnect``. The actors, not the driver, hold the pipeline: the driver may
exit, and ``rc.attach(name)`` from any process finds the pipeline again by name.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray

from rayconnect.actors import names
from rayconnect.aio import run_sync
from rayconnect.config import (
    CommitSettings,
    ConfigError,
    DeltaSink,
    KafkaSource,
    SinkPipelineConfig,
    SparkSettings,
)
from rayconnect.placement import Placement
from rayconnect.protocol.types import TopicPartition


class PipelineError(RuntimeError):
    """A pipeline cannot be started, found or stopped; the message says why."""


def ensure_ray(address: str | None = None) -> None:
    """Use the Ray this process is connected to, or connect/start one (namespace rayconnect)."""
    if ray.is_initialized():
        return
    ray.init(address=address, namespace=names.NAMESPACE, log_to_driver=False)


def _get_actor(name: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=names.NAMESPACE)
    except ValueError:
        return None


def pipeline_actor_names(pipeline: str) -> list[str]:
    """Every live named actor of a pipeline, coordinator first, writer last."""
    found = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == names.NAMESPACE and names.pipeline_of(a["name"]) == pipeline
    ]
    order = {"enumerator": 0, "coordinator": 1, "reader": 2, "participant": 3, "writer": 4}
    return sorted(found, key=lambda n: (order.get(n.split("/")[1], 9), n))


class SinkPipeline:
    """Kafka -> Delta, exactly once (Hudi RFC-32 rounds, KIP-89 flushes).

    >>> rc.SinkPipeline("orders", source=rc.KafkaSource(meta), sink=rc.DeltaSink("/data/t"),
    ...                 commit_interval_s=5).start()
    """

    def __init__(
        self,
        name: str,
        source: KafkaSource,
        sink: DeltaSink,
        *,
        commit_interval_s: float = 10.0,
        write_timeout_s: float = 60.0,
        flush_max_records: int = 200_000,
        flush_max_bytes: int = 64 * 1024 * 1024,
        flush_max_age_s: float = 30.0,
        request_commit_after_flushes: int = 4,
        commit_when_caught_up: bool = False,
        spark: SparkSettings | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.config = SinkPipelineConfig(
            name=name,
            source=source,
            sink=sink,
            commit=CommitSettings(
                commit_interval_s=commit_interval_s,
                write_timeout_s=write_timeout_s,
                flush_max_records=flush_max_records,
                flush_max_bytes=flush_max_bytes,
                flush_max_age_s=flush_max_age_s,
                request_commit_after_flushes=request_commit_after_flushes,
                commit_when_caught_up=commit_when_caught_up,
            ),
            spark=spark or SparkSettings(),
            placement=placement or Placement(),
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

    def start(self, *, address: str | None = None, timeout_s: float = 300.0) -> PipelineHandle:
        """Validate, then start the writer, participants, coordinator and enumerator (which
        starts the readers); returns once every reader reads."""
        from rayconnect.actors.coordinator import CoordinatorActor
        from rayconnect.actors.enumerator import EnumeratorActor
        from rayconnect.actors.participant import start_participants
        from rayconnect.actors.writer import start_writer
        from rayconnect.spark_bridge.session import require_java

        cfg = self.config
        require_java()
        by_cluster = self.discover()
        keys = [tp.key for tps in by_cluster.values() for tp in tps]
        if not keys:
            raise ConfigError(f"pipeline {cfg.name!r}: the subscribed topics have no partitions")
        ensure_ray(address)
        cfg.placement.check()
        if _get_actor(names.coordinator(cfg.name)) is not None:
            raise PipelineError(
                f"pipeline {cfg.name!r} is already running: use rayconnect.attach({cfg.name!r})"
            )
        detached = {"namespace": names.NAMESPACE, "lifetime": "detached"}
        start_writer(
            names.writer(cfg.name),
            executors=cfg.spark.executors,
            cores=cfg.spark.executor_cores,
            memory=cfg.spark.executor_memory,
            timeout_s=timeout_s,
            placement=cfg.placement,
        )
        # The partitions known now get their participants before the first START; the
        # enumerator adds and retires partitions from then on.
        participants = start_participants(cfg, keys, cfg.source.clusters())
        ray.get([p.status.remote() for p in participants], timeout=timeout_s)
        coordinator = CoordinatorActor.options(
            name=names.coordinator(cfg.name),
            **detached,
            **cfg.placement.actor_options("coordinator"),
        ).remote(cfg, keys)
        ray.get(coordinator.ready.remote(), timeout=timeout_s)
        EnumeratorActor.options(
            name=names.enumerator(cfg.name), **detached, **cfg.placement.actor_options("enumerator")
        ).remote(cfg)
        handle = PipelineHandle(cfg.name)
        handle.wait_for(lambda s: s["readers_ready"], timeout_s=timeout_s, poll_s=0.2)
        return handle


def attach(name: str, *, address: str | None = None) -> Any:
    """A handle on a running pipeline, from any process connected to the same Ray: a
    ``PipelineHandle`` for a sink pipeline (found by its coordinator), else a
    ``SourcePipelineHandle`` for a source pipeline (found by its tasks)."""
    ensure_ray(address or "auto")
    if _get_actor(names.coordinator(name)) is not None:
        return PipelineHandle(name)
    from rayconnect.source_pipeline import attach_source, task_actor_names

    if task_actor_names(name):
        return attach_source(name, address=address)
    raise PipelineError(f"no running pipeline named {name!r}")


class PipelineHandle:
    """Watch and stop a running pipeline; holds only its name, so it survives actor restarts."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _coordinator(self) -> Any:
        actor = _get_actor(names.coordinator(self.name))
        if actor is None:
            raise PipelineError(f"pipeline {self.name!r} is not running")
        return actor

    def status(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """State, table version, committed offsets per partition, rounds, readers' lag."""
        status = ray.get(self._coordinator().status.remote(), timeout=timeout_s)
        enumerator = _get_actor(names.enumerator(self.name))
        status["discovery"] = (
            ray.get(enumerator.status.remote(), timeout=timeout_s) if enumerator else None
        )
        readers = {}
        for name in pipeline_actor_names(self.name):
            if "/reader/" in name and (actor := _get_actor(name)) is not None:
                try:
                    readers[name] = ray.get(actor.status.remote(), timeout=timeout_s)
                except Exception as e:  # a reader restarting is a state, not an error
                    readers[name] = {"error": f"{type(e).__name__}: {e}"}
        status["readers"] = readers
        expected = set((status["discovery"] or {}).get("splits_per_reader", {}))
        status["readers_ready"] = bool(expected) and all(
            names.reader_of(self.name, r) in readers
            and readers[names.reader_of(self.name, r)].get("metadata_updates", 0) > 0
            for r in expected
        )
        lag = {}
        for r in readers.values():
            for key, p in r.get("partitions", {}).items():
                hw = p.get("high_watermark")
                committed = status.get("offsets", {}).get(key)
                lag[key] = None if hw is None or committed is None else max(hw - committed, 0)
        status["lag"] = lag
        return status

    def wait_for(self, predicate, timeout_s: float = 120.0, poll_s: float = 0.5) -> dict[str, Any]:
        """Poll ``status()`` until ``predicate(status)`` holds; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                last = self.status()
                if predicate(last):
                    return last
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            time.sleep(poll_s)
        raise TimeoutError(f"pipeline {self.name!r}: condition not met in {timeout_s} s: {last}")

    def stop(self, *, commit: bool = True, timeout_s: float = 120.0) -> dict[str, Any]:
        """Commit what was read (one last round) unless ``commit=False``, then end every actor.

        Nothing is lost either way: what was not committed is read again on the next start.
        """
        final: dict[str, Any] = {}
        coordinator = _get_actor(names.coordinator(self.name))
        if coordinator is not None:
            try:
                final = ray.get(coordinator.shutdown.remote(commit), timeout=timeout_s)
            except Exception as e:
                final = {"error": f"final round not committed: {type(e).__name__}: {e}"}
        for name in pipeline_actor_names(self.name):
            actor = _get_actor(name)
            if actor is None:
                continue
            with contextlib.suppress(Exception):
                ray.get(actor.close.remote(), timeout=30)
            ray.kill(actor, no_restart=True)
        return final
