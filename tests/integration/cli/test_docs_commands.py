"""The shell blocks of the README and Getting started run as written, so a guide cannot drift
from the product.

How: every ```` ```bash ```` block of ``PAGES`` is read out of the page
(``tests/markdown_blocks.py``: editing the page changes what runs) and run by ``bash -e -o
pipefail`` in a fresh folder that looks like the clone a reader typed it in (``.venv`` and
``examples/`` are links to this repository's), with the project's venv first on PATH, under a
timeout; it must exit 0 and print the key lines ``CHECKS`` names for it. What is not run as
typed, and why, is in ``STAND_INS`` - two commands of the set-up block:

- the install (``python3 -m venv .venv && .venv/bin/pip install -e ".[test]"``): CI's
  ``.ci/run`` ran that very command on this clone before the tests, so the block uses that
  venv instead of installing again (``true`` stands in);
- the test command (``.venv/bin/python -m pytest``): this test is part of the suite, so it does
  not run the suite again from inside (``pytest --version`` stands in: the command exists);
  ``.ci/run`` runs the suite with that command itself.

A stand-in or a check that no longer matches any block fails (the page changed: update them);
so does a block that runs without a check. A block the page marks ``skip`` is reported as
skipped with its reason (``pytest -ra`` lists it); ``slow`` puts it in ``pytest -m slow``.
The same block on two pages (the README and Getting started open with the same two commands)
runs once, checked for both.

The demo's block replaces the test that ran ``rayconnect demo`` on its own (this is the
demo as the pages tell a newcomer to run it, defaults included); every assertion it made is
here, the table read back with Polars as before and with the two commands the demo prints.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_blocks import ShellBlock, shell_blocks
from test_demo_cli import assert_table_holds_exactly

ROOT = Path(__file__).resolve().parents[3]
PAGES = ("README.md", "docs/getting-started.md")
BLOCK_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class StandIn:
    """A command of a page that runs as ``instead`` here, and why."""

    pattern: str  # a regex over the block's text
    instead: str
    why: str


STAND_INS = (
    StandIn(
        r'python3 -m venv \.venv && \.venv/bin/pip install -e "\.\[test\]"',
        "true",
        "CI (.ci/run) ran this install on this clone; the block's .venv links to that venv",
    ),
    StandIn(
        r"(?m)^\.venv/bin/python -m pytest(?=\s*(#|$))",
        ".venv/bin/python -m pytest --version",
        "the suite runs this test: not run again from inside; .ci/run runs it itself",
    ),
)


def _as_run(text: str) -> str:
    for stand_in in STAND_INS:
        text = re.sub(stand_in.pattern, stand_in.instead, text)
    return text


# -- checks: the key output of each command, by a regex over the block's text -------------


def _check_demo(out: str) -> None:
    """``rayconnect demo`` with its defaults (40,000 records, 4 partitions, chaos on)."""
    assert "\r" not in out  # plain lines when stdout is not a terminal
    # the live view: a line a second while producing (20 s) with rounds, records and lag
    live = re.findall(
        r"rounds (\d+) committed / \d+ discarded \| records ([\d,]+) committed / ([\d,]+) "
        r"produced \| lag p0=\S+ p1=\S+ p2=\S+ p3=\S+ \| table v\d+",
        out,
    )
    assert len(live) >= 15, out
    # rounds committed data (how many depends on the machine's load), and the last line
    # shows the pipeline caught up with everything produced
    assert max(int(r) for r, _, _ in live) >= 1, out
    assert live[-1][1:] == ("40,000", "40,000"), out
    assert "dashboard http://127.0.0.1:" in out
    # every kill happened, was said, and was recovered from
    assert "CHAOS   ray.kill coordinator" in out
    assert re.search(r"CHAOS   SIGKILL participant host local/demo-events/0 \(pid \d+\)", out)
    assert re.search(r"CHAOS   SIGKILL writer \(pid \d+\)", out)
    assert out.count("RECOVERED from the ") == 3, out
    assert "killed             coordinator (ray.kill), participant host local/demo-events/0 " in out
    # the demo's own verdict, from the table: rows, distinct offsets, txn versions = watermarks
    assert "rows in table      40,000 (40,000 distinct" in out
    offsets = ", ".join(f"local/demo-events/{p}=10000" for p in range(4))
    assert f"committed offsets  {offsets}" in out
    assert f"high watermarks    {offsets}" in out
    assert "result             OK: exactly once" in out
    assert re.search(r"steps +broker [\d.]+ s, ray [\d.]+ s, start [\d.]+ s, produce", out)
    table = re.search(r"^  table +(\S+)$", out, re.M)
    assert table is not None, out
    try:
        # read back with Polars, independently of the demo's own check
        assert_table_holds_exactly(Path(table[1]), 10_000, 4)
        # and with the two commands it prints, as printed
        read_it = re.search(r"^  read it +(.+)\n {21}(.+)$", out, re.M)
        assert read_it is not None, out
        polars, duckdb = (_shell(command, 120) for command in read_it.groups())
        assert "shape: (40_000, " in polars, polars
        assert re.search(r"\b40000\b", duckdb), duckdb
    finally:
        shutil.rmtree(table[1], ignore_errors=True)  # the demo keeps its table: ours to remove


CHECKS: dict[str, Callable[[str], None]] = {
    r"rayconnect demo(?!\s+-)": _check_demo,
    r"python -m pytest --version": lambda out: _has(out, "pytest 9."),
    r"from rayconnect\.kafka\.clients import producer": lambda out: _has(out, "rows 1000"),
}


def _has(out: str, line: str) -> None:
    assert line in out, out


# -- the blocks -----------------------------------------------------------------------------


def _blocks() -> dict[str, list[ShellBlock]]:
    """Every block of every page, by the script it runs (one run for the same text twice)."""
    by_script: dict[str, list[ShellBlock]] = {}
    for page in PAGES:
        for block in shell_blocks(ROOT, page):
            by_script.setdefault(_as_run(block.text), []).append(block)
    return by_script


def _params() -> list[object]:
    params = []
    for script, blocks in _blocks().items():
        where = " = ".join(b.where for b in blocks)
        marks: list[pytest.MarkDecorator] = []
        skips = [b for b in blocks if b.mode == "skip"]
        if skips:
            marks.append(pytest.mark.skip(reason=f"{where}: {skips[0].reason}"))
        elif any(b.mode == "slow" for b in blocks):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(script, blocks, id=where, marks=marks))
    return params


def test_every_stand_in_and_check_matches_a_block_and_every_block_is_checked() -> None:
    scripts = list(_blocks())
    originals = [b.text for blocks in _blocks().values() for b in blocks]
    stale = [s.pattern for s in STAND_INS if not any(re.search(s.pattern, t) for t in originals)]
    assert stale == [], "a stand-in matches no block any more: update STAND_INS"
    unused = [p for p in CHECKS if not any(re.search(p, s) for s in scripts)]
    assert unused == [], "a check matches no block any more: update CHECKS"
    run = [(s, bs) for s, bs in _blocks().items() if all(b.mode != "skip" for b in bs)]
    unchecked = [bs[0].where for s, bs in run if not any(re.search(p, s) for p in CHECKS)]
    assert unchecked == [], "a block runs without a check of its output: add one to CHECKS"


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 300)
@pytest.mark.parametrize("script,blocks", _params())
def test_the_block_runs_as_written(script: str, blocks: list[ShellBlock]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="rayconnect-docs-"))
    try:
        for name in (".venv", "examples"):  # a clone, as far as the blocks can tell
            (folder / name).symlink_to(ROOT / name)
        out = _shell(script, BLOCK_TIMEOUT_S, cwd=folder)
        checks = [check for pattern, check in CHECKS.items() if re.search(pattern, script)]
        assert checks, f"{blocks[0].where}: no check of its output in CHECKS"
        for check in checks:
            check(out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _shell(script: str, timeout: float, cwd: Path | None = None) -> str:
    """Run ``script`` as a reader's shell would (``bash -e``: the first failing command
    ends it), the project's venv first on PATH; return its stdout (what the checks read;
    Ray logs to stderr), after asserting exit 0. On a timeout the whole process group goes
    (Ray and brokers too)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout:.0f} s:\n{script}\n{out[-4000:]}\n{err[-4000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{script}\n{out[-4000:]}\n{err[-4000:]}"
    return out
