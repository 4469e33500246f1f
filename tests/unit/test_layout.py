"""The package's shape, checked: no import cycles between modules (not even through imports
placed inside functions, which only hide a cycle) nor between packages (the subpackages and
top-level modules of ``rayconnect`` form a DAG: each can be read knowing only those below
it), no private name used outside its module, no test code
shipped in the package, and the pure ``protocol`` kept pure (see test_protocol_purity)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "rayconnect"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    _module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts
}


def _resolve(name: str) -> str | None:
    """The module a dotted import names: itself, or its parent for ``from m import obj``."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, int, list[str]]]:
    """(imported module, line, imported names) for every import statement, anywhere."""
    tree = ast.parse(MODULES[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rayconnect") and (target := _resolve(alias.name)):
                    found.append((target, node.lineno, []))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("rayconnect"):
                continue
            for alias in node.names:
                target = _resolve(f"{node.module}.{alias.name}")
                if target:
                    found.append((target, node.lineno, [alias.name]))
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _, _ in _imports(module):
            # A package's __init__ re-exporting its own modules is not a cycle of design.
            if target != module and not target.startswith(module + "."):
                graph[module].add(target)
    return graph


def _package(module: str) -> str:
    """The subpackage of ``rayconnect`` a module is in; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        mine = _package(module)
        packages.setdefault(mine, set()).update(_package(t) for t in targets if _package(t) != mine)
        for target in targets:
            packages.setdefault(_package(target), set())
    return packages


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_modules_were_found() -> None:
    assert "rayconnect.protocol.coordinator" in MODULES
    assert "rayconnect.pipelines.sink" in MODULES


def test_no_import_cycles_even_through_function_level_imports() -> None:
    assert _cycles(_graph()) == []


def test_no_import_cycles_between_packages() -> None:
    assert _cycles(_package_graph(_graph())) == []


def test_the_package_check_finds_a_cycle_no_module_is_in() -> None:
    modules = {
        "rayconnect.a.x": {"rayconnect.b.y"},
        "rayconnect.b.y": set(),
        "rayconnect.b.z": {"rayconnect.a.w"},
        "rayconnect.a.w": set(),
        "rayconnect.c": {"rayconnect.a.x"},
    }
    assert _cycles(modules) == []
    assert _cycles(_package_graph(modules)) == [["rayconnect.a", "rayconnect.b"]]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_name_is_imported_from_another_module() -> None:
    offenders = [
        f"{module}:{line} imports {name} from {target}"
        for module in MODULES
        for target, line, imported in _imports(module)
        for name in imported
        if name.startswith("_") and target != module
    ]
    assert offenders == []


@pytest.mark.parametrize("test_only", ["pytest", "hypothesis"])
def test_no_test_code_in_the_package(test_only: str) -> None:
    users = [
        m
        for m, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            (getattr(node, "module", None) or alias.name).split(".")[0] == test_only
            for alias in node.names
        )
    ]
    assert users == []


def test_no_fault_point_for_tests_in_the_package() -> None:
    """A test's fault (a process dying at the moment that matters) is installed from the
    tests (``tests/integration/pipelines/fault_points.py``: Ray's worker setup hook), never
    switched on in the package by a variable only tests set."""
    users = [m for m, path in MODULES.items() if "RAYCONNECT_TEST_" in path.read_text()]
    assert users == []


def test_the_coordinator_does_not_know_which_committer_it_has() -> None:
    """One round-commit path: one table or a routed sink's tables are one contract
    (``tables.round_committer.RoundCommitter``); only ``tables.sink_tables`` picks one."""
    imported = {target for target, _, _ in _imports("rayconnect.actors.coordinator")}
    assert "rayconnect.tables.table_set" not in imported
    text = MODULES["rayconnect.actors.coordinator"].read_text()
    assert "TableSet" not in text and "isinstance(self.committer" not in text


def test_the_core_imports_no_demo_module() -> None:
    """The demos, their workloads and chaos (``rayconnect.demo``) show the product; the
    product never needs them. Only the command line starts a demo."""
    users = sorted(
        module
        for module in MODULES
        if not module.startswith(("rayconnect.demo", "rayconnect.cli"))
        for target, _, _ in _imports(module)
        if target.startswith("rayconnect.demo")
    )
    assert users == []


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by basename (tests/ has no packages): a second
    ``test_x.py`` anywhere stops the whole run at collection, not just its own tests."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for p in tests.rglob("*.py"):
        if p.name != "conftest.py" and "__pycache__" not in p.parts:
            seen.setdefault(p.name, []).append(str(p.relative_to(tests)))
    assert {n: ps for n, ps in seen.items() if len(ps) > 1} == {}
