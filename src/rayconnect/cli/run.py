"""``rayconnect run FILE``: start a pipeline from a pipeline file; watch it or detach.

In the foreground it prints one progress line every ``--interval`` seconds (records committed,
rate, lag, last round) and, on Ctrl-C or SIGTERM, stops the pipeline cleanly: one last round
commits what was read, then every actor ends. If the pipeline is stopped from elsewhere
(``rayconnect stop NAME``), ``run`` notices and exits 0. If the pipeline gives up on an
outage (``give_up_after_s``), ``run`` prints the reason, stops it and exits 5.

``--embedded-broker`` runs the file against local tansu brokers instead of the addresses in
it: one broker per cluster id, the file's topics created (``--partitions``) and filled with
``--demo-records`` demo records, and ``--demo-rate`` more per second while it runs. The brokers
live in this process, so it cannot be combined with ``--detach``.

``--embedded-s3`` (sink pipelines) starts a local S3 (SeaweedFS, ``storage.EmbeddedS3``) in
this process and moves the table onto it (see ``_on_embedded_s3``); it prints the store's
endpoint, keys and a read command, and it stops - removing the store and the table - after
the last round, so it cannot be combined with ``--detach`` either.

A source pipeline (``kind: source``) runs the same way: progress lines count transactions
committed/aborted and records committed; Ctrl-C/SIGTERM makes every task commit its open
transaction (``connector`` boundaries: abort it), then the tasks end. With
``--embedded-broker`` one broker stands in for ``target`` and the task's topic is created;
no demo records are produced (the source makes the records).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from rayconnect.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_OK,
    EXIT_USAGE,
    exit_code,
)
from rayconnect.cli.stop_signals import stop_signals
from rayconnect.errors import (
    ConfigError,
    DiscoveryError,
    PipelineAlreadyRunningError,
    PipelineNotFoundError,
    RayconnectError,
    RayUnavailableError,
)
from rayconnect.protocol.source_status import SourcePipelineStatus
from rayconnect.protocol.status import PipelineStatus
from rayconnect.runtime import check_ray, check_reachable, ensure_ray


def _with_brokers(config, bootstraps: dict[str, str]):
    """``config`` with every cluster's bootstrap address replaced (embedded brokers)."""
    import msgspec

    from rayconnect.metadata.static import StaticMetadataService
    from rayconnect.protocol.types import ClusterMetadata, KafkaStream

    streams = tuple(
        KafkaStream(
            s.stream_id,
            {
                cid: ClusterMetadata(bootstraps[cid], meta.topics, meta.properties)
                for cid, meta in s.clusters.items()
            },
        )
        for s in config.source.metadata.streams
    )
    source = msgspec.structs.replace(config.source, metadata=StaticMetadataService(streams))
    return msgspec.structs.replace(config, source=source)


EMBEDDED_BUCKET = "rayconnect"


def _embedded_s3_table(config):
    """Where ``--embedded-s3`` puts the table: the file's bucket and key if its sink.path is
    already ``s3://``, else ``s3://rayconnect/<last part of the path>``."""
    from rayconnect.storage.location import TableLocation

    location = config.sink.location()
    if location.store != "s3":
        name = location.uri.rstrip("/").rsplit("/", 1)[-1]
        location = TableLocation.parse(f"s3://{EMBEDDED_BUCKET}/{name}")
    return location


def _on_embedded_s3(config, location, s3):
    """``config`` with its table at ``location`` on the embedded S3, with the store's
    endpoint and credentials as storage options."""
    import msgspec

    sink = msgspec.structs.replace(
        config.sink, path=location.uri, storage_options=s3.storage_options
    )
    return msgspec.structs.replace(config, sink=sink)


class _Producer:
    """Demo records into every topic of the embedded brokers: a first batch, then a rate."""

    def __init__(self, topics: dict[str, tuple[str, ...]], partitions: int) -> None:
        self.topics, self.partitions = topics, partitions  # bootstrap -> topics
        self.produced = 0

    def create(self) -> None:
        from rayconnect.kafka.admin import create_topic

        for bootstrap, topics in self.topics.items():
            for topic in topics:
                asyncio.run(create_topic(bootstrap, topic, self.partitions, exist_ok=True))

    def produce(self, n: int) -> None:
        from rayconnect.kafka.admin import produce_demo_records

        if n <= 0:
            return
        for bootstrap, topics in self.topics.items():
            for topic in topics:
                asyncio.run(
                    produce_demo_records(
                        bootstrap, topic, n, self.partitions, start_index=self.produced
                    )
                )
        self.produced += n


def _summary(status: PipelineStatus) -> tuple[int, int | None]:
    committed = sum(status.offsets.values())
    lags = [v for v in status.lag.values() if v is not None]
    return committed, (sum(lags) if lags else None)


def _err(message: str) -> None:
    print(f"rayconnect: {message}", file=sys.stderr, flush=True)


def _failed(error: RayconnectError, file: str) -> int:
    """Say why ``run`` could not start (configuration errors name the file) and exit with
    the code of the error's type."""
    if isinstance(error, RayUnavailableError):
        _err(f"cannot reach Ray: {error}")
    elif isinstance(error, ConfigError | DiscoveryError):
        _err(f"{file}: {error}")
    else:
        _err(str(error))
    return exit_code(error)


def run_command(args) -> int:
    from rayconnect.cli.pipeline_file import load_pipeline_file
    from rayconnect.config.mirror import MirrorConfig
    from rayconnect.config.sink import SinkPipelineConfig
    from rayconnect.config.source import SourcePipelineConfig
    from rayconnect.errors import ConfigError
    from rayconnect.pipelines.sink import SinkPipeline, check_sink

    err = _err
    try:
        config = load_pipeline_file(args.file)
    except ConfigError as e:
        err(str(e))  # names the file, line and field itself
        return exit_code(e)
    if args.embedded_broker and args.detach:
        err("--embedded-broker cannot be combined with --detach: the brokers live in this process")
        return EXIT_USAGE
    if getattr(args, "embedded_s3", False):
        if args.detach:
            err("--embedded-s3 cannot be combined with --detach: the store lives in this process")
            return EXIT_USAGE
        if not isinstance(config, SinkPipelineConfig):
            err("--embedded-s3 is for sink pipelines (kind: sink): it holds the sink's table")
            return EXIT_USAGE
    if isinstance(config, SourcePipelineConfig):
        return run_source(config, args)
    if isinstance(config, MirrorConfig):
        from rayconnect.cli.mirror import run_mirror

        if args.embedded_broker:  # a mirror without kafka: has an embedded broker already
            err(f"{args.file}: a mirror without kafka: runs an embedded broker by itself")
            return EXIT_USAGE
        return run_mirror(config, args, args.file)
    if not isinstance(config, SinkPipelineConfig):
        err(f"{args.file}: kind {type(config).__name__} cannot be run by this version yet")
        return EXIT_USAGE

    with contextlib.ExitStack() as stack:
        producer = None
        if args.embedded_broker:
            from rayconnect.kafka.embedded import EmbeddedBroker

            clusters = config.source.clusters()
            bootstraps = {}
            for cid in clusters:
                broker = stack.enter_context(EmbeddedBroker(cid, own_session=True))
                bootstraps[cid] = broker.bootstrap_servers
                print(f"embedded broker {cid!r} at {broker.bootstrap_servers}", flush=True)
            config = _with_brokers(config, bootstraps)
            producer = _Producer(
                {bootstraps[cid]: meta.topics for cid, meta in clusters.items()}, args.partitions
            )
            producer.create()
            producer.produce(args.demo_records)
            print(f"produced {args.demo_records:,} demo records into each topic", flush=True)
        if getattr(args, "embedded_s3", False):
            from rayconnect.storage.embedded_s3 import EmbeddedS3

            table = _embedded_s3_table(config)
            s3 = stack.enter_context(EmbeddedS3(buckets=[table.bucket]))
            config = _on_embedded_s3(config, table, s3)
            from rayconnect.cli.embedded_s3_notice import embedded_s3_notice
            from rayconnect.config.sink import DeltaSink

            delta = isinstance(config.sink, DeltaSink)
            print("\n".join(embedded_s3_notice(s3, config.sink.path, delta)), flush=True)

        print(f"starting pipeline {config.name!r} from {args.file} ...", flush=True)
        started = time.monotonic()
        try:
            check_sink(config.sink)  # before Ray starts; start() checks again (milliseconds)
            check_ray(args.address)
            ensure_ray(args.address, own_session=True)
            handle = SinkPipeline.from_config(config).start(address=args.address)
        except RayconnectError as e:
            return _failed(e, args.file)
        print(
            f"pipeline {config.name!r} running ({time.monotonic() - started:.0f} s to start); "
            f"table {config.sink.path}",
            flush=True,
        )
        if args.detach:
            return _detached(config.name)
        return _foreground(handle, args, producer)
    return EXIT_FAILED  # pragma: no cover - unreachable


def _detached(name: str) -> int:
    print(
        f"detached: watch it with `rayconnect status {name} --watch`, "
        f"stop it with `rayconnect stop {name}`",
        flush=True,
    )
    return EXIT_OK


def _foreground(handle, args, producer) -> int:
    with stop_signals() as stop_requested:
        return _sink_loop(handle, args, producer, stop_requested)


def _sink_loop(handle, args, producer, stop_requested: list[str]) -> int:
    first: int | None = None
    last_t, last_committed = time.monotonic(), 0
    problems: set[tuple[str, str]] = set()  # (partition, state) said last
    try:
        while not stop_requested:
            t0 = time.monotonic()
            if producer is not None and args.demo_rate:
                producer.produce(int(args.demo_rate * args.interval))
            try:
                status = handle.status()
            except PipelineNotFoundError:
                print(f"pipeline {handle.name!r} was stopped", flush=True)
                return EXIT_OK
            except Exception as e:  # an actor restarting: say so, keep watching
                print(
                    f"{time.strftime('%H:%M:%S')} status unavailable: {type(e).__name__}",
                    flush=True,
                )
                status = None
            if status is not None and status.gave_up:
                return _gave_up(handle, status.gave_up, lambda: handle.stop(commit=False))
            if status is not None:
                committed, lag = _summary(status)
                if first is None:
                    first, last_committed = committed, committed
                now = time.monotonic()
                rate = (committed - last_committed) / max(now - last_t, 1e-9)
                last_t, last_committed = now, committed
                dur = status.last_round_duration_s
                rounds = status.rounds_since_start
                print(
                    f"{time.strftime('%H:%M:%S')} {handle.name}: committed {committed - first:,} "
                    f"records ({rate:,.0f}/s), lag {'-' if lag is None else f'{lag:,}'}, "
                    f"round {status.txn_id} "
                    f"({'-' if dur is None else f'{dur:.1f} s'}), "
                    f"rounds {rounds.committed} committed / "
                    f"{rounds.discarded} discarded, "
                    f"table v{status.table_version}",
                    flush=True,
                )
                # partitions not ok (stalled, no cut markers...): said when they change
                parts = status.partition_status.items()
                said = {(k, p.state) for k, p in parts if p.state != "ok"}
                if said != problems:
                    for line in status.partition_problems():
                        print(f"  {line}", flush=True)
                    problems = said
            time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
        print(f"{stop_requested[0]}: committing what was read, then stopping...", flush=True)
        result = handle.stop(commit=True)
        if result.error or result.final is None:
            print(f"rayconnect: {result.error}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        print(
            f"stopped {handle.name}: table version {result.final.table_version}, "
            f"committed offsets {sum(result.final.offsets.values()):,} records in total",
            flush=True,
        )
        return EXIT_OK
    except KeyboardInterrupt:
        print("interrupted again: stopping without a last round", flush=True)
        handle.stop(commit=False)
        return EXIT_FAILED


def _gave_up(handle, reason: str, stop) -> int:
    """The pipeline gave up on an outage: say why, stop it, exit 5."""
    _err(f"{handle.name}: {reason}")
    print(
        f"pipeline {handle.name!r} gave up; stopping it (nothing is lost: a new run "
        "resumes where it committed)",
        flush=True,
    )
    with contextlib.suppress(Exception):
        stop()
    return EXIT_GAVE_UP


# -- source pipelines (kind: source) ----------------------------------------------------------


def check_target(bootstrap_servers: str, timeout_s: float = 3.0) -> None:
    """Raise DiscoveryError unless one of the ``host:port`` bootstrap servers accepts."""
    problems = []
    for server in (s.strip() for s in bootstrap_servers.split(",")):
        try:
            check_reachable(server, timeout_s)
            return
        except ConnectionError as e:
            problems.append(str(e))
    raise DiscoveryError(
        "Kafka unreachable: "
        + ("; ".join(problems) or f"no bootstrap server in {bootstrap_servers!r}")
    )


def _with_target(config, bootstrap_servers: str):
    import msgspec

    target = msgspec.structs.replace(config.target, bootstrap_servers=bootstrap_servers)
    return msgspec.structs.replace(config, target=target)


def start_source(config, address: str | None = None):
    """Start the source pipeline of a ``kind: source`` file; the handle. What ``run`` does
    between reading the file and watching: build the task (ConfigError), refuse a name that
    runs already (PipelineAlreadyRunningError), then ``rc.SourcePipeline.start``."""
    from rayconnect.actors import names
    from rayconnect.actors.directory import get_actor
    from rayconnect.pipelines.source import SourcePipeline
    from rayconnect.runtime import task_actor_names

    pipeline = SourcePipeline.from_config(config)  # imports and builds the task: before Ray
    pipeline.task.check()  # the source reachable and usable (ConfigError naming the setting)
    check_ray(address)
    ensure_ray(address, own_session=True)
    if get_actor(names.coordinator(config.name)) is not None or task_actor_names(config.name):
        raise PipelineAlreadyRunningError(
            f"pipeline {config.name!r} is already running: see `rayconnect status {config.name}`"
        )
    return pipeline.start(address=address)


def run_source(config, args) -> int:
    err = _err
    with contextlib.ExitStack() as stack:
        if args.embedded_broker:
            from rayconnect.kafka.admin import create_topic
            from rayconnect.kafka.embedded import EmbeddedBroker

            broker = stack.enter_context(EmbeddedBroker("target", own_session=True))
            config = _with_target(config, broker.bootstrap_servers)
            print(f"embedded broker 'target' at {broker.bootstrap_servers}", flush=True)
            for topic in () if config.task.makes_topics else config.task.topics():
                asyncio.run(
                    create_topic(broker.bootstrap_servers, topic, args.partitions, exist_ok=True)
                )
                print(f"created topic {topic!r} ({args.partitions} partitions)", flush=True)
        try:
            check_target(config.target.bootstrap_servers)
        except DiscoveryError as e:
            err(f"{args.file}: $.target.bootstrap_servers: {e}")
            return exit_code(e)

        print(f"starting source pipeline {config.name!r} from {args.file} ...", flush=True)
        started = time.monotonic()
        try:
            handle = start_source(config, args.address)
        except ConfigError as e:
            err(f"{args.file}: $.task: {e}")
            return exit_code(e)
        except RayconnectError as e:
            return _failed(e, args.file)
        except Exception as e:  # the target refused: topics, transactions, authentication
            err(
                f"{args.file}: cannot start on target {config.target.bootstrap_servers}: "
                f"{type(e).__name__}: {e}"
            )
            return EXIT_USAGE
        status = _source_status_or_none(handle)
        warnings = "; ".join(status.warnings if status is not None else ())
        print(
            f"source pipeline {config.name!r} running ({time.monotonic() - started:.0f} s to "
            f"start): {config.tasks} task(s) -> {', '.join(config.task.topics()) or 'Kafka'} "
            f"at {config.target.bootstrap_servers}" + (f"; {warnings}" if warnings else ""),
            flush=True,
        )
        if args.detach:
            return _detached(config.name)
        with stop_signals() as stop_requested:
            return source_loop(handle, args.interval, stop_requested)
    return EXIT_FAILED  # pragma: no cover - unreachable


def _source_status_or_none(handle) -> SourcePipelineStatus | None:
    try:
        return handle.status()
    except Exception:
        return None


def source_progress(name: str, status: dict[str, Any], rate: float) -> str:
    """One progress line of a running source pipeline."""
    tasks = status.get("tasks") or {}
    states = sorted({str(t.get("state")) for t in tasks.values()})
    line = (
        f"{time.strftime('%H:%M:%S')} {name}: {len(tasks)} task(s) {'/'.join(states) or '-'}, "
        f"transactions {status.get('transactions_committed', 0):,} committed / "
        f"{status.get('transactions_aborted', 0):,} aborted, "
        f"records {status.get('records_committed', 0):,} committed ({rate:,.0f}/s)"
    )
    errors = sorted({str(t["last_error"]) for t in tasks.values() if t.get("last_error")})
    if errors:
        line += f", last error: {errors[-1]}"
    return line


def source_loop(handle, interval: float, stop_requested: list[str]) -> int:
    """Print progress every ``interval`` s until ``stop_requested`` fills (a signal), then
    stop the pipeline: every task commits its open transaction and ends."""
    from rayconnect.redact import redact

    last_t, last_records = time.monotonic(), None
    seen: dict[str, Any] = {}
    try:
        while not stop_requested:
            t0 = time.monotonic()
            status = _source_status_or_none(handle)
            if status is not None and not status.tasks:
                print(f"pipeline {handle.name!r} was stopped", flush=True)
                return EXIT_OK
            if status is None:  # Ray busy, an actor restarting: say so, keep watching
                print(f"{time.strftime('%H:%M:%S')} status unavailable", flush=True)
            else:
                status = seen = redact(status)
                gave_up = [t["gave_up"] for t in status["tasks"].values() if t.get("gave_up")]
                if gave_up:
                    return _gave_up(handle, gave_up[0], lambda: handle.stop(timeout_s=30))
                records = status.get("records_committed", 0)
                now = time.monotonic()
                rate = (
                    0.0
                    if last_records is None
                    else (records - last_records) / max(now - last_t, 1e-9)
                )
                last_t, last_records = now, records
                print(source_progress(handle.name, status, rate), flush=True)
            while not stop_requested and time.monotonic() - t0 < interval:
                time.sleep(min(0.2, interval))
        print(f"{stop_requested[0]}: committing open transactions, then stopping...", flush=True)
        final = redact(handle.stop())
        failed = {n: f["error"] for n, f in final.items() if isinstance(f, dict) and f.get("error")}
        for n, e in failed.items():
            _err(f"{n}: {e}")
        if failed:  # the tasks' final counts are unknown: say what was last seen
            print(
                f"stopped {handle.name}: {len(failed)} of {len(final)} task(s) did not report; "
                f"last seen {seen.get('records_committed', 0):,} records in "
                f"{seen.get('transactions_committed', 0):,} transactions committed",
                flush=True,
            )
            return EXIT_FAILED
        print(
            f"stopped {handle.name}: {len(final)} task(s), "
            f"{sum(f.get('records_committed', 0) for f in final.values()):,} records in "
            f"{sum(f.get('transactions_committed', 0) for f in final.values()):,} "
            "transactions committed",
            flush=True,
        )
        return EXIT_OK
    except KeyboardInterrupt:
        print("interrupted again: stopping without committing open transactions", flush=True)
        kill_source(handle.name)
        return EXIT_FAILED


def kill_source(name: str) -> None:
    """End a source pipeline's tasks at once: open transactions are not committed (the next
    start fences and aborts them; read_committed consumers never see them)."""
    import ray

    from rayconnect.actors.directory import get_actor
    from rayconnect.runtime import task_actor_names

    for actor_name in task_actor_names(name):
        actor = get_actor(actor_name)
        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
