"""Folding a merge-on-read Iceberg table's deletes back into its data files.

Every merge-on-read round adds position deletes (and a delete manifest); a reader applies
all of them on every scan, so without upkeep a busy table reads slower round after round.
A compaction picks the data files whose deleted fraction passes ``min_deleted_fraction``
(most deleted first, at most ``max_files`` a run, so a run is short and rarely loses the
race with a round), rewrites each with its deletes applied, and in the same snapshot drops
those files and every delete file no remaining data file needs. The new files get the new
snapshot's sequence number, so no older delete applies to them.

A round that commits while a compaction rewrites makes the compaction's commit fail (the
catalog swaps only on the snapshot it read: ``AssertRefSnapshotId``) - the round may have
deleted rows of a file being rewritten. The compaction is tried again on a fresh read,
``retries`` times; a round never fails because of it beyond its own retry (it re-reads and
searches the new files).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np


def fold_deletes(
    table: Any, max_files: int, min_deleted_fraction: float, summary: dict[str, str]
) -> dict[str, int]:
    """One compaction of ``table`` (a pyiceberg ``Table`` at the read to build on); returns
    what it did (files rewritten, delete files dropped, rows removed). Raises pyiceberg's
    ``CommitFailedException`` when another commit landed since ``table`` was read."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    tasks = [t for t in table.scan().plan_files() if t.delete_files]
    if not tasks:
        return {"files_rewritten": 0, "delete_files_dropped": 0, "rows_removed": 0}
    deleted = _deleted_counts(table.io, tasks)
    fractions = {
        t.file.file_path: deleted.get(t.file.file_path, 0) / max(t.file.record_count, 1)
        for t in tasks
    }
    chosen = sorted(
        (t for t in tasks if fractions[t.file.file_path] >= min_deleted_fraction),
        key=lambda t: -fractions[t.file.file_path],
    )[:max_files]
    rewritten = {t.file.file_path for t in chosen}
    still_needed = {d for t in tasks if t.file.file_path not in rewritten for d in t.delete_files}
    drop_deletes = {d for t in chosen for d in t.delete_files} - still_needed
    if not chosen:
        return {"files_rewritten": 0, "delete_files_dropped": 0, "rows_removed": 0}
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    rows = scan.to_table(chosen)
    new_files = (
        list(_dataframe_to_data_files(table.metadata, rows, table.io, uuid.uuid4()))
        if rows.num_rows
        else []
    )
    with table.transaction() as tx:
        producer = _rewrite_class()(tx, drop_deletes, snapshot_properties=summary)
        for t in chosen:
            producer.delete_data_file(t.file)
        for f in new_files:
            producer.append_data_file(f)
        producer.commit()
    before = sum(t.file.record_count for t in chosen)
    return {
        "files_rewritten": len(chosen),
        "delete_files_dropped": len(drop_deletes),
        "rows_removed": before - rows.num_rows,
    }


def _deleted_counts(io: Any, tasks: Iterable[Any]) -> dict[str, int]:
    """Data file path -> how many of its rows are deleted (a position deleted twice once)."""
    from pyiceberg.io.pyarrow import _read_all_delete_files

    return {
        path: len(np.unique(np.concatenate([a.to_numpy() for a in arrays])))
        for path, arrays in _read_all_delete_files(io, tasks).items()
    }


_CLASS: type | None = None


def _rewrite_class() -> type:
    """pyiceberg's overwrite, which drops data files only, taught to drop delete files too
    (their manifests rewritten with a deletes writer, without them: a dropped delete file
    leaves no ``DELETED`` entry, which only incremental readers of deletes would miss)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from pyiceberg.manifest import ManifestContent, ManifestEntry
    from pyiceberg.manifest import ManifestEntryStatus as Status
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    from rayconnect.tables.iceberg_row_delta import deletes_manifest_writer

    class Rewrite(_OverwriteFiles):
        def __init__(self, tx: Any, drop_deletes: set[Any], **kwargs: Any) -> None:
            super().__init__(Operation.OVERWRITE, tx, tx._table.io, **kwargs)
            self._drop_deletes = drop_deletes

        def _existing_manifests(self) -> list[Any]:
            snapshot = self._transaction.table_metadata.snapshot_by_name(self._target_branch)
            kept = []
            for manifest in snapshot.manifests(io=self._io) if snapshot else []:
                gone = self._drop_deletes if manifest.content == ManifestContent.DELETES else None
                if gone is None:
                    kept.extend(self._data_manifest(manifest))
                    continue
                entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
                keep = [e for e in entries if e.data_file not in gone]
                if len(keep) == len(entries):
                    kept.append(manifest)
                elif keep:
                    kept.append(self._rewritten(manifest, keep))
            return kept

        def _data_manifest(self, manifest: Any) -> list[Any]:
            entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
            if not any(e.data_file in self._deleted_data_files for e in entries):
                return [manifest]
            keep = [e for e in entries if e.data_file not in self._deleted_data_files]
            if not keep:
                return []
            with self.new_manifest_writer(self.spec(manifest.partition_spec_id)) as writer:
                for e in keep:
                    writer.add_entry(_existing(e, ManifestEntry, Status))
            return [writer.to_manifest_file()]

        def _rewritten(self, manifest: Any, keep: list[Any]) -> Any:
            writer = deletes_manifest_writer(self, manifest.partition_spec_id)
            with writer:
                for e in keep:
                    writer.add_entry(_existing(e, ManifestEntry, Status))
            return writer.to_manifest_file()

    _CLASS = Rewrite
    return Rewrite


def _existing(entry: Any, manifest_entry: Any, status: Any) -> Any:
    return manifest_entry.from_args(
        status=status.EXISTING,
        snapshot_id=entry.snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=entry.data_file,
    )
