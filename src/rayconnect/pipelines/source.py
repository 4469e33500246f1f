"""``rc.SourcePipeline``: any source -> Kafka, exactly once (KIP-618), on Ray.

``start()`` does, in this order, before any task actor exists:

1. checks the settings and that the task pickles (config errors are raised here);
2. probes the target for transactions: ``exactly_once="required"`` refuses to start with the
   reason, ``"requested"`` falls back to plain produce (at-least-once) and says so in
   ``status()``;
3. creates the offsets topics if missing (the pipeline's own, and the global one);
4. **fences the old generation**: reads the task count the previous start recorded in the
   pipeline's offsets topic and runs initTransactions on every ``<group>-<pipeline>-<i>``
   for ``i < max(old count, new count)``, which aborts whatever those producers left open
   and rejects anything they try later - so no zombie, not even one of a task index that no
   longer exists, can add records or offsets once the new generation reads its offsets;
5. records the new task count (generation + 1), then starts ``<pipeline>/task/<i>``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import msgspec
import ray

from rayconnect import ray_internals
from rayconnect.actors import names
from rayconnect.actors.directory import get_actor
from rayconnect.aio import run_sync
from rayconnect.config.source import (
    ExactlyOnce,
    KafkaTarget,
    SourcePipelineConfig,
    SourceSettings,
)
from rayconnect.errors import (
    ConfigError,
    PipelineAlreadyRunningError,
    PipelineError,
    PipelineNotFoundError,
)
from rayconnect.protocol.outages import DEFAULT_GIVE_UP_AFTER_S
from rayconnect.protocol.source_status import (
    SourceLag,
    SourcePipelineStatus,
    SourceTaskReport,
    summed,
)
from rayconnect.protocol.source_task import Boundary
from rayconnect.runtime import Handle, ensure_ray, task_actor_names
from rayconnect.source_tasks.base import SourceTask

log = logging.getLogger(__name__)


class SourcePipeline:
    """Run ``tasks`` copies of ``task`` (a SourceTask instance, or a class taking no
    arguments), writing to ``target`` with records and source offsets in one transaction.

    >>> rc.SourcePipeline("files", task=rc.FileSource("/in", "lines"), tasks=2,
    ...                   target=rc.KafkaTarget("127.0.0.1:9092")).start()
    """

    def __init__(
        self,
        name: str,
        task: SourceTask | type[SourceTask],
        *,
        target: KafkaTarget,
        tasks: int = 1,
        offsets_topic: str | None = None,
        transaction_boundary: Boundary = "poll",
        transaction_boundary_interval_s: float = 1.0,
        exactly_once: ExactlyOnce = "requested",
        group: str = "rayconnect",
        commit_timeout_s: float = 30.0,
        producer_properties: dict[str, str] | None = None,
        dead_letter_topic: str | None = None,
        give_up_after_s: float | None = DEFAULT_GIVE_UP_AFTER_S,
    ) -> None:
        if not isinstance(target, KafkaTarget):
            raise ConfigError("target must be a rayconnect.KafkaTarget")
        settings = SourceSettings(
            name=name,
            target=target,
            tasks=tasks,
            offsets_topic=offsets_topic,
            transaction_boundary=transaction_boundary,
            transaction_boundary_interval_s=transaction_boundary_interval_s,
            exactly_once=exactly_once,
            group=group,
            commit_timeout_s=commit_timeout_s,
            producer_properties=dict(producer_properties or {}),
            dead_letter_topic=dead_letter_topic,
            give_up_after_s=give_up_after_s,
        )
        self._init(settings, task)

    @classmethod
    def from_settings(
        cls, settings: SourceSettings, task: SourceTask | type[SourceTask]
    ) -> SourcePipeline:
        """The pipeline of already checked settings (a pipeline file's)."""
        pipeline = cls.__new__(cls)
        pipeline._init(settings, task)
        return pipeline

    @classmethod
    def from_config(cls, config: SourcePipelineConfig) -> SourcePipeline:
        """The pipeline a ``kind: source`` file describes (builds its task)."""
        return cls.from_settings(config.settings(), config.task.build())

    def _init(self, settings: SourceSettings, task: SourceTask | type[SourceTask]) -> None:
        if isinstance(task, type) and issubclass(task, SourceTask):
            task = task()
        if not isinstance(task, SourceTask):
            raise ConfigError(f"task must be a rayconnect.SourceTask, not {type(task).__name__}")
        needs = task.transaction_boundary
        if needs is not None and settings.transaction_boundary != needs:
            raise ConfigError(
                f"transaction_boundary: {type(task).__name__} needs {needs!r}, not "
                f"{settings.transaction_boundary!r}"
            )
        self.task = task
        self.settings = settings
        try:
            from ray import cloudpickle

            cloudpickle.dumps(task)
        except Exception as e:
            raise ConfigError(f"task {task!r} cannot be sent to a Ray worker: {e}") from e

    def prepare(self) -> tuple[bool, str | None]:
        """Steps 2-5 of the module docstring, minus the actors: (transactional, warning)."""
        return run_sync(prepare_generation(self.settings))

    def start(
        self, *, address: str | None = None, timeout_s: float = 120.0
    ) -> SourcePipelineHandle:
        from rayconnect.actors.source_task import SourceTaskActor

        s = self.settings
        ensure_ray(address)
        if task_actor_names(s.name):
            raise PipelineAlreadyRunningError(
                f"source pipeline {s.name!r} is already running: use attach_source({s.name!r})"
            )
        self.task.check()
        transactional, warning = self.prepare()
        keep_task(s.name, self.task)
        detached = {"namespace": names.NAMESPACE, "lifetime": "detached"}
        actors = [
            ray_internals.actor_class(SourceTaskActor)
            .options(name=names.task(s.name, i), **detached)
            .remote(s, i, self.task, transactional, warning)
            for i in range(s.tasks)
        ]
        try:
            ray.get([a.ready.remote(timeout_s) for a in actors], timeout=timeout_s + 10)
        except Exception:
            handle = SourcePipelineHandle(s.name)
            handle.stop(timeout_s=10)
            raise
        return SourcePipelineHandle(s.name)


async def prepare_generation(settings: SourceSettings) -> tuple[bool, str | None]:
    """Probe, create the offsets topics, fence the old generation, record the new one."""
    from rayconnect.kafka.admin import create_topic
    from rayconnect.kafka.discovery import client_properties
    from rayconnect.kafka.offsets_store import (
        ensure_offsets_topic,
        read_offsets,
        task_count_key,
        task_count_value,
    )
    from rayconnect.kafka.transactions import (
        TransactionsUnsupported,
        fence,
        init_transactions,
        probe,
        producer,
        stop_quietly,
    )

    s = settings
    bootstrap = s.target.bootstrap_servers
    client = client_properties(s.target.properties)
    transactional, warning = True, None
    try:
        await probe(bootstrap, s.transactional_id(0), **client)
    except TransactionsUnsupported as e:
        reason = f"target {bootstrap} has no usable transactions: {e}"
        if s.exactly_once == "required":
            raise PipelineError(
                f"source pipeline {s.name!r}: exactly_once='required' but {reason}"
            ) from e
        transactional = False
        warning = f"exactly-once disabled (at-least-once): {reason}"
        log.warning("source pipeline %s: %s", s.name, warning)
    for topic in {s.own_offsets_topic, s.global_offsets_topic}:
        await ensure_offsets_topic(bootstrap, topic, **client)
    if s.dead_letter_topic is not None:
        await create_topic(bootstrap, s.dead_letter_topic, 1, exist_ok=True, **client)
    own = await read_offsets(bootstrap, s.own_offsets_topic, s.name, **client)
    if transactional:
        old = own.task_count or 0
        await fence(bootstrap, [s.transactional_id(i) for i in range(max(old, s.tasks))], **client)
    p = producer(bootstrap, None, **client)
    await init_transactions(p, s.commit_timeout_s)
    try:
        await p.send_and_wait(
            s.own_offsets_topic,
            task_count_value(s.tasks, own.generation + 1),
            key=task_count_key(s.name),
        )
    finally:
        await stop_quietly(p)
    return transactional, warning


def attach_source(name: str, *, address: str | None = None) -> SourcePipelineHandle:
    """A handle on a running source pipeline, from any process connected to the same Ray."""
    ensure_ray(address or "auto")
    if not task_actor_names(name):
        raise PipelineNotFoundError(f"no running source pipeline named {name!r}")
    return SourcePipelineHandle(name)


class SourcePipelineHandle(Handle):
    """Watch and stop a running source pipeline; holds only its name."""

    kind = "source pipeline"

    def status(self, timeout_s: float = 30.0) -> SourcePipelineStatus:
        """Per task: state, transactions committed/aborted, records, lag, last error, offsets."""
        tasks: dict[int, SourceTaskReport] = {}
        for actor_name in task_actor_names(self.name):
            index = int(actor_name.rsplit("/", 1)[1])
            actor = get_actor(actor_name)
            if actor is None:  # gone between the listing and now
                tasks[index] = SourceTaskReport(
                    task=index, state="unavailable", error="no such actor"
                )
                continue
            try:
                tasks[index] = ray.get(actor.status.remote(), timeout=timeout_s)
            except Exception as e:  # a task restarting is a state, not an error
                tasks[index] = SourceTaskReport(
                    task=index, state="unavailable", error=f"{type(e).__name__}: {e}"
                )
        down = [i for i, t in tasks.items() if t.state == "unavailable"]
        if down and (lag := lag_at_rest(self.name)) is not None:  # from the source itself
            for i in down:
                tasks[i] = msgspec.structs.replace(tasks[i], lag=lag)
        return summed(self.name, tasks)

    def snapshot(self, tables: list[str]) -> None:
        """Snapshot ``tables`` again while the stream flows, exactly once, without a stop
        (a Postgres source: watermarked chunks, ``rayconnect snapshot``; the request is in
        the source itself - the WAL - so it survives the task's restarts). ConfigError if
        the source cannot or a table is not captured."""
        task = kept_task(self.name)
        if task is None:
            raise PipelineNotFoundError(f"no running source pipeline named {self.name!r}")
        task.request_snapshot(list(tables))

    def stop(
        self, *, timeout_s: float = 60.0, release: bool = False
    ) -> dict[str, SourceTaskReport]:
        """Each task commits its open transaction (``connector``: aborts it), then ends.
        ``release``: then free what the source keeps for the pipeline (a Postgres source
        drops its replication slot; SourceTask.release) - for a pipeline deleted for good."""
        actors = [(n, a) for n in task_actor_names(self.name) if (a := get_actor(n)) is not None]
        refs = {n: a.close.remote(timeout_s) for n, a in actors}
        final: dict[str, SourceTaskReport] = {}
        for n, ref in refs.items():
            try:
                final[n] = ray.get(ref, timeout=timeout_s + 5)
            except Exception as e:
                index = int(n.rsplit("/", 1)[1])
                error = f"{type(e).__name__}: {e}"
                final[n] = SourceTaskReport(task=index, state="unavailable", error=error)
        if release and actors:
            _release(self.name, actors[0][1], timeout_s)
        for _, a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        with contextlib.suppress(Exception):
            ray_internals.kv_del(_task_key(self.name), namespace=names.NAMESPACE)
        _wait_gone(self.name, 10.0)
        return final


#: how long status waits for a down task's source to say its lag
LAG_AT_REST_TIMEOUT_S = 5.0


def _task_key(pipeline: str) -> bytes:
    return f"{pipeline}/source-task".encode()


def keep_task(pipeline: str, task: SourceTask) -> None:
    """Keep the pipeline's task (pickled, as its actors get it; no secret is in it) in
    Ray's key-value store, so status can ask its source for the lag while no task actor
    answers (``lag_at_rest``)."""
    from ray import cloudpickle

    with contextlib.suppress(Exception):
        ray_internals.kv_put(_task_key(pipeline), cloudpickle.dumps(task), namespace=names.NAMESPACE)


def kept_task(pipeline: str) -> SourceTask | None:
    """The pipeline's task as ``keep_task`` kept it (None: not kept)."""
    from ray import cloudpickle

    kept = ray_internals.kv_get(_task_key(pipeline), namespace=names.NAMESPACE)
    return cloudpickle.loads(kept) if kept else None


def lag_at_rest(pipeline: str) -> SourceLag | None:
    """The source's own count of the pipeline's lag (``SourceTask.lag_at_rest``), asked
    from here: for a task that does not answer (restarting, down). None when it cannot
    tell within ``LAG_AT_REST_TIMEOUT_S`` (or the task cannot be loaded in this process)."""
    import concurrent.futures

    try:
        task = kept_task(pipeline)
    except Exception:
        return None
    if task is None:
        return None
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(task.lag_at_rest).result(timeout=LAG_AT_REST_TIMEOUT_S)
    except Exception:
        return None
    finally:
        pool.shutdown(wait=False)


def _release(pipeline: str, actor: Any, timeout_s: float) -> None:
    """Task 0's ``release``, again while its actor is restarting (a task that failed just
    before the stop): the source's resources outlive any incarnation."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.release.remote(timeout_s), timeout=timeout_s + 10)
            return
        except ray.exceptions.ActorUnavailableError as e:
            if time.monotonic() > deadline:
                raise PipelineError(f"{pipeline}: release failed: {e}") from e
            time.sleep(0.5)
        except Exception as e:
            raise PipelineError(f"{pipeline}: release failed: {type(e).__name__}: {e}") from e


def _wait_gone(pipeline: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while task_actor_names(pipeline) and time.monotonic() < deadline:
        time.sleep(0.1)


__all__ = ["SourcePipeline", "SourcePipelineHandle", "attach_source", "prepare_generation"]
