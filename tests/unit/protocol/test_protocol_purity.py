"""protocol/ must stay pure: no IO library may be imported by any of its modules.

Checked two ways: statically (the import statements of every file) and dynamically (importing
the package in a fresh interpreter must not load any of those libraries transitively).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rayconnect.protocol

FORBIDDEN = {"ray", "aiokafka", "pyspark", "raydp", "deltalake", "pyarrow"}
PACKAGE_DIR = Path(rayconnect.protocol.__file__).parent


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_protocol_module_imports_an_io_library() -> None:
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    assert files, "protocol package has no modules?"
    offenders = {str(f.name): _imported_roots(f) & FORBIDDEN for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_protocol_loads_no_io_library() -> None:
    code = (
        "import sys, importlib; importlib.import_module('rayconnect.protocol');"
        "import pkgutil, rayconnect.protocol as p;"
        "[importlib.import_module('rayconnect.protocol.' + m.name) "
        " for m in pkgutil.iter_modules(p.__path__)];"
        f"print(sorted(set(m.split('.')[0] for m in sys.modules) & {FORBIDDEN!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
