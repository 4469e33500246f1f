"""Soak of a Delta table under a pipeline's rounds, with and without the pipeline's upkeep.

Not in CI: run on purpose (README "Table upkeep"). Compressed in time: a round every
``--interval`` s (0.2 s; ten times a 2 s pipeline) over ``--partitions`` partitions, one small
file per partition per round, each version carrying one txn per partition plus the epoch -
exactly what the coordinator commits. It drives the coordinator's own parts (``DeltaCommitter``
for rounds, ``UpkeepSchedule`` + ``DeltaUpkeep`` in a thread of their own beside them, as in
``actors/coordinator.py``) without Kafka and Spark, so what is measured is the table: live
files, log size, commit latency, recovery (a new committer checking the table, claiming the
epoch and reading every partition's offset, as a restarted coordinator does) and a full read (Polars count), sampled every
``--sample-every`` rounds. Ends by checking the row set (every offset once) and the offsets.

    .venv/bin/python bench/table_upkeep_soak.py --rounds 1000           # ~8 min, both modes
    .venv/bin/python bench/table_upkeep_soak.py --modes none,nockpt --rounds 2000 --interval 0 \
        --partitions 32 --records 1 --sample-every 250     # recovery at 100 vs 2000 versions

Writes ``bench/results/upkeep/soak.json``, ``soak.md`` and ``soak.png``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST
from rayconnect.protocol.upkeep import CompactSettings, Job, LogSettings, UpkeepSchedule
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.storage.location import TableLocation
from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.delta_upkeep import DeltaUpkeep
from rayconnect.tables.files import STAGING_DIR, describe_file

PIPELINE = "soak"
OUT = Path(__file__).parent / "results" / "upkeep"


def batch(partition: int, start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "cluster": ["c"] * n,
            "topic": ["t"] * n,
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(start, start + n), pa.int64()),
            "timestamp": pa.array(
                [1_700_000_000_000_000 + o for o in range(n)],
                RAW_RECORD_SCHEMA.field("timestamp").type,
            ),
            "key": [f"k{o}".encode() for o in range(start, start + n)],
            "value": [os.urandom(100) for _ in range(n)],
            "headers": pa.array([[]] * n, RAW_RECORD_SCHEMA.field("headers").type),
        },
        schema=RAW_RECORD_SCHEMA,
    )


def stage(location: TableLocation, batches: list[pa.Table]) -> Any:
    """One staged file holding ``batches`` (one partition's rows each), described as the
    writer describes it: a file of several partitions names them (``shared_by``)."""
    rel = f"{STAGING_DIR}/{uuid.uuid4().hex}/part-0.parquet"
    os.makedirs(os.path.dirname(location.path(rel)), exist_ok=True)
    pq.write_table(pa.concat_tables(batches), location.path(rel))
    described = describe_file(location, rel)[0]
    if len(batches) == 1:
        return described
    keys = tuple(sorted(f"c/t/{b.column('partition')[0].as_py()}" for b in batches))
    return msgspec.structs.replace(described, shared_by=keys)


def log_size(root: Path) -> tuple[int, int]:
    """(bytes, entries) of the table's _delta_log."""
    names = os.listdir(root / "_delta_log")
    return sum((root / "_delta_log" / n).stat().st_size for n in names), len(names)


def recovery_s(root: Path, past_checkpoint: int | None = None) -> tuple[float, int]:
    """What a restarted coordinator does (``Coordinator._claim``): check the table, claim
    the epoch (a commit), read every partition's offset. On a copy of the log, as claiming
    on the soak's table would fence its committer; the copy is not timed. Returns the time
    and how many commits after the last checkpoint it replayed: recovery reads those one by
    one (delta-rs and the offsets alike), so it saw-tooths over each checkpoint interval.
    ``past_checkpoint``: copy only that many commits after it (a fixed point of the cycle,
    to compare early and late versions fairly)."""
    scratch = root.parent / f"{root.name}-recovery"
    for attempt in range(5):  # upkeep may be writing a checkpoint or cleaning the log
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            shutil.copytree(
                root / "_delta_log", scratch / "_delta_log", ignore=shutil.ignore_patterns("*#*")
            )
            break
        except (shutil.Error, FileNotFoundError):
            if attempt == 4:
                raise
    log = scratch / "_delta_log"
    hint = log / "_last_checkpoint"
    checkpoint = json.loads(hint.read_text())["version"] if hint.exists() else -1
    commits = sorted(int(n[:20]) for n in os.listdir(log) if n.endswith(".json"))
    if past_checkpoint is not None:
        for v in commits:
            if v > checkpoint + past_checkpoint:
                (log / f"{v:020d}.json").unlink()
    replayed = sum(1 for v in commits if checkpoint < v <= checkpoint + (past_checkpoint or 10**9))
    started = time.perf_counter()
    fresh = DeltaCommitter(str(scratch), PIPELINE)
    fresh.ensure_table()
    fresh.claim_epoch()
    fresh.committed_offsets(None)
    took = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return took, replayed


def read_count_s(root: Path) -> tuple[float, int]:
    import polars as pl

    started = time.perf_counter()
    n = pl.scan_delta(str(root)).select(pl.len()).collect().item()
    return time.perf_counter() - started, n


def soak(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.root) / mode
    shutil.rmtree(root, ignore_errors=True)
    location = TableLocation.parse(str(root))
    committer = DeltaCommitter(str(root), PIPELINE)
    committer.ensure_table()
    compact = CompactSettings(
        enabled=mode == "compact", min_files=args.compact_min_files, every_s=args.compact_every
    )
    # mode "nockpt": no compaction and no checkpoints at all, to show what checkpoints save
    interval = 10**9 if mode == "nockpt" else args.checkpoint_interval
    logs = LogSettings(
        checkpoint_interval=interval,
        tidy_every_s=args.tidy_every,
        log_retention_hours=args.log_retention_hours,
    )
    upkeep = DeltaUpkeep(
        str(root), PIPELINE, compact, logs, vacuum_retention_hours=args.vacuum_retention_hours
    )
    upkeep.configure_table()
    epoch = committer.claim_epoch()
    schedule = UpkeepSchedule(compact, logs, time.monotonic())
    pool = concurrent.futures.ThreadPoolExecutor(2, "upkeep")
    running: dict[Job, concurrent.futures.Future] = {}
    jobs_done: list[dict[str, Any]] = []
    next_offset = dict.fromkeys(range(args.partitions), 0)
    commits: list[tuple[int, float]] = []  # (version, commit s)
    samples: list[dict[str, Any]] = []
    # as the pipeline writes them: a participant host's partitions share a file a round
    per_file = max(1, args.partitions_per_file)
    partitions = list(range(args.partitions))
    file_groups = [partitions[i : i + per_file] for i in range(0, args.partitions, per_file)]
    t0 = time.monotonic()
    for rnd in range(1, args.rounds + 1):
        started = time.monotonic()
        files = [
            stage(location, [batch(p, next_offset[p], args.records) for p in group])
            for group in file_groups
        ]
        expected = {f"c/t/{p}": (next_offset[p] or None) for p in range(args.partitions)}
        offsets = {f"c/t/{p}": next_offset[p] + args.records for p in range(args.partitions)}
        c0 = time.perf_counter()
        version = committer.commit(files, offsets, expected, epoch=epoch)
        commits.append((version, time.perf_counter() - c0))
        for p in next_offset:
            next_offset[p] += args.records
        now = time.monotonic()
        for job, fut in list(running.items()):
            if fut.done():
                del running[job]
                error = fut.exception()
                schedule.finished(job, error is None, now, repr(error) if error else None)
                jobs_done.append({"job": job.value, "at_version": version, "ok": error is None})
        schedule.committed(len(files), now)
        for job in schedule.due(now):
            running[job] = pool.submit(upkeep.compact if job is Job.COMPACT else upkeep.tidy)
        if rnd % args.sample_every == 0 or rnd == 10:
            samples.append(sample(root, version, commits, rnd, time.monotonic() - t0))
            print(mode, samples[-1], flush=True)
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    for job, fut in running.items():
        error = fut.exception()
        schedule.finished(job, error is None, time.monotonic())
    pool.shutdown()
    final = sample(root, committer.version(), commits, args.rounds, time.monotonic() - t0)
    samples.append(final)
    check = exactly_once(root, args)
    return {
        "mode": mode,
        "samples": samples,
        "commits": commits,
        "upkeep": [j for j in jobs_done],
        "upkeep_status": {k: v for k, v in schedule_status(schedule).items()},
        "exactly_once": check,
    }


def schedule_status(schedule: UpkeepSchedule) -> dict[str, Any]:
    import msgspec

    return msgspec.to_builtins(schedule.status())


def sample(root: Path, version: int, commits, rnd: int, elapsed: float) -> dict[str, Any]:
    from deltalake import DeltaTable

    recent = [s for _, s in commits[-50:]]
    log_bytes, log_entries = log_size(root)
    read_s, rows = read_count_s(root)
    return {
        "round": rnd,
        "version": version,
        "elapsed_s": round(elapsed, 1),
        "live_files": len(DeltaTable(str(root)).file_uris()),
        "log_bytes": log_bytes,
        "log_entries": log_entries,
        "commit_ms_p50": round(1000 * statistics.median(recent), 1),
        "commit_ms_max": round(1000 * max(recent), 1),
        **recovery_sample(root),
        "read_count_ms": round(1000 * read_s, 1),
        "rows": rows,
        "load": os.getloadavg()[0],
    }


def recovery_sample(root: Path) -> dict[str, Any]:
    """Recovery as the table is (best of 3), and at one commit past its last checkpoint."""
    now = min(recovery_s(root) for _ in range(3))
    fixed = min(recovery_s(root, past_checkpoint=1) for _ in range(3))
    return {
        "recovery_ms": round(1000 * now[0], 1),
        "recovery_replayed": now[1],
        "recovery_ms_1_past_checkpoint": round(1000 * fixed[0], 1),
    }


def exactly_once(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    import polars as pl

    df = pl.read_delta(str(root), columns=["partition", "offset"])
    want = args.rounds * args.records
    per = df.group_by("partition").agg(pl.len().alias("n"), pl.col("offset").n_unique().alias("u"))
    ok = (
        df.height == want * args.partitions
        and per.height == args.partitions
        and all(n == u == want for n, u in zip(per["n"], per["u"], strict=True))
    )
    offsets = DeltaCommitter(str(root), PIPELINE).committed_offsets(None)
    ok = ok and offsets == {f"c/t/{p}": want for p in range(args.partitions)}
    return {"rows": df.height, "expected_rows": want * args.partitions, "ok": ok}


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for res in results:
        s = res["samples"]
        v = [x["version"] for x in s]
        axes[0].plot(v, [x["live_files"] for x in s], label=res["mode"])
        axes[1].plot(v, [x["log_bytes"] / 1024 for x in s], label=res["mode"])
        cv = [c[0] for c in res["commits"]]
        cs = [1000 * c[1] for c in res["commits"]]
        w = 25
        rolling = [statistics.median(cs[max(0, i - w) : i + 1]) for i in range(len(cs))]
        axes[2].plot(cv, rolling, label=res["mode"])
        axes[3].plot(v, [x["recovery_ms"] for x in s], label=f"{res['mode']} recovery")
        axes[3].plot(
            v,
            [x["recovery_ms_1_past_checkpoint"] for x in s],
            ":",
            label=f"{res['mode']} recovery, 1 commit past a checkpoint",
        )
        axes[3].plot(v, [x["read_count_ms"] for x in s], "--", label=f"{res['mode']} read")
    for ax, title in zip(
        axes,
        ["live files", "_delta_log size (KiB)", "commit latency (ms, rolling median)", "ms"],
        strict=True,
    ):
        ax.set_title(title)
        ax.set_xlabel("table version")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# Delta table soak: {args.rounds} rounds x {args.partitions} partitions, "
        f"interval {args.interval} s, {args.records} records/partition/round, "
        f"{min(args.partitions_per_file, args.partitions)} partitions a file",
        "",
        f"checkpoint interval {args.checkpoint_interval}; compaction (mode compact): min_files "
        f"{args.compact_min_files}, every {args.compact_every} s; tidy every {args.tidy_every} s; "
        f"log retention {args.log_retention_hours} h, vacuum (and tombstone) retention "
        f"{args.vacuum_retention_hours} h. "
        f"Machine: {platform.node()}, {os.cpu_count()} cores, shared (load in the table).",
        "",
        "| mode | version | live files | log KiB | log entries | commit ms p50 (max) of the "
        "last 50 | recovery ms (commits replayed) | recovery ms 1 past a checkpoint | "
        "Polars count ms | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for s in res["samples"]:
            if s is res["samples"][-1] or s["version"] <= 120 or s["round"] % 500 == 0:
                lines.append(
                    f"| {res['mode']} | {s['version']} | {s['live_files']} | "
                    f"{s['log_bytes'] / 1024:.0f} | {s['log_entries']} | {s['commit_ms_p50']} "
                    f"({s['commit_ms_max']}) | {s['recovery_ms']} ({s['recovery_replayed']}) | "
                    f"{s['recovery_ms_1_past_checkpoint']} | {s['read_count_ms']} | "
                    f"{s['load']:.1f} |"
                )
        lines.append(
            f"| {res['mode']} | exactly once: {res['exactly_once']} | upkeep: "
            f"{res['upkeep_status']['compactions']} compactions, "
            f"{res['upkeep_status']['tidies']} tidies | | | | | | |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--records", type=int, default=20, help="per partition per round")
    ap.add_argument("--modes", default="compact,none", help="compact, none, nockpt")
    ap.add_argument(
        "--partitions-per-file",
        type=int,
        default=DEFAULT_PARTITIONS_PER_HOST,
        help="partitions sharing a file a round: the pipeline's partitions_per_host (its "
        "hosts share files); 1 = a file per partition per round, as before hosts",
    )
    ap.add_argument("--checkpoint-interval", type=int, default=100)
    ap.add_argument("--compact-min-files", type=int, default=64)
    ap.add_argument("--compact-every", type=float, default=30.0, help="300 s compressed 10x")
    ap.add_argument("--tidy-every", type=float, default=60.0)
    ap.add_argument("--log-retention-hours", type=float, default=168.0)
    ap.add_argument(
        "--vacuum-retention-hours",
        type=float,
        default=24.0,
        help="the sink's vacuum_retention_hours: also how long checkpoints keep compacted-away "
        "files' tombstones; below the soak's length to see the steady state",
    )
    ap.add_argument("--sample-every", type=int, default=100)
    ap.add_argument("--root", default="/tmp/rc_upkeep_soak")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--keep", action="store_true", help="keep the tables")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [soak(mode, args) for mode in args.modes.split(",")]
    tag = f"soak-{args.rounds}x{args.partitions}-{'-'.join(args.modes.split(','))}"
    if args.partitions_per_file < args.partitions:
        tag += f"-{args.partitions_per_file}-per-file"
    if (args.log_retention_hours, args.vacuum_retention_hours) != (168.0, 24.0):
        tag += f"-retention-{args.log_retention_hours:g}h-{args.vacuum_retention_hours:g}h"
    (out / f"{tag}.json").write_text(json.dumps({"args": vars(args), "results": results}))
    (out / f"{tag}.md").write_text(markdown(results, args))
    plot(results, out / f"{tag}.png")
    print(markdown(results, args))
    if not args.keep:
        shutil.rmtree(args.root, ignore_errors=True)


if __name__ == "__main__":
    main()
