"""The Delta commit of a merge-on-read round (``write_modes.changes.RowDelta``): deletion
vectors for the rows it replaces, remove actions for the files it drops, new data files for
its rows, and the partitions' offsets - one log entry.

Why a commit file of our own: delta-rs 1.6.6's ``create_write_transaction`` takes adds
without a ``deletionVector`` and its DELETE/MERGE rewrite files (copy-on-write), so no
delta-rs call commits a DV. The entry is written put-if-absent as version ``read + 1``: of
two writers of that version exactly one lands, so this commit is fenced against every other
commit since ``read`` - stricter than delta-rs, which rebases over commits with other app
ids. On a local disk it is a hard link (atomic and never replacing); on an object store a
conditional PUT through obstore (``storage.put_if_absent``: pyarrow's filesystems have no
conditional put, apache/arrow#44281).

Why the log is read here too: delta-rs's ``get_add_actions`` has no deletion vectors (the
column is not there, with or without ``flatten``) and ``deletion_vectors()`` gives only
masks, while a new DV must keep the rows an older one deleted and the remove must name the
old descriptor. Live files are the last checkpoint's adds plus the commits after it,
replayed by Delta's rule: a logical file is ``(path, dv unique id)``. (``DeltaLog`` reads
the log by ``_last_checkpoint`` without a LIST, for txns and metadata only; its segment
readers are private, so the adds' replay lists the log.)
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyarrow import fs as pafs
from pyroaring import BitMap64

from rayconnect.formats import partitioning
from rayconnect.formats.partitioning import PartitionSpec
from rayconnect.formats.rows import conform_to_table
from rayconnect.storage.location import TableLocation
from rayconnect.storage.put_if_absent import put_if_absent
from rayconnect.tables import delta_dv
from rayconnect.tables.base import CommitConflictError
from rayconnect.tables.delta_dv import Descriptor
from rayconnect.tables.delta_log import NO_LOG_CLEANUP, DeltaLog
from rayconnect.tables.files import delta_stats_json, describe_file
from rayconnect.write_modes.changes import RowDelta
from rayconnect.write_modes.row_delta import FileDeletes, LiveFile

#: the table feature and the property a writer of DVs needs (PROTOCOL.md "Deletion Vectors")
DV_FEATURE = "deletionVectors"
DV_PROPERTY = "delta.enableDeletionVectors"
#: the folder (the 'u' descriptor's prefix) of our DV files. delta-rs's *full* vacuum
#: lists a DV file at the table root as unreferenced although an add still names it
#: (measured: 1.6.6 knows data files only) and would delete it; it skips folders starting
#: with "_", so ours are swept by ``vacuum_dv_files`` instead.
DV_DIR = "_deletion_vectors"
#: the commitInfo operation: Spark's name for a DELETE+INSERT by key, so history views know it
OPERATION = "MERGE"
_ENGINE = "rayconnect"


# -- the table's live files ---------------------------------------------------------------


def live_files(dt: DeltaTable, location: TableLocation, filesystem: Any = None) -> list[LiveFile]:
    """Every file of the table at ``dt``'s version, with its add action as in the log."""
    fs = filesystem if filesystem is not None else location.filesystem()
    bounded = _bounded_columns(pa.schema(dt.schema().to_arrow()))
    adds = _replay_adds(DeltaLog(location, lambda: fs), fs, dt.version())
    return [_live_file(location, add, bounded) for add in adds.values()]


def _bounded_columns(schema: pa.Schema) -> set[str]:
    """Columns whose statistics the search compares as Python values (a timestamp's are
    ISO strings in the log: not comparable to the keys' values)."""
    return {
        f.name
        for f in schema
        if pa.types.is_integer(f.type)
        or pa.types.is_string(f.type)
        or pa.types.is_large_string(f.type)
    }


def _live_file(location: TableLocation, add: dict[str, Any], bounded: set[str]) -> LiveFile:
    stats = _stats(add)
    lows, highs = stats.get("minValues") or {}, stats.get("maxValues") or {}
    bounds = {
        name: (lows[name], highs[name])
        for name in bounded
        if lows.get(name) is not None and highs.get(name) is not None
    }
    return LiveFile(
        path=location.path(add["path"]),
        entry=add,
        rows=int(stats.get("numRecords") or 0),
        bounds=bounds,
        partition_values=add.get("partitionValues") or {},
    )


def _stats(add: Mapping[str, Any]) -> dict[str, Any]:
    text = add.get("stats")
    return json.loads(text) if text else {}


def _replay_adds(log: DeltaLog, filesystem: Any, version: int) -> dict[str, dict[str, Any]]:
    """path -> live add action as of ``version``: the newest checkpoint at or before it,
    then every commit after it (one LIST of the log)."""
    names = log.names()
    checkpoints = {
        int(n[:20]): n for n in names if n[20:32] == ".checkpoint." and n.endswith(".parquet")
    }
    start = max((v for v in checkpoints if v <= version), default=-1)
    live: dict[str, dict[str, Any]] = {}
    for part in sorted(
        n for n in names if start >= 0 and n.startswith(f"{start:020d}.checkpoint.")
    ):
        for add in _checkpoint_adds(log.path(part), filesystem):
            live[add["path"]] = add
    for v in range(start + 1, version + 1):
        actions = log.commit_actions(v)
        if not actions:
            raise FileNotFoundError(f"{log.path(f'{v:020d}.json')} is gone (log cleanup?)")
        _apply(live, actions)
    return live


def _apply(live: dict[str, dict[str, Any]], actions: Iterable[dict[str, Any]]) -> None:
    """One commit's file actions: a remove ends the logical file it names (same path and
    DV), so the remove of a file's old DV never ends its add with the new one."""
    for action in actions:
        if "add" in action:
            live[action["add"]["path"]] = _as_json_action(action["add"])
            continue
        if "remove" not in action:
            continue
        removed = action["remove"]
        current = live.get(removed["path"])
        if current is not None and delta_dv.dv_unique_id(current) == delta_dv.dv_unique_id(removed):
            del live[removed["path"]]


def _checkpoint_adds(path: str, fs: Any) -> list[dict[str, Any]]:
    """A checkpoint part's add actions, as ``_as_json_action`` spells them."""
    if "add" not in pq.read_schema(path, filesystem=fs).names:
        return []
    rows = pq.read_table(path, columns=["add"], filesystem=fs).column("add").drop_null()
    return [_as_json_action(add) for add in rows.to_pylist()]


def _as_json_action(add: dict[str, Any]) -> dict[str, Any]:
    """An add action as one spelling whether it came from a commit or a checkpoint: maps
    as objects, no null fields (delta-rs writes ``"tags":null``), no parsed-stats columns."""
    out: dict[str, Any] = {}
    for key, value in add.items():
        if value is None or key.endswith("_parsed"):
            continue
        if key in ("partitionValues", "tags") and isinstance(value, list):
            value = dict(value)
        elif key == "deletionVector":
            value = {k: v for k, v in value.items() if v is not None}
        out[key] = value
    out.setdefault("partitionValues", {})
    return out


# -- the table feature --------------------------------------------------------------------


def has_deletion_vectors(dt: DeltaTable) -> bool:
    """The table may hold DVs written by us: the feature for readers and writers, and the
    property the protocol asks of a writer of new DVs."""
    protocol = dt.protocol()
    readers, writers = protocol.reader_features or [], protocol.writer_features or []
    enabled = dt.metadata().configuration.get(DV_PROPERTY, "false").lower() == "true"
    return DV_FEATURE in readers and DV_FEATURE in writers and enabled


def enable_deletion_vectors(dt: DeltaTable) -> None:
    """Reader 3 / writer 7 with ``deletionVectors``: every reader without DV support then
    refuses the table instead of returning deleted rows."""
    from deltalake import TableFeatures

    protocol = dt.protocol()
    if DV_FEATURE not in (protocol.reader_features or []):
        dt.alter.add_feature(
            TableFeatures.DeletionVectors,
            allow_protocol_versions_increase=True,
            post_commithook_properties=NO_LOG_CLEANUP,
        )
        dt.update_incremental()
    if dt.metadata().configuration.get(DV_PROPERTY, "false").lower() != "true":
        dt.alter.set_table_properties(
            {DV_PROPERTY: "true"}, post_commithook_properties=NO_LOG_CLEANUP
        )
        dt.update_incremental()


# -- the commit ---------------------------------------------------------------------------


def commit_row_delta(
    dt: DeltaTable,
    location: TableLocation,
    filesystem: Any,
    changes: RowDelta,
    txns: Sequence[tuple[str, int]],
    commit_info: Mapping[str, Any],
    partition_by: Sequence[str],
    schema: pa.Schema,
) -> int:
    """Commit ``changes`` and ``txns`` (app id, version) as version ``dt.version() + 1``;
    returns it. ``CommitConflictError`` if any commit landed after ``dt``'s version (then
    nothing is committed; the files written are left for vacuum). ``schema``: the table's,
    which the new rows are written in; ``commit_info``: extra commitInfo fields.

    ``dt`` must be the snapshot ``changes.deletes`` were found in (``live_files``): the
    put-if-absent of ``dt.version() + 1`` is what makes the positions still true."""
    version = dt.version() + 1
    log = DeltaLog(location, lambda: filesystem)
    entry = log.path(f"{version:020d}.json")
    if filesystem.get_file_info(entry).type != pafs.FileType.NotFound:
        raise CommitConflictError(f"{location.uri}: version {version} was committed meanwhile")
    if changes.deletes and not has_deletion_vectors(dt):
        raise ValueError(f"{location.uri}: deletion vectors are not enabled on the table")
    now = int(time.time() * 1000)
    dropped = {f.entry["path"] for f in changes.drop}
    deletes = [d for d in changes.deletes if d.file.entry["path"] not in dropped]
    file_actions = [
        *_dv_actions(location, filesystem, deletes, now),
        *(_remove(f.entry, now) for f in changes.drop),
        *_write_rows(location, filesystem, changes.rows, partition_by, schema),
    ]
    lines = [
        {"commitInfo": _commit_info(commit_info, file_actions, now)},
        *({"txn": {"appId": app, "version": v, "lastUpdated": now}} for app, v in txns),
        *file_actions,
    ]
    text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in lines)
    try:
        if location.is_local:
            _put_if_absent(entry, text)
        else:
            put_if_absent(location, f"_delta_log/{version:020d}.json", text.encode())
    except FileExistsError:
        raise CommitConflictError(f"{entry} was committed meanwhile") from None
    return version


def _commit_info(
    given: Mapping[str, Any], actions: Sequence[dict[str, Any]], now: int
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "timestamp": now,
        "operation": OPERATION,
        "operationParameters": {"mode": "merge-on-read"},
        "isBlindAppend": False,
        "engineInfo": _ENGINE,
        "operationMetrics": _metrics(actions),
    }
    info.update(given)
    return info


def _metrics(actions: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Spark's MERGE metrics (strings, as Spark writes them) of this commit's actions."""
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    new_files = [a for a in adds if "deletionVector" not in a]
    rewritten = {a["path"] for a in adds if "deletionVector" in a}
    old_dvs = sum(1 for r in removes if "deletionVector" in r)
    deleted = sum(a["deletionVector"]["cardinality"] for a in adds if "deletionVector" in a) - sum(
        r["deletionVector"]["cardinality"]
        for r in removes
        if "deletionVector" in r and r["path"] in rewritten
    )
    return {
        "numTargetRowsInserted": str(sum(_stats(a).get("numRecords", 0) for a in new_files)),
        "numTargetRowsDeleted": str(deleted),
        "numTargetFilesAdded": str(len(new_files)),
        "numTargetFilesRemoved": str(sum(1 for r in removes if r["path"] not in rewritten)),
        "numTargetDeletionVectorsAdded": str(len(rewritten)),
        "numTargetDeletionVectorsRemoved": str(old_dvs),
    }


def _put_if_absent(path: str, text: str) -> None:
    """On a local disk: the log entry appears whole or not at all, and never over another's:
    written to a temporary name, then hard-linked to its own (``link`` fails if the name
    exists)."""
    tmp = f"{os.path.dirname(path)}/_commit_{uuid.uuid4().hex}.json.tmp"
    with open(tmp, "x", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, path)  # FileExistsError if it exists
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# -- deletion vectors ---------------------------------------------------------------------


def _dv_actions(
    location: TableLocation, filesystem: Any, deletes: Sequence[FileDeletes], now: int
) -> list[dict[str, Any]]:
    """Each file's remove and its add with the new DV (the old DV's rows kept), one DV file
    for them all. A file left without a live row is only removed."""
    root = location.path()
    merged = [(d.file, _merged(d, root, filesystem)) for d in deletes]
    changed = [(f, bitmap) for f, bitmap in merged if bitmap is not None]
    kept = [(f, bitmap) for f, bitmap in changed if len(bitmap) < f.rows]
    actions = [_remove(f.entry, now) for f, _ in changed]
    if not kept:
        return actions
    dvs = [delta_dv.encode_bitmap(bitmap) for _, bitmap in kept]
    data, offsets = delta_dv.encode_file(dvs)
    encoded, rel = delta_dv.new_file_name(DV_DIR)
    location.make_parents(filesystem, location.path(rel))
    with filesystem.open_output_stream(location.path(rel)) as out:
        out.write(data)
    for (f, bitmap), dv, offset in zip(kept, dvs, offsets, strict=True):
        descriptor = Descriptor("u", encoded, len(dv), len(bitmap), offset)
        actions.append({"add": _with_dv(f.entry, descriptor)})
    return actions


def _merged(deletes: FileDeletes, root: str, filesystem: Any) -> BitMap64 | None:
    """The file's new deleted rows; None if the round deletes none it had not deleted."""
    live = deletes.file
    positions = np.asarray(deletes.positions, dtype=np.uint64)
    if len(positions) and int(positions.max()) >= live.rows:
        raise ValueError(
            f"{live.path}: row position {int(positions.max())} beyond its {live.rows} rows"
        )
    old = live.entry.get("deletionVector")
    bitmap = Descriptor.from_json(old).read(root, filesystem) if old else BitMap64()
    before = len(bitmap)
    bitmap.update(positions.tolist())
    return bitmap if len(bitmap) > before else None


def _with_dv(entry: Mapping[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """The same data file as a new logical file: its DV replaced, its statistics marked
    wide (min/max may be of deleted rows; numRecords stays the physical count)."""
    add = {k: v for k, v in entry.items() if k != "deletionVector" and v is not None}
    stats = _stats(entry)
    if stats:
        stats["tightBounds"] = False
        add["stats"] = json.dumps(stats, separators=(",", ":"))
    add["dataChange"] = True
    add["deletionVector"] = descriptor.as_json()
    return add


def _remove(entry: Mapping[str, Any], now: int) -> dict[str, Any]:
    """The tombstone of a logical file: its DV named, so it ends that file and no other."""
    remove: dict[str, Any] = {
        "path": entry["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": entry.get("partitionValues") or {},
        "size": entry["size"],
    }
    for key in ("stats", "tags", "deletionVector", "baseRowId", "defaultRowCommitVersion"):
        if entry.get(key) is not None:
            remove[key] = entry[key]
    return {"remove": remove}


# -- new rows -----------------------------------------------------------------------------


def _write_rows(
    location: TableLocation,
    filesystem: Any,
    rows: pa.Table | None,
    partition_by: Sequence[str],
    schema: pa.Schema,
) -> list[dict[str, Any]]:
    """The round's rows as data files in the table's partition folders, and their adds."""
    if rows is None or rows.num_rows == 0:
        return []
    table = conform_to_table(rows, schema).select(schema.names)
    specs = [PartitionSpec(name, name, "identity") for name in partition_by]
    adds = []
    for folder, piece in partitioning.split(table, specs):
        if piece.num_rows == 0:
            continue
        rel = f"{folder}/" if folder else ""
        rel += f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        path = location.path(rel)
        location.make_parents(filesystem, path)
        pq.write_table(piece, path, filesystem=filesystem, compression="snappy")
        adds.append(_add(location, filesystem, rel))
    return adds


def _add(location: TableLocation, filesystem: Any, rel: str) -> dict[str, Any]:
    data_file, _ = describe_file(location, rel, filesystem)
    return {
        "add": {
            "path": rel,
            "partitionValues": partitioning.values_of(rel),
            "size": data_file.size,
            "modificationTime": data_file.modification_time_ms,
            "dataChange": True,
            "stats": delta_stats_json(data_file),
        }
    }


# -- upkeep -------------------------------------------------------------------------------


def vacuum_dv_files(
    dt: DeltaTable,
    location: TableLocation,
    filesystem: Any,
    retention_hours: float,
    dry_run: bool = True,
) -> list[str]:
    """The DV files in ``DV_DIR`` that no live file of ``dt``'s version uses and that are
    older than the retention (a round's DV file is written before its commit, and a reader
    of an older version may still need one) - deleted unless ``dry_run``. Paths relative
    to the table, as ``DeltaTable.vacuum`` returns them."""
    selector = pafs.FileSelector(location.path(DV_DIR), allow_not_found=True)
    infos = [i for i in filesystem.get_file_info(selector) if i.type == pafs.FileType.File]
    root = location.path()
    used = {
        Descriptor.from_json(f.entry["deletionVector"]).absolute_path(root)
        for f in live_files(dt, location, filesystem)
        if f.entry.get("deletionVector", {}).get("storageType") == "u"
    }
    cutoff_ns = time.time_ns() - int(retention_hours * 3600e9)
    old = [i for i in infos if i.path not in used and (i.mtime_ns or 0) < cutoff_ns]
    if not dry_run:
        for info in old:
            filesystem.delete_file(info.path)
    return [f"{DV_DIR}/{i.base_name}" for i in old]
