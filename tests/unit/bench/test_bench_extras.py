"""``python bench/run.py`` without the bench extra stops before running anything, naming
what is missing and the pip command (issue 39.7)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

from extras import INSTALL, missing, require_bench_extras  # noqa: E402


def test_missing_modules_are_named_with_the_pip_command() -> None:
    assert missing(installed=lambda name: True) == []
    assert missing(installed=lambda name: name != "matplotlib") == ["matplotlib"]
    with pytest.raises(SystemExit) as stopped:
        require_bench_extras(installed=lambda name: False)
    assert "matplotlib, psutil not installed" in str(stopped.value)
    assert INSTALL in str(stopped.value)
    require_bench_extras(installed=lambda name: True)  # all there: nothing happens


@pytest.mark.timeout(60)
def test_run_py_without_matplotlib_stops_before_any_scenario() -> None:
    """The real script, matplotlib refused by the interpreter (as if not installed)."""
    code = (
        "import runpy, sys; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['run.py', '--only', 'a']; runpy.run_path({str(BENCH / 'run.py')!r}, "
        "run_name='__main__')"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "matplotlib not installed" in done.stderr and INSTALL in done.stderr
    assert "scenario" not in done.stdout + done.stderr
    assert time.monotonic() - started < 30  # nothing ran
