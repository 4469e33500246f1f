"""``rayconnect demo`` end to end, as a user runs it: a subprocess, its exit code, its summary,
and the table it leaves, read back independently with Polars."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

pytestmark = [pytest.mark.integration]


def _demo(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayconnect.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(700)
def test_demo_round_trip_is_exactly_once(tmp_path: Path) -> None:
    table = tmp_path / "table"
    done = _demo("--records", "30000", "--partitions", "3", "--table", str(table))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "OK: exactly once" in done.stdout
    assert "30,000 (30,000 distinct" in done.stdout
    assert "local/demo-events/0=10000" in done.stdout
    df = pl.read_delta(str(table))
    assert df.height == 30_000
    assert df.select(["partition", "offset"]).unique().height == 30_000
    assert sorted(df["partition"].unique().to_list()) == [0, 1, 2]
    assert df.group_by("partition").agg(pl.col("offset").max())["offset"].to_list() == [
        9999
    ] * 3


@pytest.mark.timeout(60)
def test_demo_refuses_an_existing_table(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    done = _demo("--table", str(tmp_path), timeout=50)
    assert done.returncode == 2
    assert "already holds a Delta table" in done.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [["--records", "0"], ["--partitions", "-1"], ["--nope"]])
def test_bad_arguments_exit_2_with_a_message(bad: list[str]) -> None:
    done = _demo(*bad, timeout=25)
    assert done.returncode == 2
    assert "usage: rayconnect" in done.stderr
    assert "error:" in done.stderr
