"""Exit-time crashes of a process that read Delta tables (issue 30, point 3): a reproduction.

Runs a short reader process many times (two at once) per variant and counts how each ended:
0, a signal (-11 SIGSEGV = shell 139, -6 SIGABRT = 134, -7 SIGBUS) or a hang at exit (no
exit after ``--hang-s``: py-spy and gdb dump its threads into the run's folder, which also
keeps the core; ``ulimit -c`` is raised for the children, cores go to the run's folder).

    .venv/bin/python bench/exit_crashes.py --runs 23 local,s3-delta,head,head-s3
    .venv/bin/python bench/exit_crashes.py --runs 23 local-native,head-native,head-s3-native

Variants (a local table and one on an embedded SeaweedFS S3, 5 versions of 1,000 rows):
``local``/``s3-delta`` full ``DeltaTable.to_pyarrow_table()``; ``s3-arrow`` pyarrow's
S3FileSystem alone (no deltalake); ``s3-both`` both; ``partial``/``partial-s3`` the first
batch of ``to_pyarrow_dataset().to_batches()`` then exit; ``head``/``head-s3``
``to_pyarrow_dataset().head(10)``. A ``-native`` suffix reads through pyarrow's native
filesystem (``rayconnect.storage.delta_reads``) instead of deltalake's default Python one.
Results and the cause: bench/results/exit_crashes.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def reader(variant: str, cfg: dict) -> None:
    """One reading process: read as ``variant`` says, print the rows, return (then exit)."""
    import faulthandler

    faulthandler.enable()
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from pyarrow import fs

    from rayconnect.storage.delta_reads import table_filesystem
    from rayconnect.storage.location import TableLocation

    native = variant.endswith("-native")
    variant = variant.removesuffix("-native")
    opts = cfg["opts"]

    def where(s3: bool) -> tuple[str, dict | None]:
        return (cfg["s3"], opts) if s3 else (cfg["local"], None)

    def filesystem(uri: str, o: dict | None) -> fs.FileSystem | None:
        return table_filesystem(TableLocation.parse(uri, o)) if native else None

    def table(uri: str, o: dict | None) -> int:
        return (
            DeltaTable(uri, storage_options=o)
            .to_pyarrow_table(filesystem=filesystem(uri, o))
            .num_rows
        )

    def dataset(uri: str, o: dict | None):
        return DeltaTable(uri, storage_options=o).to_pyarrow_dataset(filesystem=filesystem(uri, o))

    n = 0
    if variant in ("local",):
        n += table(*where(False))
    if variant in ("s3-delta", "s3-both"):
        n += table(*where(True))
    if variant in ("s3-arrow", "s3-both"):
        loc = TableLocation.parse(cfg["s3"], opts)
        f = loc.filesystem()
        sel = fs.FileSelector(loc.path(), recursive=True)
        files = [i.path for i in f.get_file_info(sel) if i.path.endswith(".parquet")]
        n += sum(pq.read_table(p, filesystem=f).num_rows for p in files)
    if variant in ("partial", "partial-s3"):
        batches = iter(dataset(*where(variant.endswith("s3"))).to_batches(batch_size=10))
        n += next(batches).num_rows
    if variant in ("head", "head-s3"):
        n += dataset(*where(variant.endswith("s3"))).head(10).num_rows
    print(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", help="comma-separated, see the module docstring")
    parser.add_argument("--runs", type=int, default=20, help="runs per variant")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--hang-s", type=float, default=60.0, help="no exit after this: a hang")
    parser.add_argument("--out", default=None, help="folder for failed runs (default: a temp dir)")
    args = parser.parse_args()

    import pyarrow as pa
    from deltalake import write_deltalake

    from rayconnect.storage.embedded_s3 import EmbeddedS3

    out = Path(args.out or tempfile.mkdtemp(prefix="exit-crashes-"))
    out.mkdir(parents=True, exist_ok=True)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    variants = args.variants.split(",")
    with EmbeddedS3(buckets=["lake"]) as s3:
        data = pa.table({"a": list(range(1000)), "b": [str(i) for i in range(1000)]})
        local = tempfile.mkdtemp(prefix="t", dir=out)
        for _ in range(5):
            write_deltalake(local, data, mode="append")
            write_deltalake("s3://lake/t", data, mode="append", storage_options=s3.storage_options)
        cfg = json.dumps({"local": local, "s3": "s3://lake/t", "opts": s3.storage_options})
        env = dict(os.environ, PYTHONPATH=SRC)

        def one(job: tuple[str, int]) -> tuple[str, str]:
            variant, i = job
            run_dir = out / f"{variant}-{i}"
            run_dir.mkdir()
            proc = subprocess.Popen(
                [sys.executable, __file__, "--reader", variant, cfg],
                cwd=run_dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                _, err = proc.communicate(timeout=args.hang_s)
                ended = str(proc.returncode)
            except subprocess.TimeoutExpired:
                dumps = [
                    ["py-spy", "dump", "--native", "--pid", str(proc.pid)],
                    ["gdb", "-q", "-batch", "-p", str(proc.pid), "-ex", "thread apply all bt 30"],
                ]
                text = [subprocess.run(d, capture_output=True, text=True).stdout for d in dumps]
                (run_dir / "hang").write_text("\n=====GDB\n".join(text))
                proc.kill()
                _, err = proc.communicate()
                ended = "hang"
            if ended == "0":
                shutil.rmtree(run_dir)
            else:
                (run_dir / "stderr").write_text(err)
            return variant, ended

        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        started = time.monotonic()
        jobs = [(v, i) for i in range(args.runs) for v in variants]
        with ThreadPoolExecutor(args.parallel) as pool:
            for variant, ended in pool.map(one, jobs):
                counts[(variant, ended)] += 1
    print(f"{len(jobs)} runs in {time.monotonic() - started:.0f} s; failed runs in {out}")
    for variant in variants:
        ends = {e: c for (v, e), c in sorted(counts.items()) if v == variant}
        print(f"  {variant:20s} {ends}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--reader":
        reader(sys.argv[2], json.loads(sys.argv[3]))
    else:
        main()
