"""The ``rayconnect`` command line.

Exit codes: 0 success, 1 the work ran but failed its check (e.g. the demo's table does not
match what was produced), 2 bad usage or configuration, 3 a missing requirement (Java).
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REQUIREMENT = 0, 1, 2, 3


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
        help="round trip on embedded parts: broker -> Spark on Ray -> Delta, verified",
        description=(
            "Starts an embedded Kafka-protocol broker (tansu), produces demo records, reads "
            "them, writes them with Spark on Ray and commits them with their offsets in one "
            "Delta version, then verifies the table. Exit 0 only if it holds exactly the "
            "records produced."
        ),
    )
    demo.add_argument("--records", type=_positive, default=100_000, help="default 100000")
    demo.add_argument("--partitions", type=_positive, default=4, help="default 4")
    demo.add_argument(
        "--table", default=None, help="new folder for the Delta table (default: a temp folder)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from rayconnect.demo import DemoError, run_demo
        from rayconnect.spark_bridge.session import JavaNotFoundError

        try:
            result = run_demo(args.records, args.partitions, args.table)
        except JavaNotFoundError as e:
            print(f"rayconnect: {e}", file=sys.stderr)
            return EXIT_REQUIREMENT
        except DemoError as e:
            print(f"rayconnect: {e}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK if result.ok else EXIT_FAILED
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
