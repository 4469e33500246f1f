"""``rayconnect demo`` end to end, as a user runs it: a subprocess, its exit code, its summary,
and the table it leaves, read back independently with Polars."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest


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
    assert df.group_by("partition").agg(pl.col("offset").max())["offset"].to_list() == [9999] * 3


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


def run_then_ctrl_c(args: list[str], env: dict[str, str]) -> list[str]:
    """``rayconnect run ARGS`` in its own process group (as a terminal job); once two rounds
    committed, SIGINT the whole group as Ctrl-C does; it must exit 0. Returns its output."""
    import os
    import signal
    import threading

    proc = subprocess.Popen(
        [sys.executable, "-m", "rayconnect.cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal job has
        env=dict(os.environ, **env),
    )
    lines: list[str] = []
    committed = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "rounds 2 committed" in line:  # data flows, more keeps coming (--demo-rate)
                committed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert committed.wait(240), "".join(lines)[-3000:]
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert proc.wait(120) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    return lines


def committed_at_stop(lines: list[str]) -> int:
    """The total of committed offsets on run's ``stopped NAME: ...`` line."""
    stopped = next(line for line in lines if line.startswith("stopped orders:"))
    return int(stopped.rsplit("offsets ", 1)[1].split()[0].replace(",", ""))


@pytest.mark.timeout(300)
def test_run_in_the_foreground_commits_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    """``rayconnect run FILE --embedded-broker`` in a terminal: Ctrl-C signals the whole
    foreground process group (run, its local Ray, its brokers). Run must still commit what
    it read in one last round and exit 0, with every record in the table once."""
    example = Path(__file__).resolve().parents[3] / "examples" / "orders-sink.yaml"
    table = tmp_path / "orders"
    lines = run_then_ctrl_c(
        [str(example), "--embedded-broker"]
        + ["--demo-records", "3000", "--demo-rate", "500", "--interval", "1"],
        {"ORDERS_TABLE": str(table)},
    )
    out = "".join(lines)
    assert "SIGINT: committing what was read, then stopping..." in out
    total = committed_at_stop(lines)
    df = pl.read_delta(str(table))
    assert df.height == total > 3000  # the demo rate kept producing after the first 3,000
    assert df.select(["partition", "offset"]).unique().height == total
