"""``DeltaLog``: what rayconnect reads from a Delta table's ``_delta_log`` by itself.

Why not ask delta-rs: a ``DeltaTable`` loads the whole snapshot - every live file and every
tombstone still inside the retention - before it answers anything (1.6.6 ignores
``without_files``). A restarted coordinator needs only the txn versions (offsets, epoch) and
the table's metadata (schema, partition columns). Those are a checkpoint's ``txn`` and
``metaData`` columns (Parquet reads just those column chunks: mostly nulls, a few KB of a
checkpoint of MBs) plus the commits after it, so what recovery reads does not grow with the
table's file count or history.

The log is read as of one version (the latest by default): the newest checkpoint at or
below it, then each commit after it in order, later actions winning - Delta's own replay
rule for txn and metaData. Classic (single or multi-part) checkpoints only, which is what
delta-rs writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import PostCommitHookProperties

from rayconnect.storage.location import TableLocation

#: Post-commit hooks of every commit rayconnect makes: checkpoints yes, expired-log cleanup
#: no - that is upkeep's tidy alone. delta-rs runs the cleanup after each checkpoint it
#: writes; two cleanups at once (a round's commit and tidy, or a compaction) race to delete
#: the same entries, and the loser's commit fails with "...json not found" although it
#: committed (seen in the 5,000-round soak).
NO_LOG_CLEANUP = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)

_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet$")
_COMMIT_JSON = re.compile(r"^(\d{20})\.json$")


def _actions(text: str, kinds: tuple[str, ...] | None) -> list[dict]:
    """A commit file's actions, only those of ``kinds`` (if given) parsed: one action per
    line, its kind the first key (``{"add":{...}}``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if kinds is not None:
        lines = [ln for ln in lines if ln[: ln.find(":")].strip(' {"') in kinds]
    return [json.loads(line) for line in lines]


class LogState(msgspec.Struct, frozen=True):
    """The txn versions and the metadata of a table as of ``version``."""

    version: int
    #: app id -> txn version
    txns: dict[str, int]
    #: the last metaData action (``schemaString``, ``partitionColumns``, ``configuration``)
    metadata: dict[str, Any]

    def arrow_schema(self) -> pa.Schema:
        from deltalake import Schema

        return pa.schema(Schema.from_json(self.metadata["schemaString"]).to_arrow())

    @property
    def partition_columns(self) -> list[str]:
        return list(self.metadata.get("partitionColumns") or [])


class DeltaLog:
    """Reads ``<table>/_delta_log`` through the table's filesystem (local or object store)."""

    def __init__(self, location: TableLocation, filesystem: Callable[[], Any]) -> None:
        self._location = location
        self._filesystem = filesystem

    def path(self, name: str) -> str:
        return self._location.path(f"_delta_log/{name}")

    def names(self) -> list[str]:
        """File names in ``_delta_log`` (one LIST on an object store; [] if it is missing)."""
        from pyarrow import fs

        selector = fs.FileSelector(self.path(""), allow_not_found=True)
        infos = self._filesystem().get_file_info(selector)
        return [i.base_name for i in infos if i.type == fs.FileType.File]

    def checkpoint_versions(self) -> list[int]:
        """Versions with a checkpoint in the log, oldest first."""
        return sorted({int(m.group(1)) for n in self.names() if (m := _CHECKPOINT.match(n))})

    def commit_actions(self, version: int) -> list[dict]:
        """The actions of commit ``version``; [] if its log entry is gone (log cleanup)."""
        return self.read_commit(self.path(f"{version:020d}.json"))

    def read_commit(self, path: str, kinds: tuple[str, ...] | None = None) -> list[dict]:
        """The actions of one commit file ([] if it is gone: log cleanup); with ``kinds``
        only actions of those kinds are parsed (a round's commit is mostly add lines with
        their stats, which recovery does not need)."""
        text = self._read_text(path)
        return [] if text is None else _actions(text, kinds)

    def _read_text(self, path: str) -> str | None:
        try:
            with self._filesystem().open_input_stream(path) as fh:
                return fh.read().decode("utf-8")
        except FileNotFoundError:
            return None

    def state(self, version: int | None = None) -> LogState | None:
        """Txn versions and metadata as of ``version`` (latest if None); None if the table
        has no log. Raises ``FileNotFoundError`` if a commit it needs is gone (log cleanup
        ran past an old checkpoint between the listing and the read: read again)."""
        names = self.names()
        commits = sorted(int(m.group(1)) for n in names if (m := _COMMIT_JSON.match(n)))
        if version is None:
            version = max(commits, default=-1)
        checkpoints: dict[int, list[str]] = {}
        for name in names:
            m = _CHECKPOINT.match(name)
            if m and int(m.group(1)) <= version:
                checkpoints.setdefault(int(m.group(1)), []).append(name)
        start = max(checkpoints, default=-1)
        if start < 0 and not commits:
            return None
        txns: dict[str, int] = {}
        metadata: dict[str, Any] = {}
        for name in sorted(checkpoints.get(start, [])):
            got_txns, got_meta = self._read_checkpoint(self.path(name))
            txns.update(got_txns)
            metadata = got_meta or metadata
        for v in range(start + 1, version + 1):
            path = self.path(f"{v:020d}.json")
            text = self._read_text(path)
            if text is None:
                raise FileNotFoundError(f"{path} is gone")
            for action in _actions(text, ("txn", "metaData")):
                if "txn" in action:
                    txns[action["txn"]["appId"]] = int(action["txn"]["version"])
                elif "metaData" in action:
                    metadata = action["metaData"]
        return LogState(version=version, txns=txns, metadata=metadata)

    def _read_checkpoint(self, path: str) -> tuple[dict[str, int], dict[str, Any]]:
        """A checkpoint part's txn rows and metaData (if this part has it)."""
        fs = self._filesystem()
        columns = [c for c in ("txn", "metaData") if c in pq.read_schema(path, filesystem=fs).names]
        table = pq.read_table(path, columns=columns, filesystem=fs)
        txns: dict[str, int] = {}
        if "txn" in columns:
            # A checkpoint row per add/remove too: only the few txn rows become Python.
            rows = table.column("txn").drop_null()
            apps = pc.struct_field(rows, "appId").to_pylist()
            versions = pc.struct_field(rows, "version").to_pylist()
            txns = {a: int(v) for a, v in zip(apps, versions, strict=True) if a is not None}
        metadata: dict[str, Any] = {}
        if "metaData" in columns:
            meta = table.column("metaData").drop_null().to_pylist()
            if meta:
                metadata = meta[-1]
                # Parquet keeps a map as (key, value) pairs; the JSON log as an object
                conf = metadata.get("configuration")
                if isinstance(conf, list):
                    metadata["configuration"] = dict(conf)
        return txns, metadata
