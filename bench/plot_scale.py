"""Issue 28's plot: throughput and round cost against partitions, from saved results.

    .venv/bin/python bench/plot_scale.py    # writes results/speed-28/scale.png

Runs nothing: it reads scenario (h) at 8, 64 and 256 partitions (`results/speed-28/h-8-256/`)
and at 1,024 (`results/speed-28/h-1024-row-groups/`), both 2026-11-27 on the quiet machine,
and the coordinator alone at 8 ... 10,000 partitions (`results/coordinator/`, and the
per-host wire's quiet run in `results/hosts-rounds/quiet-per-host`). Left: records/s of the
raw fetch, the baseline and rayconnect's defaults. Right: a round's START->ACK in the
pipeline (h) and the coordinator's own CPU per round.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _h_points() -> dict[int, dict]:
    points: dict[int, dict] = {}
    # (folder, whether its clock started when start() was called)
    for folder, from_called in (
        ("speed-28/h-8-256", True),
        ("speed-28/h-1024-row-groups", True),
    ):
        doc = json.loads((RESULTS / folder / "results.json").read_text())
        h = doc.get("scenarios", doc).get("h", doc)
        for n, point in h["points"].items():
            point["rayconnect"]["from_called"] = from_called
            points[int(n)] = point  # the later folder's 1,024 replaces the older one
    return dict(sorted(points.items()))


def _from_ready(rc: dict) -> float:
    """records/s from ``start()`` returning (the clock before 2026-11-27): runs since count
    from ``start()`` called and give ``startup_s``, taken off here."""
    if rc["from_called"]:
        return rc["records"] / (rc["seconds"] - rc["startup_s"])
    return rc["records_per_s"]


def main() -> None:
    points = _h_points()
    parts = list(points)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for who, style in (("ceiling", "k--"), ("baseline", "C1-o")):
        left.plot(parts, [points[p][who]["records_per_s"] for p in parts], style, label=who)
    left.plot(
        parts,
        [points[p]["rayconnect"]["records_per_s"] for p in parts],
        "C0-o",
        label="rayconnect (clock from start() called)",
    )
    left.plot(
        parts,
        [_from_ready(points[p]["rayconnect"]) for p in parts],
        "C0:",
        label="rayconnect, its start-up left out",
    )
    left.set(
        xscale="log",
        xlabel="partitions (one topic)",
        ylabel="records/s (2M x 210 B backlog)",
        title="throughput, defaults (h)",
    )
    left.set_xticks(parts, [f"{p:,}" for p in parts])
    left.legend()

    rounds = [points[p]["rayconnect"]["round_s_median"] * 1000 for p in parts]
    right.plot(parts, rounds, "C0-o", label="pipeline: round START->ACK median (h)")
    for source, style, label in (
        ("coordinator/coordinator_alone.json", "C2-s", "coordinator alone: CPU a round (40 hosts)"),
        ("hosts-rounds/quiet-per-host", "C3^", "coordinator alone, per-host wire, quiet"),
    ):
        rows = json.loads((RESULTS / source).read_text())["rows"]
        right.plot(
            [r["partitions"] for r in rows],
            [r["round_cpu_ms_median"] for r in rows],
            style,
            label=label,
        )
    right.axhline(50, color="C3", lw=0.8, ls=":", label="target: 50 ms at 10,000")
    right.set(
        xscale="log",
        yscale="log",
        xlabel="partitions",
        ylabel="ms",
        title="round cost against partitions",
    )
    right.legend(fontsize=8)
    fig.tight_layout()
    out = RESULTS / "speed-28" / "scale.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
