"""Spread vs pack on a Ray cluster of three nodes on this machine: the same backlog read and
committed by a pipeline whose actors and Spark executors are spread over the nodes
(``rc.Placement("spread")``, the default) or packed (``"pack"``), alternating, in one run.

    .venv/bin/python bench/placement.py [--records 300000] [--partitions 8] [--reps 2]

Prints one JSON line per run and a summary table; writes results/placement.json.
The cluster is tests/integration/local_cluster.py: a head (no CPUs: the driver) and two
workers with 2 CPUs each, so both strategies can place the two 1-CPU executors as they like
(SPREAD: one a node; PACK: both on one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from common import produce_backlog  # noqa: E402
from local_cluster import local_cluster  # noqa: E402
from rc_runner import run_backlog  # noqa: E402

import rayconnect as rc  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402

WORKERS = {"w1": 2, "w2": 2}
RESULTS = Path(__file__).resolve().parent / "results" / "placement.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    runs: list[dict] = []
    with (
        tempfile.TemporaryDirectory(prefix="rc-placement-") as tmp,
        EmbeddedBroker("local", log_dir=Path(tmp) / "kafka") as broker,
        local_cluster(WORKERS) as cluster,
    ):
        for rep in range(args.reps):
            for strategy in ("spread", "pack"):
                name = f"{strategy}{rep}"
                want = produce_backlog(
                    broker.bootstrap_servers, name, args.records, args.partitions
                )
                where: dict[str, str] = {}
                settings = {
                    "commit_interval_s": 2.0,
                    "commit_when_caught_up": True,
                    "spark": rc.SparkSettings(executors=2, executor_memory="768MB"),
                    "placement": rc.Placement(strategy),
                }
                result = run_backlog(
                    name,
                    broker.bootstrap_servers,
                    name,
                    str(Path(tmp) / name),
                    want,
                    settings,
                    during=lambda n, where=where: where.update(cluster.placement(n)),
                )
                nodes: dict[str, list[str]] = {}
                for actor, node in where.items():
                    role = "executor" if actor.startswith("executor/") else actor.split("/")[1]
                    nodes.setdefault(role, []).append(node)
                run = {
                    "strategy": strategy,
                    "rep": rep,
                    "records_per_s": round(result["records_per_s"]),
                    "round_s_median": result["round_s_median"],
                    "startup_s": round(result["startup_s"], 1),
                    "rounds": result["rounds_committed"],
                    "pss_peak_mb": result["memory"].get("peak_pss_mb"),
                    "nodes": {k: sorted(v) for k, v in sorted(nodes.items())},
                }
                print(json.dumps(run), flush=True)
                runs.append(run)
                time.sleep(2)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    print("\n| strategy | records/s (median) | round s (median) | start-up s |")
    print("|---|---|---|---|")
    for strategy in ("spread", "pack"):
        mine = [r for r in runs if r["strategy"] == strategy]
        print(
            f"| {strategy} | {statistics.median(r['records_per_s'] for r in mine):,.0f} "
            f"| {statistics.median(r['round_s_median'] or 0 for r in mine):.2f} "
            f"| {statistics.median(r['startup_s'] for r in mine):.0f} |"
        )


if __name__ == "__main__":
    main()
