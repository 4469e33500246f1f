"""``rayconnect run FILE``: start a pipeline from a pipeline file; watch it or detach.

In the foreground it prints one progress line every ``--interval`` seconds (records committed,
rate, lag, last round) and, on Ctrl-C or SIGTERM, stops the pipeline cleanly: one last round
commits what was read, then every actor ends. If the pipeline is stopped from elsewhere
(``rayconnect stop NAME``), ``run`` notices and exits 0.

``--embedded-broker`` runs the file against local tansu brokers instead of the addresses in
it: one broker per cluster id, the file's topics created (``--partitions``) and filled with
``--demo-records`` demo records, and ``--demo-rate`` more per second while it runs. The brokers
live in this process, so it cannot be combined with ``--detach``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from typing import Any

from rayconnect.commands import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REQUIREMENT,
    EXIT_USAGE,
    check_reachable,
)


def _with_brokers(config, bootstraps: dict[str, str]):
    """``config`` with every cluster's bootstrap address replaced (embedded brokers)."""
    import msgspec

    from rayconnect.config import StaticMetadataService
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


def _summary(status: dict[str, Any]) -> tuple[int, int | None]:
    committed = sum((status.get("offsets") or {}).values())
    lags = [v for v in (status.get("lag") or {}).values() if v is not None]
    return committed, (sum(lags) if lags else None)


def run_command(args) -> int:
    from rayconnect.api import PipelineError, SinkPipeline
    from rayconnect.config import ConfigError, SinkPipelineConfig
    from rayconnect.kafka.discovery import DiscoveryError
    from rayconnect.pipeline_file import load_pipeline_file
    from rayconnect.spark_bridge.session import JavaNotFoundError

    def err(message: str) -> None:
        print(f"rayconnect: {message}", file=sys.stderr, flush=True)

    try:
        config = load_pipeline_file(args.file)
    except ConfigError as e:
        err(str(e))
        return EXIT_USAGE
    if not isinstance(config, SinkPipelineConfig):
        err(f"{args.file}: kind {type(config).__name__} cannot be run by this version yet")
        return EXIT_USAGE
    if args.embedded_broker and args.detach:
        err("--embedded-broker cannot be combined with --detach: the brokers live in this process")
        return EXIT_USAGE

    with contextlib.ExitStack() as stack:
        producer = None
        if args.embedded_broker:
            from rayconnect.kafka.embedded import EmbeddedBroker

            clusters = config.source.clusters()
            bootstraps = {}
            for cid in clusters:
                broker = stack.enter_context(EmbeddedBroker(cid))
                bootstraps[cid] = broker.bootstrap_servers
                print(f"embedded broker {cid!r} at {broker.bootstrap_servers}", flush=True)
            config = _with_brokers(config, bootstraps)
            producer = _Producer(
                {bootstraps[cid]: meta.topics for cid, meta in clusters.items()}, args.partitions
            )
            producer.create()
            producer.produce(args.demo_records)
            print(f"produced {args.demo_records:,} demo records into each topic", flush=True)

        print(f"starting pipeline {config.name!r} from {args.file} ...", flush=True)
        started = time.monotonic()
        try:
            check_reachable(args.address)
            handle = SinkPipeline.from_config(config).start(address=args.address)
        except JavaNotFoundError as e:
            err(str(e))
            return EXIT_REQUIREMENT
        except (ConfigError, DiscoveryError) as e:
            err(f"{args.file}: {e}")
            return EXIT_USAGE
        except PipelineError as e:
            err(str(e))
            return EXIT_NOT_FOUND
        except ConnectionError as e:
            err(f"cannot reach Ray at {args.address}: {e}")
            return EXIT_REQUIREMENT
        print(
            f"pipeline {config.name!r} running ({time.monotonic() - started:.0f} s to start); "
            f"table {config.sink.path}",
            flush=True,
        )
        if args.detach:
            print(
                f"detached: watch it with `rayconnect status {config.name} --watch`, "
                f"stop it with `rayconnect stop {config.name}`",
                flush=True,
            )
            return EXIT_OK
        return _foreground(handle, args, producer)
    return EXIT_FAILED  # pragma: no cover - unreachable


def _foreground(handle, args, producer) -> int:
    from rayconnect.api import PipelineError

    stop_requested: list[str] = []

    def on_signal(signum, _frame) -> None:
        if stop_requested:  # a second signal: stop without the last round
            raise KeyboardInterrupt
        stop_requested.append(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    first: int | None = None
    last_t, last_committed = time.monotonic(), 0
    try:
        while not stop_requested:
            t0 = time.monotonic()
            if producer is not None and args.demo_rate:
                producer.produce(int(args.demo_rate * args.interval))
            try:
                status = handle.status()
            except PipelineError:
                print(f"pipeline {handle.name!r} was stopped", flush=True)
                return EXIT_OK
            except Exception as e:  # an actor restarting: say so, keep watching
                print(
                    f"{time.strftime('%H:%M:%S')} status unavailable: {type(e).__name__}",
                    flush=True,
                )
                status = None
            if status is not None:
                committed, lag = _summary(status)
                if first is None:
                    first, last_committed = committed, committed
                now = time.monotonic()
                rate = (committed - last_committed) / max(now - last_t, 1e-9)
                last_t, last_committed = now, committed
                dur = status.get("last_round_duration_s")
                print(
                    f"{time.strftime('%H:%M:%S')} {handle.name}: committed {committed - first:,} "
                    f"records ({rate:,.0f}/s), lag {'-' if lag is None else f'{lag:,}'}, "
                    f"round {status.get('txn_id')} "
                    f"({'-' if dur is None else f'{dur:.1f} s'}), "
                    f"rounds {status.get('rounds_committed')} committed / "
                    f"{status.get('rounds_discarded')} discarded, "
                    f"table v{status.get('table_version')}",
                    flush=True,
                )
            time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
        print(f"{stop_requested[0]}: committing what was read, then stopping...", flush=True)
        final = handle.stop(commit=True)
        if final.get("error"):
            print(f"rayconnect: {final['error']}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        print(
            f"stopped {handle.name}: table version {final.get('table_version')}, "
            f"committed offsets {sum((final.get('offsets') or {}).values()):,} records in total",
            flush=True,
        )
        return EXIT_OK
    except KeyboardInterrupt:
        print("interrupted again: stopping without a last round", flush=True)
        handle.stop(commit=False)
        return EXIT_FAILED
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
