"""The demo's closing "read it" lines work as printed on the machine the demo ran on: each is
run in a shell against a real Delta table and must print its row count (no download, no
command the install does not provide)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from rayconnect.demo.sink import read_commands


def test_each_printed_read_command_reads_the_table(tmp_path: Path) -> None:
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"offset": list(range(7))}))
    polars, duck = read_commands(str(table))

    out = subprocess.run(["bash", "-c", polars], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "shape: (7, 1)" in out.stdout

    out = subprocess.run(["bash", "-c", duck], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3] == "7"  # the count's one cell: "│ 7 │", then the bottom edge
