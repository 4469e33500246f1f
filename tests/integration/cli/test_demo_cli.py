"""``rayconnect demo`` end to end, as a user runs it: a subprocess, its exit code, its live
view (rounds, kills, recoveries), its summary, and the table it leaves, read back
independently with Polars."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest


def _demo(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayconnect.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(os.environ, **env),
    )


def _demo_run(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """The demo into ``tmp_path/table`` (its Ray and Spark scratch: a folder it removes)."""
    return _demo(*args, "--table", str(tmp_path / "table"), timeout=timeout)


def assert_table_holds_exactly(table: Path, per_partition: int, partitions: int) -> None:
    """Read back with Polars, independently of the demo's own check."""
    df = pl.read_delta(str(table))
    assert df.height == per_partition * partitions
    assert df.select(["topic", "partition", "offset"]).unique().height == df.height
    by_partition = df.group_by("partition").agg(
        pl.col("offset").min().alias("lo"), pl.col("offset").max().alias("hi"), pl.len()
    )
    assert sorted(by_partition.rows()) == [
        (p, 0, per_partition - 1, per_partition) for p in range(partitions)
    ]


# The chaos demo with its defaults runs where the README and Getting started tell a newcomer
# to run it: test_docs_commands.py runs their blocks as written, with every check of its
# output and table that this file's own demo test made.


@pytest.mark.slow  # the chaos demo (test_docs_commands.py) covers the same path, plus the kills
@pytest.mark.timeout(400)
def test_demo_without_chaos_kills_nothing_and_is_exactly_once(tmp_path: Path) -> None:
    done = _demo_run(
        tmp_path,
        "--records",
        "8000",
        "--rate",
        "2000",
        "--partitions",
        "2",
        "--no-chaos",
        "--interval",
        "1",
        timeout=370,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "chaos off" in out
    assert "CHAOS" not in out and "killed  " not in out
    assert "result             OK: exactly once" in out
    assert_table_holds_exactly(tmp_path / "table", 4_000, 2)


@pytest.mark.timeout(400)
def test_source_demo_kills_both_tasks_and_reads_back_every_record_once_in_order() -> None:
    """The broker lives in the demo's process, so what it read back is checked from its
    report: counts per source partition, order, committed source offsets. 4 partitions on 2
    tasks: each task has work left when it is killed, so its successor must commit."""
    done = _demo(
        "--source", "--records", "12000", "--rate", "1000", "--partitions", "4", timeout=370
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert re.search(r"CHAOS   SIGKILL task 0 \(pid \d+\)", out)
    assert "CHAOS   ray.kill task 1" in out
    assert out.count("RECOVERED from the task ") == 2, out
    live = re.findall(r"transactions ([\d,]+) committed / [\d,]+ aborted \| records", out)
    assert len(live) >= 8 and int(live[-1].replace(",", "")) > 5
    assert "read_committed     12,000 records; in the topic " in out
    assert "per partition      p0=3,000, p1=3,000, p2=3,000, p3=3,000 each 0..n-1 in order" in out
    offsets = ", ".join(f'{{"generator":{p}}}={{"seq":2999}}' for p in range(4))
    assert f"source offsets     {offsets}" in out
    assert "result             OK: exactly once" in out


@pytest.mark.slow  # ~2 min quiet, 5 under load: longer than CI's budget allows
@pytest.mark.timeout(900)
def test_database_demo_mirrors_a_shop_through_kills(tmp_path: Path) -> None:
    """``rayconnect demo --database``: Postgres -> source -> Kafka -> one sink -> a Delta
    table per Postgres table, the source task and the sink coordinator killed; the demo's
    verdict compares each lake table with ``SELECT *``. The lake is read back here too: the
    row counts the demo printed, each key once."""
    lake = tmp_path / "lake"
    done = _demo(
        "--database", "--tables", "4", "--records", "3000", "--rate", "300",
        "--table", str(lake), timeout=870,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "rayconnect demo --database: 4 shop tables" in out
    assert re.search(r"CHAOS   SIGKILL source task \(pid \d+\)", out), out
    assert "CHAOS   ray.kill sink coordinator" in out
    assert out.count("RECOVERED from the ") == 2, out
    # the live lag table, one row per table
    rows = re.findall(
        r"^    (customers|products|orders|order_lines) +[\d,]+ +\S+ +\S+ +\S+$", out, re.M
    )
    assert {"customers", "products", "orders", "order_lines"} <= set(rows), out
    assert (
        "result             OK: every lake table equals SELECT * of its Postgres table (4 tables)"
        in out
    )
    for table in ("customers", "products", "orders", "order_lines"):
        printed = re.search(rf"^    {table} +([\d,]+) rows in Postgres, ([\d,]+) in ", out, re.M)
        assert printed is not None and printed[1] == printed[2], out
        df = pl.read_delta(str(lake / table))
        assert df.height == int(printed[1].replace(",", "")) == df["id"].n_unique()


@pytest.mark.timeout(60)
def test_database_demo_without_postgres_says_how_to_get_it() -> None:
    done = _demo("--database", timeout=50, env={"RAYCONNECT_PG_BIN": "/nonexistent"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(
        "rayconnect: PostgreSQL 15 server binaries not found in /nonexistent: install "
        "PostgreSQL 15 (Debian/Ubuntu: apt-get install postgresql-15"
    ), done.stderr
    assert "RAYCONNECT_PG_BIN" in done.stderr


@pytest.mark.timeout(60)
def test_demo_refuses_an_existing_table(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    done = _demo("--table", str(tmp_path), timeout=50)
    assert done.returncode == 2
    assert "already holds a Delta table" in done.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "bad",
    [
        ["--records", "0"],
        ["--partitions", "-1"],
        ["--rate", "0"],
        ["--interval", "0"],
        ["--source", "--table", "/tmp/t"],
        ["--source", "--database"],
        ["--database", "--tables", "21"],
        ["--nope"],
    ],
)
def test_bad_arguments_exit_2_with_a_message(bad: list[str]) -> None:
    done = _demo(*bad, timeout=25)
    assert done.returncode == 2
    assert "usage: rayconnect" in done.stderr
    assert "error:" in done.stderr


def run_then_ctrl_c(
    args: list[str],
    env: dict[str, str],
    while_running: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """``rayconnect run ARGS`` in its own process group (as a terminal job); once two rounds
    committed, ``while_running(output so far)``, then SIGINT the whole group as Ctrl-C does;
    it must exit 0. Returns its output."""
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
        if while_running is not None:
            while_running(list(lines))
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


@pytest.mark.slow  # `rayconnect run` itself is in the job-submit test; this is its Ctrl-C path
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
