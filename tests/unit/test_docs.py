"""The documentation stays true to the code: the README's layout names every package, the
settings reference documents every field of every settings Struct it renders, and docstrings
point at the design inside the repository."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from rayconnect.protocol.settings import CommitSettings
from rayconnect.struct_docs import FieldDoc, describe

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "rayconnect"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_layout_names_every_package() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    listed = set(re.findall(r"^  (\w+)/", layout, flags=re.MULTILINE))
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages - listed == set()
    assert listed - packages == set()


def test_a_fields_doc_default_and_type_come_from_the_struct() -> None:
    fields = {f.name: f for f in describe(CommitSettings)}
    assert fields["write_timeout_s"] == FieldDoc(
        name="write_timeout_s",
        type="float",
        default="60.0",
        doc="how long the coordinator waits for WRITE-STATUS after END before committing the "
        "partitions that reported",
    )
    assert fields["flush_max_bytes"].default == "67_108_864"
    assert list(fields) == [f for f in CommitSettings.__struct_fields__]


@pytest.mark.parametrize(
    "title,path", [(t, p) for t, p, _ in [*_hooks().REFERENCE, *_hooks().STATUS_REFERENCE]]
)
def test_every_field_in_the_settings_and_status_references_is_documented(title: str, path: str) -> None:
    undocumented = [f.name for f in describe(_hooks().struct(path)) if not f.doc]
    assert undocumented == [], f"{title}: add a '#:' comment above each of these fields"


def test_docstrings_point_at_the_design_in_the_repository() -> None:
    stale = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")])
        if p != Path(__file__)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"(?<!docs/)design\.md|shared/design", line)
    ]
    assert stale == []
