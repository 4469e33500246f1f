"""What ``python bench/run.py`` needs beyond rayconnect (pyproject's ``bench`` extra),
checked before anything runs: without it the scenarios would run for an hour and the
plots fail at the end."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

#: the modules run.py and its helpers import (plots, process memory)
BENCH_MODULES = ("matplotlib", "psutil")
INSTALL = 'pip install -e ".[test,bench]"'


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # in sys.modules as None: import refused
        return False


def missing(
    modules: Sequence[str] = BENCH_MODULES, installed: Callable[[str], Any] = _installed
) -> list[str]:
    return [name for name in modules if not installed(name)]


def require_bench_extras(installed: Callable[[str], Any] = _installed) -> None:
    """SystemExit naming the missing modules and the pip command, or nothing."""
    absent = missing(installed=installed)
    if absent:
        raise SystemExit(
            f"bench/run.py needs the bench extra ({', '.join(absent)} not installed): "
            f"{INSTALL} (from the repository's root, in rayconnect's environment)"
        )
