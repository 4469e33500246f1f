"""``DeltaLog``: what rayconnect reads from a Delta table's ``_delta_log`` by itself.

Why not ask delta-rs: a ``DeltaTable`` loads the whole snapshot - every live file and every
tombstone still inside the retention - before it answers anything (1.6.6 ignores
``without_files``). A restarted coordinator needs only the txn versions (offsets, epoch) and
the table's metadata (schema, partition columns). Those are a checkpoint's ``txn`` and
``metaData`` columns (Parquet reads just those column chunks: mostly nulls, a few KB of a
checkpoint of MBs) plus the commits after it, so what recovery reads does not grow with the
table's file count or history.

The log is read as of one version (the latest by default): the checkpoint that
``_last_checkpoint`` names, then each commit after it in order, fetched by version number,
later actions winning - Delta's own replay rule for txn and metaData. Without a usable hint
(none yet, or older than the version asked for) the log is listed instead. Classic (single
or multi-part) checkpoints only, which is what delta-rs writes.
"""

from __future__ import annotations

import concurrent.futures
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

#: commits fetched at once when reading the log by version number
_PROBE = 16
#: (checkpoint version or -1, its part file names, [(version, text)] of the commits after it)
_Segment = tuple[int, list[str], list[tuple[int, str]]]

_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet$")
_COMMIT_JSON = re.compile(r"^(\d{20})\.json$")


def _actions(text: str, kinds: tuple[str, ...] | None) -> list[dict]:
    """A commit file's actions, only those of ``kinds`` (if given) parsed: one action per
    line, its kind the first key (``{"add":{...}}``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if kinds is not None:
        lines = [ln for ln in lines if ln[: ln.find(":")].strip(' {"') in kinds]
    return [json.loads(line) for line in lines]


def _commit_info(text: str) -> dict[str, Any] | None:
    """A commit file's commitInfo (None: it has none)."""
    infos = _actions(text, ("commitInfo",))
    return infos[0]["commitInfo"] if infos else None


def _replay(
    start: int, txns: dict[str, int], metadata: dict[str, Any], commits: list[tuple[int, str]]
) -> LogState:
    """The state after ``commits`` (in version order) on top of ``txns``/``metadata`` as of
    ``start``: later txn and metaData actions win (Delta's replay rule for them)."""
    for _, text in commits:
        for action in _actions(text, ("txn", "metaData")):
            if "txn" in action:
                txns[action["txn"]["appId"]] = int(action["txn"]["version"])
            else:
                metadata = action["metaData"]
    return LogState(version=commits[-1][0] if commits else start, txns=txns, metadata=metadata)


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
        ran past an old checkpoint meanwhile: read again)."""
        segment = self._segment_from_hint(version)
        try:
            read = self._read_segment(segment) if segment is not None else None
        except FileNotFoundError:  # the hint names a checkpoint that is gone
            read = None
        if read is None:
            segment = self._segment_from_listing(version)
            if segment is None:
                return None
            read = self._read_segment(segment)
        return read

    def follow(self, state: LogState | None) -> LogState | None:
        """``state`` brought up to the latest version by reading the commits after it -
        usually none or one, where ``state()`` reads a checkpoint and every commit since.
        For a reader that asks often (the writer's schema before each typed write). A whole
        read when there is no ``state`` yet, or when the entry after it is gone while the
        log went on (log cleanup passed it: the last checkpoint is newer)."""
        if state is None:
            return self.state()
        commits: list[tuple[int, str]] = []
        nxt = state.version + 1
        while (text := self._read_text(self.path(f"{nxt:020d}.json"))) is not None:
            commits.append((nxt, text))
            nxt += 1
        if commits:
            return _replay(state.version, dict(state.txns), state.metadata, commits)
        hint = self._hint()
        return self.state() if hint is not None and hint[0] > state.version else state

    def newest_commit_info(
        self, wanted: Callable[[dict[str, Any]], bool], lookback: int
    ) -> dict[str, Any] | None:
        """The commit info of the newest commit that ``wanted`` takes, among the latest
        ``lookback + 1`` commits; None if there is none (or the entries before it are gone:
        log cleanup). The commits after the last checkpoint are found as ``state`` finds
        them (by version number from the hint, else a listing); older ones are read newest
        first, ``_PROBE`` at a time. Commit info is not in checkpoints: only the commit
        entries have it."""
        segment = self._segment_from_hint(None) or self._segment_from_listing(None)
        if segment is None:
            return None
        start, _, commits = segment
        floor = max((commits[-1][0] if commits else start) - lookback, 0)
        for version, text in reversed(commits):
            if version < floor:
                return None
            info = _commit_info(text)
            if info is not None and wanted(info):
                return info
        nxt = commits[0][0] - 1 if commits else start
        with concurrent.futures.ThreadPoolExecutor(_PROBE) as pool:
            while nxt >= floor:
                batch = list(range(nxt, max(nxt - _PROBE, floor - 1), -1))
                texts = pool.map(lambda v: self._read_text(self.path(f"{v:020d}.json")), batch)
                for older in texts:
                    if older is None:
                        return None
                    info = _commit_info(older)
                    if info is not None and wanted(info):
                        return info
                nxt = batch[-1] - 1
        return None

    def _read_segment(self, segment: _Segment) -> LogState:
        start, parts, commits = segment
        txns: dict[str, int] = {}
        metadata: dict[str, Any] = {}
        for name in parts:
            got_txns, got_meta = self._read_checkpoint(self.path(name))
            txns.update(got_txns)
            metadata = got_meta or metadata
        return _replay(start, txns, metadata, commits)

    def _hint(self) -> tuple[int, int | None] | None:
        """``_last_checkpoint``'s version and part count; None if missing or unreadable."""
        hint_text = self._read_text(self.path("_last_checkpoint"))
        if hint_text is None:
            return None
        try:
            hint = json.loads(hint_text)
            n_parts = hint.get("parts")
            return int(hint["version"]), int(n_parts) if n_parts else None
        except (ValueError, KeyError, TypeError):
            return None

    def _segment_from_hint(self, version: int | None) -> _Segment | None:
        """The last checkpoint from ``_last_checkpoint`` and the commits after it, read by
        version number until one is missing - no listing: a log keeps every entry of its
        retention (~300,000 at a 2 s interval and a week), and a LIST of them is hundreds
        of requests on an object store. None: no usable hint (then list)."""
        hint = self._hint()
        if hint is None:
            return None
        start, n_parts = hint
        if version is not None and version < start:
            return None
        if n_parts:
            parts = [
                f"{start:020d}.checkpoint.{i:010d}.{n_parts:010d}.parquet"
                for i in range(1, n_parts + 1)
            ]
        else:
            parts = [f"{start:020d}.checkpoint.parquet"]
        commits = self._commits_after(start, version)
        if commits is None:
            return None
        return start, parts, commits

    def _commits_after(self, start: int, version: int | None) -> list[tuple[int, str]] | None:
        """The texts of commits ``start+1 ..`` (up to ``version``, or while they exist),
        fetched ``_PROBE`` at a time. None if one up to ``version`` is missing."""
        commits: list[tuple[int, str]] = []
        with concurrent.futures.ThreadPoolExecutor(_PROBE) as pool:
            nxt = start + 1
            while version is None or nxt <= version:
                batch = list(range(nxt, nxt + _PROBE))
                if version is not None:
                    batch = [v for v in batch if v <= version]
                texts = pool.map(lambda v: self._read_text(self.path(f"{v:020d}.json")), batch)
                for v, text in zip(batch, texts, strict=True):
                    if text is None:
                        return None if version is not None else commits
                    commits.append((v, text))
                nxt = batch[-1] + 1
        return commits

    def _segment_from_listing(self, version: int | None) -> _Segment | None:
        names = self.names()
        versions = sorted(int(m.group(1)) for n in names if (m := _COMMIT_JSON.match(n)))
        if version is None:
            version = max(versions, default=-1)
        checkpoints: dict[int, list[str]] = {}
        for name in names:
            m = _CHECKPOINT.match(name)
            if m and int(m.group(1)) <= version:
                checkpoints.setdefault(int(m.group(1)), []).append(name)
        start = max(checkpoints, default=-1)
        if start < 0 and not versions:
            return None
        commits = []
        for v in range(start + 1, version + 1):
            text = self._read_text(self.path(f"{v:020d}.json"))
            if text is None:
                raise FileNotFoundError(f"{self.path(f'{v:020d}.json')} is gone")
            commits.append((v, text))
        return start, sorted(checkpoints.get(start, [])), commits

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
