"""The ``rayconnect`` argument parser and ``main``: which command runs, with what exit code."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rayconnect.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REQUIREMENT,
    EXIT_USAGE,
    exit_code,
)


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rayconnect",
        description="Exactly-once pipelines between Kafka and Delta tables, on Ray.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="a live sink pipeline on embedded parts, with actor kills, verified exactly once",
        description=(
            "Starts an embedded Kafka-protocol broker (tansu), a producer writing demo records "
            "at --rate per second, and a sink pipeline (coordinator, participants, readers, "
            "Spark-on-Ray writer) committing a round every --interval seconds into a Delta "
            "table, with a live line per second. Midway it kills the coordinator, the "
            "participant host and the writer (--no-chaos: not). At the end it stops the producer, "
            "lets the pipeline catch up, stops it and verifies the table: exit 0 only if it "
            "holds every produced record exactly once and its committed offsets equal the "
            "high watermarks."
        ),
    )
    demo.add_argument(
        "--records",
        type=_positive,
        default=None,
        help="records to produce (default 40000; --database: changes, default 15000)",
    )
    demo.add_argument(
        "--rate",
        type=_positive,
        default=None,
        help="records produced per second (default 2000; --database: changes/s, default 500)",
    )
    demo.add_argument("--partitions", type=_positive, default=4, help="default 4")
    demo.add_argument(
        "--interval", type=_interval, default=2.0, help="seconds between rounds (default 2)"
    )
    demo.add_argument(
        "--no-chaos", dest="chaos", action="store_false", help="do not kill actors midway"
    )
    demo.add_argument(
        "--table", default=None, help="new folder for the Delta table (default: a temp folder)"
    )
    demo.add_argument(
        "--spark-start",
        choices=("when_needed", "with_pipeline"),
        default=None,
        help="spark.start of the demo's pipeline (default: the default, when_needed: at the "
        "demo's rate the writer's process writes every round itself; with_pipeline: Spark's "
        "executors write from the first seconds)",
    )
    demo.add_argument(
        "--source",
        action="store_true",
        help="a source pipeline instead (generator -> Kafka, KIP-618): two tasks, killed midway "
        "unless --no-chaos; exit 0 only if read_committed shows every record once, in order",
    )
    demo.add_argument(
        "--database",
        action="store_true",
        help="a database mirrored instead: a throwaway PostgreSQL (installed on this machine) "
        "with --tables shop tables under a write load -> source pipeline -> Kafka -> one sink "
        "pipeline -> a Delta upsert table per table (under --table), lag per table live, the "
        "source task and the sink coordinator killed unless --no-chaos; exit 0 only if every "
        "lake table equals SELECT * of its Postgres table",
    )
    demo.add_argument(
        "--tables", type=_positive, default=8, help="--database: shop tables, 1-20 (default 8)"
    )
    _add_pipeline_commands(sub)
    _add_mirror_command(sub)
    return parser


def _interval(value: str) -> float:
    v = float(value)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return v


def _non_negative(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return n


def _address(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to use: host:port of its GCS, or 'auto' (default: the job's cluster "
        "under ray job submit, else the local one)",
    )


def _add_pipeline_commands(sub) -> None:
    run = sub.add_parser(
        "run",
        help="start a pipeline from a pipeline file; show progress until Ctrl-C",
        description=(
            "Validates FILE (errors name file, line and field; nothing starts on an error), "
            "checks Java and every Kafka cluster and topic, then starts the pipeline's named, "
            "detached actors. In the foreground it prints a progress line every --interval "
            "seconds; Ctrl-C or SIGTERM commits what was read in one last round and stops "
            "every actor (a second Ctrl-C stops without it). A source pipeline (kind: source) "
            "shows transactions committed/aborted and records; on Ctrl-C each task commits "
            "its open transaction. If the pipeline is stopped from "
            "elsewhere (rayconnect stop), run exits 0. ${VAR} in FILE is read from the "
            "environment."
        ),
    )
    run.add_argument(
        "file", metavar="FILE", help="pipeline file (YAML), e.g. examples/orders-sink.yaml"
    )
    _address(run)
    run.add_argument(
        "--detach", action="store_true", help="return once the pipeline runs; it keeps running"
    )
    run.add_argument(
        "--interval", type=_interval, default=2.0, help="seconds between progress lines (default 2)"
    )
    embedded = run.add_argument_group(
        "embedded broker (try a pipeline file without Kafka; single machine)"
    )
    embedded.add_argument(
        "--embedded-broker",
        action="store_true",
        help="start a local tansu broker per cluster of FILE instead of its bootstrap_servers, "
        "create FILE's topics and produce demo records into them (kind: source: one broker "
        "for the target, the task's topic created, no demo records)",
    )
    embedded.add_argument(
        "--embedded-s3",
        action="store_true",
        help="start a local S3 (SeaweedFS) and put the sink table on it: s3://BUCKET/NAME "
        "(FILE's bucket if sink.path is s3://, else 'rayconnect'; NAME the path's last part), "
        "with the store's endpoint and credentials as storage_options",
    )
    embedded.add_argument(
        "--partitions",
        type=_positive,
        default=4,
        help="partitions per topic (default 4; a Postgres source makes its own topics "
        "with its topic_partitions)",
    )
    embedded.add_argument(
        "--demo-records",
        type=_non_negative,
        default=10_000,
        help="records produced before start (default 10000)",
    )
    embedded.add_argument(
        "--demo-rate",
        type=_non_negative,
        default=0,
        help="records/s produced while running (default 0)",
    )

    lst = sub.add_parser(
        "list",
        help="list the pipelines running in the Ray cluster",
        description=(
            "One line per pipeline: name, kind (sink/source), state, actors, partitions "
            "(source: source partitions with committed offsets), table (source: -)."
        ),
    )
    _address(lst)
    lst.add_argument("--json", action="store_true", help="print JSON")

    status = sub.add_parser(
        "status",
        help="a pipeline's partitions, rounds and actors",
        description=(
            "Per partition: committed offset (in the table), high watermark and lag; the "
            "current round, the last round's duration, rounds committed/partial/discarded/"
            "empty; every actor with its state, pid and restarts. A source pipeline: per "
            "task its state, transactions committed/aborted, records, last error. "
            "Credentials are masked. Exit 4 if no pipeline NAME runs."
        ),
    )
    status.add_argument("name", metavar="NAME")
    _address(status)
    status.add_argument(
        "--watch", action="store_true", help="refresh every --interval seconds until Ctrl-C"
    )
    status.add_argument(
        "--interval", type=_interval, default=2.0, help="seconds between refreshes (default 2)"
    )
    status.add_argument(
        "--json", action="store_true", help="print JSON (one line per refresh with --watch)"
    )

    snap = sub.add_parser(
        "snapshot",
        help="snapshot tables of a running Postgres source pipeline (or mirror) again",
        description=(
            "Asks the running source to read TABLE... again while its stream flows "
            "(watermarked chunks: a snapshot row never overwrites a newer change; exactly "
            "once). The request is written into the database's WAL, so it holds through "
            "restarts of the task. Exit 2 for a table not captured or without a primary "
            "key; 4 if no pipeline NAME runs."
        ),
    )
    snap.add_argument("name", metavar="NAME")
    snap.add_argument("tables", metavar="TABLE", nargs="+", help="schema.table, or table (public)")
    _address(snap)

    stop = sub.add_parser(
        "stop",
        help="commit one last round, then end every actor of a pipeline",
        description=(
            "Ends the open round early and commits it, then ends every actor (a source "
            "pipeline: every task commits its open transaction, then ends). Nothing is lost "
            "either way: what was not committed is read again on the next run. Exit 4 if no "
            "pipeline NAME runs."
        ),
    )
    stop.add_argument("name", metavar="NAME")
    _address(stop)
    stop.add_argument(
        "--no-commit", dest="commit", action="store_false", help="stop without the last round"
    )
    stop.add_argument(
        "--drop-slot",
        dest="release",
        action="store_true",
        help=(
            "a source pipeline (or mirror) deleted for good: once its tasks stopped, free what "
            "its source keeps for it (a postgres source drops its replication slot, so Postgres "
            "stops keeping WAL for it, and a mirror's own publication; a later run snapshots "
            "again)"
        ),
    )
    stop.add_argument(
        "--timeout",
        type=_interval,
        default=120.0,
        help="seconds to wait for the last round (default 120)",
    )


def _add_mirror_command(sub) -> None:
    mirror = sub.add_parser(
        "mirror",
        help="mirror a PostgreSQL database into Delta/Iceberg tables, one table per table",
        description=(
            "Runs the Postgres source pipeline (snapshot, then the WAL, exactly once into one "
            "topic per table) and ONE sink pipeline upserting each topic into its own table "
            "under --to, as one mirror: lag per table live, Ctrl-C stops both (the sink once "
            "it read everything). Without --kafka an embedded broker runs for the command's "
            "lifetime. The password comes from an environment variable (--password-env, or "
            "PGPASSWORD), never from the URL. `rayconnect status NAME` / `stop NAME` treat the "
            "two pipelines as one; `stop NAME --drop-slot` when the mirror is deleted for "
            "good. The same as a file: kind: mirror (rayconnect run FILE)."
        ),
    )
    mirror.add_argument(
        "database", metavar="URL", help="postgresql://USER@HOST:PORT/DATABASE (no password)"
    )
    mirror.add_argument(
        "--to",
        required=True,
        help="where the tables go: a folder or s3://... (Delta), or "
        "with --format iceberg the embedded catalog's warehouse folder",
    )
    mirror.add_argument(
        "--name", default=None, help="the mirror's name (default: <database>-mirror)"
    )
    mirror.add_argument("--format", choices=("delta", "iceberg"), default="delta")
    mirror.add_argument(
        "--tables",
        default=None,
        help="comma-separated tables (default: every table of schema public at start)",
    )
    mirror.add_argument(
        "--kafka", default=None, help="Kafka bootstrap servers (default: an embedded broker)"
    )
    mirror.add_argument("--topic-prefix", default=None, help="default: the mirror's name")
    mirror.add_argument(
        "--password-env",
        default=None,
        help="environment variable with the password (default: libpq's own: PGPASSWORD, ~/.pgpass)",
    )
    mirror.add_argument("--slot", default=None, help="replication slot (default: from the name)")
    mirror.add_argument(
        "--publication",
        default=None,
        help="an existing publication to capture (kept on "
        "--drop-slot; default: the mirror's own, made for the tables)",
    )
    mirror.add_argument(
        "--partitions", type=_positive, default=None, help="partitions per topic (default 2)"
    )
    _address(mirror)
    mirror.add_argument("--detach", action="store_true", help="return once it runs (needs --kafka)")
    mirror.add_argument(
        "--interval", type=_interval, default=2.0, help="seconds between lag blocks (default 2)"
    )


def _database_demo(args: argparse.Namespace) -> Any:
    from rayconnect.demo.database import run_database_demo

    if args.source:
        build_parser().error("--source and --database are two different demos")
    if args.tables > 20:
        build_parser().error("--tables: at most 20")
    return run_database_demo(
        args.records or 15_000,
        args.tables,
        args.table,
        rate=args.rate or 500,
        interval_s=args.interval,
        chaos=args.chaos,
    )


def _demo(args: argparse.Namespace) -> int:
    """The demo the arguments ask for; its exit code."""
    from rayconnect.demo.local_postgres import PostgresNotInstalledError
    from rayconnect.demo.sink import DemoError, run_demo
    from rayconnect.errors import JavaNotFoundError, RayconnectError

    if args.source and args.table is not None:
        build_parser().error("--table is for the sink demo, not with --source")
    try:
        if args.database:
            result = _database_demo(args)
        elif args.source:
            from rayconnect.demo.source import run_source_demo

            result = run_source_demo(
                args.records or 40_000, args.partitions, rate=args.rate or 2_000, chaos=args.chaos
            )
        else:
            result = run_demo(
                args.records or 40_000,
                args.partitions,
                args.table,
                rate=args.rate or 2_000,
                interval_s=args.interval,
                chaos=args.chaos,
                spark_start=args.spark_start,
            )
    except JavaNotFoundError as e:
        print(f"rayconnect: {e}", file=sys.stderr)
        return EXIT_REQUIREMENT
    except (DemoError, PostgresNotInstalledError) as e:
        print(f"rayconnect: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RayconnectError as e:  # e.g. --table where nothing can be written: one line
        print(f"rayconnect: {e}", file=sys.stderr)
        return exit_code(e)
    return EXIT_OK if result.ok else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    if args.command == "run":
        from rayconnect.cli.run import run_command

        return run_command(args)
    if args.command == "mirror":
        from rayconnect.cli.mirror import mirror_command

        return mirror_command(args)
    if args.command in ("list", "status", "stop", "snapshot"):
        from rayconnect.cli import status

        return getattr(status, f"{args.command}_command")(args)
    return EXIT_USAGE
