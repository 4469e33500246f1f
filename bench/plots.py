"""PNG plots of a results document (``bench/run.py``), matplotlib with the Agg backend."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = ("ceiling", "baseline", "rayconnect")
COLORS = {"ceiling": "#9e9e9e", "baseline": "#1f77b4", "rayconnect": "#d62728"}


def _label(ax, bars, values, fontsize=8, fmt="{:,.0f}"):
    """Write each bar's value above it."""
    for b, v in zip(bars, values, strict=True):
        if v is not None:
            ax.annotate(
                fmt.format(v),
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=fontsize,
            )


def _bars(ax, labels, values, colors):
    _label(ax, ax.bar(labels, values, color=colors), values)


def _save(fig, out: Path, name: str) -> Path:
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_throughput(a, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    vals = [a[s]["records_per_s"] for s in SYSTEMS]
    _bars(ax, SYSTEMS, vals, [COLORS[s] for s in SYSTEMS])
    ax.axhline(100_000, ls="--", color="k", lw=0.8, label="target 100k/s")
    ax.set_ylabel("records/s")
    ax.set_title(f"(a) throughput: {a['records']:,} records backlog, {a['partitions']} partitions")
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, out, "a_throughput.png")


def plot_latency(b, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.38
    xs = range(len(SYSTEMS))
    for i, p in enumerate(("p50", "p99")):
        vals = [b[s]["latency_ms"][p] for s in SYSTEMS]
        bars = ax.bar(
            [x + (i - 0.5) * width for x in xs],
            vals,
            width,
            label=p,
            color=[COLORS[s] for s in SYSTEMS],
            alpha=0.55 if p == "p50" else 1.0,
        )
        _label(ax, bars, vals)
    limit = (b["commit_interval_s"] + 1) * 1000
    ax.axhline(limit, ls="--", color="k", lw=0.8, label=f"target p99 < {limit:.0f} ms")
    ax.set_xticks(list(xs), SYSTEMS)
    ax.set_ylabel("produce-to-visible, ms")
    ax.set_title(f"(b) latency: {b['rate']:,}/s offered for {b['seconds']} s (light p50, dark p99)")
    ax.legend(fontsize=8)
    return _save(fig, out, "b_latency.png")


def plot_scaling(c, out: Path) -> Path:
    points = sorted(c["points"], key=int)
    ps = [int(p) for p in points]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for s in SYSTEMS:
        ax1.plot(
            ps, [c["points"][p][s]["records_per_s"] for p in points], "o-", color=COLORS[s], label=s
        )
    ax1.set_xlabel("partitions")
    ax1.set_ylabel("records/s")
    ax1.set_xticks(ps)
    ax1.set_title(f"(c) records/s, {c['records']:,}-record backlog")
    ax1.legend(fontsize=8)
    data = [c["points"][p]["rayconnect"]["round_s_median"] or 0 for p in points]
    idle = [
        ((c["points"][p]["rayconnect"].get("idle") or {}).get("overhead_s") or 0) for p in points
    ]
    ax2.plot(
        ps,
        [d * 1000 for d in data],
        "o-",
        color=COLORS["rayconnect"],
        label="round START->ACK with data (median)",
    )
    turnaround = [c["points"][p]["rayconnect"].get("end_to_start_s_median") or 0 for p in points]
    ax2.plot(
        ps,
        [t * 1000 for t in turnaround],
        "^-",
        color="#8c564b",
        label="round END->next START with data (median)",
    )
    ax2.plot(
        ps, [i * 1000 for i in idle], "s--", color="#ff7f0e", label="idle round END->next START"
    )
    ax2.axhline(250, ls=":", color="k", lw=0.8, label="target idle < 250 ms")
    ax2.axhline(
        c["commit_interval_s"] * 1000, ls="-.", color="#9e9e9e", lw=0.8, label="commit interval"
    )
    ax2.set_xlabel("partitions")
    ax2.set_ylabel("ms")
    ax2.set_xticks(ps)
    ax2.set_title("(c) round time, rayconnect")
    ax2.legend(fontsize=7)
    return _save(fig, out, "c_scaling.png")


def plot_memory(d, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = [s for s in ("small", "large") if s in d]
    labels, vals, colors = [], [], []
    for size in sizes:
        for s in SYSTEMS:
            if s in d[size]:
                labels.append(f"{s}\n{d[size]['records'] / 1e6:g}M")
                vals.append(d[size][s]["peak_pss_mb"])
                colors.append(COLORS[s])
    _bars(ax, labels, vals, colors)
    ax.set_ylabel("peak PSS of all the run's processes, MB")
    ax.set_title("(d) memory vs backlog size")
    return _save(fig, out, "d_memory.png")


def plot_source(e, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    batches = list(e["batches"])
    width = 0.8 / 3
    names = {
        "ceiling": "raw produce",
        "baseline": "plain (at-least-once)",
        "rayconnect": "exactly-once",
    }
    for i, s in enumerate(SYSTEMS):
        vals = [e["batches"][b][s] for b in batches]
        bars = ax.bar(
            [x + (i - 1) * width for x in range(len(batches))],
            vals,
            width,
            color=COLORS[s],
            label=names[s],
        )
        _label(ax, bars, vals, fontsize=7)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("records/s")
    ax.set_title(f"(e) source: {e['records']:,} records, {e['partitions']} partitions")
    ax.legend(fontsize=8)
    return _save(fig, out, "e_source.png")


def plot_hosts(h, out: Path) -> Path:
    """(h) throughput, peak PSS and start-up against partitions: participant hosts (default)
    and one process per partition, ceiling and baseline beside the throughput."""
    points = sorted(h["points"], key=int)
    ps = [int(p) for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    runs = (
        ("rayconnect", "hosts", COLORS["rayconnect"]),
        ("one_per_partition", "1 per partition", "#ff7f0e"),
    )
    for key, label, color in (
        ("ceiling", "ceiling", COLORS["ceiling"]),
        ("baseline", "baseline", COLORS["baseline"]),
        *runs,
    ):
        have = [p for p in points if key in h["points"][p]]
        axes[0].plot(
            [int(p) for p in have],
            [h["points"][p][key]["records_per_s"] for p in have],
            "o-",
            color=color,
            label=label,
        )
    for key, label, color in runs:
        have = [p for p in points if key in h["points"][p]]
        xs = [int(p) for p in have]
        axes[1].plot(
            xs,
            [h["points"][p][key]["memory"]["peak_pss_mb"] for p in have],
            "o-",
            color=color,
            label=label,
        )
        axes[2].plot(
            xs, [h["points"][p][key]["startup_s"] for p in have], "o-", color=color, label=label
        )
    for ax, title, unit in zip(
        axes, ("records/s", "peak PSS", "start-up"), ("records/s", "MB", "s"), strict=True
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.set_xlabel("partitions")
        ax.set_ylabel(unit)
        ax.set_title(f"(h) {title}")
        ax.legend(fontsize=7)
    return _save(fig, out, "h_hosts.png")


def plot_all(doc: dict, out: Path) -> list[Path]:
    sc = doc["scenarios"]
    made = []
    for key, fn in (
        ("a", plot_throughput),
        ("b", plot_latency),
        ("c", plot_scaling),
        ("d", plot_memory),
        ("e", plot_source),
        ("h", plot_hosts),
    ):
        if key in sc:
            try:
                made.append(fn(sc[key], out))
            except Exception as exc:  # a plot must not lose the results
                print(f"plot {key} failed: {exc}")
    return made
