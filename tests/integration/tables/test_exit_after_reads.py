"""A process that reads Delta tables exits 0 (issue 30, point 3).

Each run is a fresh interpreter that reads a local table and one on the embedded S3 the way
rayconnect does (``rayconnect.storage.delta_reads``: pyarrow's native filesystems), the worst
case included: ``head()`` leaves reads in flight when it returns. Then it exits. Through
deltalake's default Python filesystem the same reads crashed at exit in about half the runs
(SIGSEGV 139, SIGABRT 134, or a hang; see bench/results/exit_crashes.md); this test fails on
any exit but 0, and checks the rows read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from rayconnect.storage.embedded_s3 import EmbeddedS3

ROWS, VERSIONS = 500, 4

READER = """
import json, sys
from deltalake import DeltaTable
from rayconnect.storage.location import TableLocation
from rayconnect.storage.delta_reads import delta_dataset, read_delta

tables = json.loads(sys.argv[1])
out = []
for uri, options in tables:
    out.append(read_delta(uri, options, columns=["i"]).num_rows)
    dt = DeltaTable(uri, storage_options=options)
    out.append(delta_dataset(dt, TableLocation.parse(uri, options)).head(10).num_rows)
print(json.dumps(out))
"""


def _tables(tmp_path: Path, s3: EmbeddedS3, bucket: str) -> list[tuple[str, dict | None]]:
    data = pa.table({"i": list(range(ROWS)), "s": [f"row {i}" for i in range(ROWS)]})
    local, remote = str(tmp_path / "t"), f"s3://{bucket}/t"
    for _ in range(VERSIONS):  # several files: reads overlap on arrow's IO threads
        write_deltalake(local, data, mode="append")
        write_deltalake(remote, data, mode="append", storage_options=s3.storage_options)
    return [(local, None), (remote, s3.storage_options)]


def _run_readers(tables: list[tuple[str, dict | None]], runs: int) -> list[tuple[int, str]]:
    args = [sys.executable, "-c", READER, json.dumps(tables)]
    env = dict(os.environ, PYTHONFAULTHANDLER="1")

    def one(_: int) -> tuple[int, str]:
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            return -1, "no exit in 60 s (a hang at exit)"
        return done.returncode, done.stdout.strip() or done.stderr[-1500:]

    with ThreadPoolExecutor(2) as pool:  # two at a time: the machine's cores busy
        return list(pool.map(one, range(runs)))


def _assert_all_clean(results: list[tuple[int, str]]) -> None:
    expected = json.dumps([ROWS * VERSIONS, 10, ROWS * VERSIONS, 10])
    bad = [(code, out) for code, out in results if code != 0 or out != expected]
    assert not bad, f"{len(bad)} of {len(results)} runs: {bad[:3]}"


@pytest.mark.timeout(300)
def test_reader_processes_exit_0(tmp_path: Path, embedded_s3: EmbeddedS3, s3_bucket: str) -> None:
    _assert_all_clean(_run_readers(_tables(tmp_path, embedded_s3, s3_bucket), runs=6))


@pytest.mark.slow  # the measurement's size: 100 runs
@pytest.mark.timeout(1800)
def test_reader_processes_exit_0_many_times(
    tmp_path: Path, embedded_s3: EmbeddedS3, s3_bucket: str
) -> None:
    _assert_all_clean(_run_readers(_tables(tmp_path, embedded_s3, s3_bucket), runs=100))
