"""Micro-benchmark: who should rewrite a table's small files - delta-rs in the coordinator
(what the pipeline's upkeep does) or the Spark executors the pipeline already runs?

Issue 15 asks to measure it. The same small-file table (the pipeline's raw schema, ``--files``
files of ``--rows`` rows, as rounds leave them) is rewritten into files of the upkeep's target
size three ways, each on a fresh copy, timed on the wall clock:

- ``delta-rs optimize``: ``DeltaTable.optimize.compact`` (read, bin-pack, write, AND commit the
  removes/adds with ``dataChange=false``), ``max_concurrent_tasks`` 1 (the default) and 2;
- ``Spark SQL``: ``spark.read.parquet(files).coalesce(n).write.parquet`` on RayDP - rows go
  through the JVM; the rewrite only (its commit would come on top);
- ``Spark mapInArrow``: the executors read and write with Arrow (the writer's own data path),
  one task per output file; the rewrite only.

The Spark runs are warm (a first job on a small copy starts the JVMs and is not timed), as the
pipeline's Spark is. Rows are checked equal after each rewrite.

    .venv/bin/python bench/micro_compaction_rewrite.py [--files 2000] [--rows 500] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import ray  # noqa: E402
from common import RaySession, ensure_session_latest  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402
from micro_to_arrow import make_records  # noqa: E402

from rayconnect.kafka.to_arrow import records_to_batch  # noqa: E402

TARGET = 128 * 1024 * 1024  # CompactSettings.target_file_mb's default


def make_table(path: str, files: int, rows: int) -> None:
    """``files`` files of ``rows`` rows each, one append each (the rounds' small files)."""
    table = pa.Table.from_batches([records_to_batch("local", make_records(rows))])
    for _ in range(files):
        write_deltalake(path, table, mode="append")


def files_of(path: str) -> list[str]:
    return [os.path.join(path, f) for f in DeltaTable(path).file_uris()]


def bins(paths: list[str], target: int) -> list[list[str]]:
    """Bin-pack files in order into bins of about ``target`` bytes (as delta-rs does)."""
    out: list[list[str]] = [[]]
    size = 0
    for p in paths:
        s = os.path.getsize(p)
        if out[-1] and size + s > target:
            out.append([])
            size = 0
        out[-1].append(p)
        size += s
    return out


def arrow_rewriter(
    groups: list[list[str]], out_dir: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function: bin indexes in, one Parquet file per bin out (Arrow only)."""

    def rewrite(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        written = []
        for batch in batches:
            for i in batch.column(0).to_pylist():
                parts = [pq.read_table(p) for p in groups[i]]
                table = pa.concat_tables(parts)
                target = os.path.join(out_dir, f"part-{i}.parquet")
                pq.write_table(table, target, compression="snappy")
                written.append(table.num_rows)
        yield pa.RecordBatch.from_arrays([pa.array(written, pa.int64())], names=["rows"])

    return rewrite


@ray.remote(num_cpus=0)
class SparkRewriter:
    """Holds one warm RayDP Spark session (started in this actor, like the writer's)."""

    def __init__(self) -> None:
        from rayconnect.spark_bridge.session import start_spark

        self.spark = start_spark("micro-compaction", executors=1, cores=2, memory="2GB")

    def sql(self, paths: list[str], out_files: int, out_dir: str) -> tuple[float, int]:
        started = time.perf_counter()
        df = self.spark.read.parquet(*paths)
        df.coalesce(out_files).write.mode("overwrite").parquet(out_dir)
        seconds = time.perf_counter() - started
        return seconds, sum(
            pq.read_metadata(os.path.join(out_dir, f)).num_rows
            for f in os.listdir(out_dir)
            if f.endswith(".parquet")
        )

    def arrow(self, groups: list[list[str]], out_dir: str) -> tuple[float, int]:
        from pyspark.sql.types import LongType, StructField, StructType

        os.makedirs(out_dir, exist_ok=True)
        started = time.perf_counter()
        slices = max(1, min(len(groups), 2))
        rows = (
            self.spark.range(0, len(groups), 1, slices)
            .mapInArrow(
                arrow_rewriter(groups, out_dir), StructType([StructField("rows", LongType())])
            )
            .collect()
        )
        return time.perf_counter() - started, sum(r[0] for r in rows)

    def stop(self) -> None:
        from rayconnect.spark_bridge.session import stop_spark

        stop_spark()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="rc-compaction-")
    try:
        source = os.path.join(work, "source")
        t = time.perf_counter()
        make_table(source, a.files, a.rows)
        paths = files_of(source)
        total_rows = a.files * a.rows
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        print(
            f"table: {len(paths)} files, {total_rows:,} rows, {mb:.1f} MB (made in {time.perf_counter() - t:.1f} s)"
        )
        groups = bins(paths, TARGET)
        results: dict[str, list[float]] = {}

        def fresh(name: str) -> str:
            dst = os.path.join(work, name)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(source, dst)
            return dst

        for tasks in (1, 2):
            for r in range(a.repeat):
                copy = fresh(f"optimize-{tasks}-{r}")
                started = time.perf_counter()
                m = DeltaTable(copy).optimize.compact(
                    target_size=TARGET, max_concurrent_tasks=tasks
                )
                results.setdefault(f"delta-rs optimize, {tasks} task(s), with commit", []).append(
                    time.perf_counter() - started
                )
                assert DeltaTable(copy).count() == total_rows, "optimize lost rows"
                assert m["numFilesRemoved"] == len(paths), m
        with RaySession() as session:
            ensure_session_latest(session.session_dir)
            t = time.perf_counter()
            spark = SparkRewriter.remote()
            warm = fresh("warm")
            ray.get(spark.sql.remote(files_of(warm)[:20], 1, os.path.join(work, "warm-out")))
            ray.get(
                spark.arrow.remote(
                    bins(files_of(warm)[:20], TARGET), os.path.join(work, "warm-out2")
                )
            )
            print(f"Spark ready and warm in {time.perf_counter() - t:.1f} s")
            for r in range(a.repeat):
                copy = fresh(f"spark-{r}")
                seconds, rows = ray.get(
                    spark.sql.remote(
                        files_of(copy), len(groups), os.path.join(work, f"sql-out-{r}")
                    )
                )
                assert rows == total_rows, (rows, total_rows)
                results.setdefault("Spark SQL (JVM rows), rewrite only", []).append(seconds)
                seconds, rows = ray.get(
                    spark.arrow.remote(
                        bins(files_of(copy), TARGET), os.path.join(work, f"arrow-out-{r}")
                    )
                )
                assert rows == total_rows, (rows, total_rows)
                results.setdefault("Spark mapInArrow (Arrow), rewrite only", []).append(seconds)
            ray.get(spark.stop.remote())
        base = statistics.median(results["delta-rs optimize, 1 task(s), with commit"])
        print(
            f"\n{len(paths)} files x {a.rows} rows -> {len(groups)} file(s), median of {a.repeat}, load {os.getloadavg()[0]:.1f}"
        )
        print("| how | seconds | rows/s | vs delta-rs (1 task) |\n|---|---|---|---|")
        for name, secs in results.items():
            m = statistics.median(secs)
            print(f"| {name} | {m:.2f} | {total_rows / m:,.0f} | {base / m:.2f}x |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
