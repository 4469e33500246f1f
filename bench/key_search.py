"""Where a merge-on-read round's key search runs (issue 37 point 3): the coordinator's
process (where it ran before), the writer's process, Spark's executors.

    .venv/bin/python bench/key_search.py [--rows 10000000,50000000] [--changes 100000]
        [--file-rows 250000] [--repeats 3] [--executors 1,2]

A table of ``--rows`` rows in Parquet files of ``--file-rows`` rows whose ``id`` keys are a
random permutation (every file spans the key range: statistics prune nothing, the search
reads every file's key column - the no-index path: composite or string keys, a table over
``key_index_rows``), plus a 40-byte payload column. A round's ``--changes`` keys (70% in the
table, 30% new). Each place runs ``row_delta.find_deletes`` as the round does - pruning in
the calling process (standing in for the coordinator), the join where the place says:

- ``coordinator`` (baseline, the same run): ``search_here``, threads in this process;
- ``writer process``: ``SearchOnWriter`` to a writer actor whose Spark is not up
  (``spark.start: when_needed``, the default, before the load starts Spark);
- ``spark, N executors``: a writer with ``spark.start: with_pipeline`` and N executors.

Timed: the whole call, a warm-up then the median of ``--repeats``; and the CPU seconds the
calling process spent (the coordinator's: what the protocol's rounds compete with). Every
place's answer is checked equal to the baseline's. Prints a markdown table; writes
``results/key-search/results.md`` and ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

RESULTS = Path(__file__).resolve().parent / "results" / "key-search"
NAMESPACE = "rayconnect-bench"
PAYLOAD = b"x" * 40


def make_table(folder: Path, rows: int, file_rows: int, seed: int) -> list[Any]:
    """The table's files (written once per size) as the search's ``LiveFile``s."""
    from rayconnect.write_modes.row_delta import LiveFile

    rng = np.random.default_rng(seed)
    ids = rng.permutation(rows).astype(np.int64)
    live = []
    for i, start in enumerate(range(0, rows, file_rows)):
        chunk = ids[start : start + file_rows]
        path = folder / f"part-{i:05d}.parquet"
        payload = pa.array([PAYLOAD] * len(chunk), pa.binary())
        pq.write_table(pa.table({"id": chunk, "payload": payload}), path)
        bounds = {"id": (int(chunk.min()), int(chunk.max()))}
        live.append(LiveFile(str(path), None, len(chunk), bounds))
    return live


def round_keys(rows: int, changes: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    live = rng.choice(rows, int(changes * 0.7), replace=False)
    new = np.arange(rows, rows + changes - len(live))
    return pa.table({"id": pa.array(np.concatenate([live, new]), pa.int64())})


def measure(
    search: Callable[[Any], list[np.ndarray]], live: list[Any], keys: pa.Table, repeats: int
) -> tuple[dict[str, Any], list[Any]]:
    from rayconnect.write_modes.row_delta import ColumnReader, find_deletes

    read = ColumnReader(pafs.LocalFileSystem())
    me = psutil.Process()
    found: list[Any] = []
    walls, cpus = [], []
    for i in range(repeats + 1):
        cpu0, t0 = me.cpu_times(), time.perf_counter()
        found = list(find_deletes(live, keys, (), read, search))
        wall, cpu1 = time.perf_counter() - t0, me.cpu_times()
        if i:  # the first is a warm-up
            walls.append(wall)
            cpus.append((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system))
    cell = {
        "search_s": round(statistics.median(walls), 3),
        "runs_s": [round(w, 3) for w in walls],
        "caller_cpu_s": round(statistics.median(cpus), 3),
        "positions": sum(len(d.positions) for d in found),
    }
    return cell, found


def same(a: list[Any], b: list[Any]) -> bool:
    return [(d.file.path, d.positions.tolist()) for d in a] == [
        (d.file.path, d.positions.tolist()) for d in b
    ]


def writer(spark: Any) -> tuple[Any, str]:
    from rayconnect.actors import names
    from rayconnect.actors.writer import start_writer

    name = names.writer(f"bench-{uuid.uuid4().hex[:6]}")
    handle = start_writer(name, namespace=NAMESPACE, spark=spark, warm_up=True, timeout_s=300)
    return handle, name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="10000000,50000000")
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--file-rows", type=int, default=250_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--executors", default="1,2")
    ap.add_argument("--work", default="/tmp")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args()
    sizes = [int(r) for r in a.rows.split(",")]
    executors = [int(e) for e in a.executors.split(",")]

    import ray

    from rayconnect.config.spark import SparkSettings
    from rayconnect.write_modes.key_search import SearchOnWriter
    from rayconnect.write_modes.row_delta import search_here

    work = Path(tempfile.mkdtemp(prefix="rc-bench-keysearch-", dir=a.work))
    tables = {}
    try:
        for rows in sizes:
            folder = work / f"t{rows}"
            folder.mkdir()
            t0 = time.perf_counter()
            tables[rows] = (
                make_table(folder, rows, a.file_rows, 1),
                round_keys(rows, a.changes, 2),
            )
            print(f"table of {rows:,} rows written in {time.perf_counter() - t0:.1f} s", flush=True)

        cells: list[dict[str, Any]] = []
        baseline: dict[int, list[Any]] = {}
        for rows, (live, keys) in tables.items():
            cell, baseline[rows] = measure(search_here, live, keys, a.repeats)
            cells.append({"place": "coordinator (before: search_here)", "rows": rows, **cell})
            print(cells[-1], flush=True)

        ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE)
        places: list[tuple[str, Any]] = [
            ("writer process (defaults, Spark not up)", SparkSettings())
        ]
        places += [
            (
                f"spark, {n} executor{'s' if n > 1 else ''}",
                SparkSettings(start="with_pipeline", executors=n, executor_wait_s=30),
            )
            for n in executors
        ]
        for label, spark in places:
            t0 = time.perf_counter()
            handle, name = writer(spark)
            started = round(time.perf_counter() - t0, 1)
            stats = ray.get(handle.stats.remote())
            try:
                for rows, (live, keys) in tables.items():
                    search = SearchOnWriter(name, NAMESPACE)
                    cell, found = measure(search, live, keys, a.repeats)
                    counts = ray.get(handle.stats.remote())
                    cells.append(
                        {
                            "place": label,
                            "rows": rows,
                            **cell,
                            "same_answer": same(found, baseline[rows]),
                            "fallbacks": search.counts.here,
                            "spark_searches": counts.spark_searches,
                            "executors": stats.executors,
                            "writer_ready_s": started,
                        }
                    )
                    print(cells[-1], flush=True)
            finally:
                ray.get(handle.close.remote(), timeout=60)
                ray.kill(handle)
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    run = {"args": vars(a), "cpus": psutil.cpu_count(), "cells": cells}
    (out / "results.json").write_text(json.dumps(run, indent=1))
    table = markdown(cells, a)
    (out / "results.md").write_text(table)
    print(table)


def markdown(cells: list[dict[str, Any]], a: argparse.Namespace) -> str:
    base = {c["rows"]: c["search_s"] for c in cells if c["place"].startswith("coordinator")}
    lines = [
        f"# Key search placement ({a.changes:,} keys a round, files of {a.file_rows:,} rows "
        f"spanning the key range, {psutil.cpu_count()} cores; median of {a.repeats} after a "
        "warm-up)",
        "",
        "| place | table rows | search s | vs coordinator | coordinator CPU s | positions | same answer |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in cells:
        ratio = c["search_s"] / base[c["rows"]] if base.get(c["rows"]) else float("nan")
        lines.append(
            f"| {c['place']} | {c['rows']:,} | {c['search_s']} | {ratio:.2f}x | "
            f"{c['caller_cpu_s']} | {c['positions']:,} | {c.get('same_answer', 'baseline')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
