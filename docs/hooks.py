"""mkdocs hooks: the settings reference rendered from the settings Structs, and the
repository's files that the pages link to (benchmarks, examples) served beside them.

Links are written as the repository lays files out (``../../bench/README.md`` from
``docs/guides/``), so they work when browsing the repository; here they are rewritten to
where each file lands in the site, and ``mkdocs build --strict`` fails on any that points
nowhere.
"""

from __future__ import annotations

import importlib
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

from rayconnect.struct_docs import describe

ROOT = Path(__file__).resolve().parents[1]

#: Files outside docs/ that pages link to, served at their repository path.
OUTSIDE = ["bench/README.md", "bench/results/**/*", "examples/*", "cluster.yaml"]

#: (heading, the Struct, where a user gives it): every settings Struct of the API, in the
#: order a pipeline is written.
REFERENCE = [
    (
        "Sink pipeline",
        "rayconnect.config.sink:SinkPipelineConfig",
        "`rc.SinkPipeline(name, source, sink, ...)`; a `kind: sink` pipeline file's top level",
    ),
    (
        "KafkaSource",
        "rayconnect.config.sink:KafkaSource",
        "`rc.KafkaSource(...)`; a pipeline file's `source:` block",
    ),
    (
        "CommitSettings",
        "rayconnect.protocol.settings:CommitSettings",
        "`rc.SinkPipeline(..., commit_interval_s=5)` (as keywords) or "
        "`commit=rc.CommitSettings(...)`; a pipeline file's `commit:` block",
    ),
    (
        "DeltaSink",
        "rayconnect.config.sink:DeltaSink",
        "`rc.DeltaSink(path, ...)`; a pipeline file's `sink:` block",
    ),
    (
        "CompactSettings",
        "rayconnect.protocol.upkeep:CompactSettings",
        "`rc.DeltaSink(..., compact=rc.CompactSettings(...))`; `sink: {compact: {...}}`",
    ),
    (
        "LogSettings",
        "rayconnect.protocol.upkeep:LogSettings",
        "`rc.DeltaSink(..., log=rc.LogSettings(...))`; `sink: {log: {...}}`",
    ),
    (
        "IcebergSink",
        "rayconnect.config.sink:IcebergSink",
        "`rc.IcebergSink(table, ...)`; `sink: {type: iceberg, ...}`",
    ),
    (
        "RestCatalog",
        "rayconnect.config.rest_catalog:RestCatalog",
        "`rc.IcebergSink(..., rest_catalog=rc.RestCatalog(uri, warehouse, ...))`; "
        "`sink: {type: iceberg, rest_catalog: {...}}`",
    ),
    (
        "Routes",
        "rayconnect.config.routes:Routes",
        "`rc.DeltaSink(..., routes=rc.Routes(rules=(...)))`; `sink: {routes: {...}}`",
    ),
    (
        "Route",
        "rayconnect.config.routes:Route",
        "`rc.Route(table, topic=...)`; each entry of `sink: {routes: {rules: [...]}}`",
    ),
    (
        "SparkSettings",
        "rayconnect.config.spark:SparkSettings",
        "`rc.SinkPipeline(..., spark=rc.SparkSettings(...))`; a pipeline file's `spark:` block",
    ),
    (
        "Placement",
        "rayconnect.config.placement:Placement",
        "`rc.SinkPipeline(..., placement=rc.Placement(...))`; a pipeline file's `placement:` block",
    ),
    (
        "Source pipeline",
        "rayconnect.config.source:SourceSettings",
        "`rc.SourcePipeline(name, task, target, ...)`; a `kind: source` pipeline file's top level",
    ),
    (
        "KafkaTarget",
        "rayconnect.config.source:KafkaTarget",
        "`rc.KafkaTarget(bootstrap_servers)`; a source pipeline file's `target:` block",
    ),
    (
        "FileSource",
        "rayconnect.source_tasks.files:FileSourceSettings",
        "`rc.FileSource(path, topic, ...)`; `task: {type: files, ...}`",
    ),
    (
        "DeltaTableSource",
        "rayconnect.source_tasks.delta:DeltaTableSettings",
        "`rc.DeltaTableSource(path, topic, ...)`; `task: {type: delta, ...}`",
    ),
    (
        "GeneratorSource",
        "rayconnect.source_tasks.generator:GeneratorSettings",
        "`rc.GeneratorSource(topic, ...)`; `task: {type: generator, ...}`",
    ),
]


#: The status a sink pipeline reports (``handle.status()``, ``rayconnect status --json``).
STATUS_REFERENCE = [
    (
        "PipelineStatus",
        "rayconnect.protocol.status:PipelineStatus",
        "`handle.status()`; `rayconnect status NAME --json` prints exactly its JSON",
    ),
    ("RoundCounts", "rayconnect.protocol.status:RoundCounts", "`status.rounds_since_start`"),
    (
        "PartitionStatus",
        "rayconnect.protocol.status:PartitionStatus",
        "`status.partition_status[key]`",
    ),
    ("WriterStatus", "rayconnect.protocol.status:WriterStatus", "`status.writer`"),
    ("UpkeepStatus", "rayconnect.protocol.upkeep:UpkeepStatus", "`status.upkeep`"),
    (
        "CommitOutcome",
        "rayconnect.protocol.commit_outcome:CommitOutcome",
        "`status.last_failed_commit`",
    ),
    (
        "ActorStatus",
        "rayconnect.protocol.status:ActorStatus",
        "`status.actors` (with `handle.status(actors=True)`; `rayconnect status` asks for them)",
    ),
    ("StopResult", "rayconnect.protocol.status:StopResult", "`handle.stop()`"),
]


def struct(path: str) -> type:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("``", "`")


SETTINGS_INTRO = [
    "# Settings reference",
    "",
    "Generated from the settings Structs themselves (`docs/hooks.py`): each default is the",
    "Struct's, each meaning the `#:` comment above its field. At a prompt:",
    "`rayconnect.struct_docs.describe(rc.CommitSettings)`. The guides say when to change",
    "them.",
    "",
]

STATUS_INTRO = [
    "# Status reference",
    "",
    "What a sink pipeline reports about itself, generated from the status Structs",
    "(`rayconnect/protocol/status.py`). The coordinator builds a `PipelineStatus`, the handle",
    "adds what the other actors know, and `rayconnect status --json` prints exactly its JSON",
    "(`rayconnect.protocol.status.decode` reads it back). Totals come from the table",
    "(`offsets`, `dead_letters`); counts kept in memory are named `..._since_start` and start",
    "again when the coordinator restarts (`started_at`). See [Operations](../guides/operations.md).",
    "",
]


def reference(intro: list[str], entries: list[tuple[str, str, str]], verb: str) -> str:
    out = list(intro)
    for title, path, given in entries:
        cls = struct(path)
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        out += [f"## {title}", "", f"{verb} {given}.", ""]
        if doc:
            out += [" ".join(line.strip() for line in _cell(doc).splitlines()), ""]
        out += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for f in describe(cls):
            default = "(required)" if f.default is None else f"`{f.default}`"
            out.append(f"| `{f.name}` | `{_cell(f.type)}` | {_cell(default)} | {_cell(f.doc)} |")
        out.append("")
    return "\n".join(out)


def on_files(files: Files, config) -> Files:
    files.append(
        File.generated(
            config,
            "reference/settings.md",
            content=reference(SETTINGS_INTRO, REFERENCE, "Given as"),
        )
    )
    files.append(
        File.generated(
            config,
            "reference/status.md",
            content=reference(STATUS_INTRO, STATUS_REFERENCE, "Read as"),
        )
    )
    for pattern in OUTSIDE:
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file():
                uri = path.relative_to(ROOT).as_posix()
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """Relative links, written against the repository's layout, pointed at the site's."""
    uri = page.file.src_uri
    repo_path = (
        uri if page.file.abs_src_path and not _in_docs(page.file.abs_src_path) else (f"docs/{uri}")
    )

    def rewrite(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("/"):
            return m.group(0)
        in_repo = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), target))
        in_site = in_repo[len("docs/") :] if in_repo.startswith("docs/") else in_repo
        new = posixpath.relpath(in_site, posixpath.dirname(uri) or ".")
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    return _LINK.sub(rewrite, markdown)


def _in_docs(abs_path: str) -> bool:
    return Path(abs_path).resolve().is_relative_to(ROOT / "docs")
