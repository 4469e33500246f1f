"""Where the time goes on rayconnect's throughput path: py-spy on every actor during (a).

    .venv/bin/python bench/profile_pipeline.py [--records 2000000] [--partitions 8] [--seconds 25]

Produces a backlog on the embedded broker, starts the sink pipeline and, as soon as it is
up, runs ``py-spy record`` (raw collapsed stacks, 100 Hz, --nonblocking, --idle off) on the reader,
one participant, the coordinator, the writer (Spark driver side, Python) and the Spark
executor's Python workers for ``--seconds``. Prints, per process, CPU seconds sampled and
the top functions by inclusive and self time, and writes the raw stacks (speedscope-ready
``.txt`` collapsed format) to bench/results/profile/.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
from common import RaySession, actor_pids, produce_backlog  # noqa: E402
from rc_runner import run_backlog  # noqa: E402

PYSPY = str(Path(sys.executable).with_name("py-spy"))
OUT = Path(__file__).resolve().parent / "results" / "profile"


def summarize(path: Path, top: int = 12) -> dict:
    incl: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        n = int(n)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")" if " (" in f else f
            for f in stack.split(";")
        ]
        for f in set(frames):
            incl[f] += n
        self_[frames[-1]] += n
    return {
        "samples": total,
        "inclusive": [(f, round(100 * n / max(total, 1), 1)) for f, n in incl.most_common(top)],
        "self": [(f, round(100 * n / max(total, 1), 1)) for f, n in self_.most_common(top)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--commit-interval", type=float, default=5.0)
    ap.add_argument("--flush-max-records", type=int, default=200_000)
    ap.add_argument("--request-commit-after-flushes", type=int, default=4)
    ap.add_argument(
        "--caught-up", action="store_true", help="commit_when_caught_up=True (as run.py's (a))"
    )
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    from rayconnect.kafka.embedded import EmbeddedBroker

    work = tempfile.mkdtemp(prefix="rc-prof-")
    spies: list[tuple[str, subprocess.Popen, Path]] = []

    def during(name: str) -> None:
        if a.seconds <= 0:
            return
        pids = actor_pids(name)
        targets = {}
        for actor, pid in pids.items():
            role = actor.split("/")[1] if "/" in actor else actor
            if role == "participant" and any(k.startswith("participant") for k in targets):
                continue
            targets[f"{role}"] = pid
        writer = pids.get(f"{name}/writer")
        # Spark executors' Python workers (pyspark.daemon / worker) are under the executor JVM
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "pyspark.daemon" in cmd or "pyspark/daemon" in cmd:
                targets[f"spark-pyworker-{p.pid}"] = p.pid
        for role, pid in targets.items():
            out = OUT / f"{a.tag}{role}.txt"
            cmd = [
                PYSPY,
                "record",
                "-p",
                str(pid),
                "-d",
                str(int(a.seconds)),
                "-r",
                "100",
                "--nonblocking",
                "-f",
                "raw",
                "-o",
                str(out),
            ]
            if role.startswith("spark-pyworker"):
                cmd.append("--subprocesses")
            spies.append(
                (
                    role,
                    subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                    out,
                )
            )
        print(f"profiling {sorted(targets)} (writer pid {writer})", file=sys.stderr)

    with EmbeddedBroker("prof") as broker:
        counts = produce_backlog(broker.bootstrap_servers, "prof", a.records, a.partitions)
        with RaySession():
            res = run_backlog(
                "prof",
                broker.bootstrap_servers,
                "prof",
                os.path.join(work, "t"),
                counts,
                dict(
                    commit_interval_s=a.commit_interval,
                    flush_max_records=a.flush_max_records,
                    request_commit_after_flushes=a.request_commit_after_flushes,
                    commit_when_caught_up=a.caught_up,
                ),
                exclude_pids=(broker.pid,),
                during=during,
            )
            for _, p, _ in spies:
                p.wait(timeout=a.seconds + 30)
    summary = {
        "run": {
            k: res[k]
            for k in (
                "records_per_s",
                "seconds",
                "rounds_committed",
                "spark_jobs",
                "round_s_median",
                "writer_calls",
                "memory",
            )
        }
    }
    for role, _, out in spies:
        if out.exists():
            summary[role] = summarize(out)
    (OUT / f"{a.tag}summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["run"]))
    for role, s in summary.items():
        if role == "run":
            continue
        print(
            f"\n== {role}: {s['samples']} samples ({s['samples'] / 100:.1f} CPU-s in {a.seconds:.0f} s)"
        )
        print("  inclusive:")
        for f, pct in s["inclusive"]:
            print(f"    {pct:5.1f}%  {f}")
        print("  self:")
        for f, pct in s["self"][:8]:
            print(f"    {pct:5.1f}%  {f}")


if __name__ == "__main__":
    main()
