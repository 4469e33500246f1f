"""``TaskFiles``: the Parquet files one writing task makes, and how they are laid out.

A write stages its files in ``<table>/staging/<uuid>/``: each group's in
``_rc_group=<i>/`` (a partitioned table's in Hive folders), dead letters under
``DEAD_LETTER_DIR``. Which groups share a file, where a file is cut (a new partition, new
columns) and which (group, path) rows a task returns are decided here, the same whether a
Spark task or the writer's own process writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.formats.partitioning import split as split_partitions
from rayconnect.formats.rows import partition_specs
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat, typed_format
from rayconnect.spark_bridge.row_groups import RowGroupFile
from rayconnect.storage.location import TableLocation

GROUP_COLUMN = "_rc_group"


def parquet_options(schema: pa.Schema) -> dict[str, object]:
    """Dictionary-encode only the flat non-binary columns (cluster, topic, partition...).

    Keys and values are mostly unique: a dictionary for them is built, overflows and is
    thrown away on every page (bench: 0.39 -> 0.29 us a row without it).
    """
    flat = [
        f.name for f in schema if not (pa.types.is_binary(f.type) or pa.types.is_nested(f.type))
    ]
    return {"use_dictionary": flat, "compression": "snappy"}


class TaskFiles:
    """The files one Spark task writes: rows go in group by group, (group, path) rows out.

    Consecutive groups with the same ``share_of`` token (not None) go into the same files,
    but never two groups of one partition (``key_of``): a flush of a round that was
    discarded must not ride in the file of a newer one, which its partition alone would
    vouch for. A file yields one row per group it holds. Groups arrive one after another
    (a group's rows are consecutive), so a task holds one file open per table partition.
    A piece that brings new columns starts a new file with its own schema (the committer
    evolves the table); dead letters go to a file of the group in the dead-letter table.
    """

    def __init__(
        self,
        location: TableLocation,
        staging_rel: str,
        schema: pa.Schema,
        record_format: RecordFormat | None,
        share_of: list[str | None] | None,
        key_of: Sequence[str | None] | None,
        n_groups: int,
    ) -> None:
        self.location = location
        self.filesystem = location.filesystem()
        self.staging_rel = staging_rel
        typed = typed_format(record_format)
        self.typed = typed is not None
        self.options = parquet_options(schema)
        self.specs = partition_specs(typed) if typed is not None else []
        self.in_files = typed is not None and typed.partition_values_in_files
        #: an upsert table's change files: unsplit (``partitioning.split``'s ``whole``)
        self.whole = typed is not None and bool(typed.upsert_keys)
        self.attempt = uuid.uuid4().hex  # each task attempt writes files of its own
        self.shares = share_of or [None] * n_groups
        self.key_of = key_of
        self.written: list[tuple[int, str]] = []
        #: the current group's (or share's) open files, by table partition folder
        #: ("" unpartitioned), with the path each one has from the staging folder
        self.current: dict[str, tuple[RowGroupFile, str]] = {}
        self.in_file: set[tuple[int, str]] = set()  # (group, path) rows already written
        self.dead: list[pa.Table] = []
        self.last_group: int | None = None
        self.open_keys: set[str | None] = set()  # partitions in the open files

    def _same_files(self, a: int, b: int) -> bool:
        return (
            self.shares[a] is not None
            and self.shares[a] == self.shares[b]
            and self.key_of is not None
            and self.key_of[b] not in self.open_keys
        )

    def _open(
        self, group: int, file_schema: pa.Schema, rel_root: str, folder: str = ""
    ) -> tuple[RowGroupFile, str]:
        n = len(self.written)
        if folder:  # Hive folders only: readers parse every name=value of the path
            rel = f"{rel_root}/{folder}/part-{self.attempt}-g{group}-{n}.parquet"
        else:
            rel = f"{rel_root}/{GROUP_COLUMN}={group}/part-{self.attempt}-{n}.parquet"
        path = self.location.path(rel)
        self.location.make_parents(self.filesystem, path)
        opts = self.options if not self.typed else parquet_options(file_schema)
        writer = pq.ParquetWriter(path, file_schema, filesystem=self.filesystem, **opts)
        staged = rel_root == self.staging_rel
        return RowGroupFile(writer), rel[len(self.staging_rel) + 1 :] if staged else rel

    def _holds(self, group: int, rel: str) -> None:
        if (group, rel) not in self.in_file:
            self.in_file.add((group, rel))
            self.written.append((group, rel))

    def _close_all(self) -> None:
        for w, _ in self.current.values():
            w.close()
        self.current.clear()
        self.open_keys.clear()

    def _flush_dead(self, group: int) -> None:
        if self.dead:
            rows = pa.concat_tables(self.dead)
            self.dead.clear()
            w, rel = self._open(group, rows.schema, f"{DEAD_LETTER_DIR}/{self.staging_rel}")
            try:
                w.write(rows)
            finally:
                w.close()
            self._holds(group, rel)

    def add(self, group: int, rows: pa.Table, dead: pa.Table | None = None) -> None:
        """Group ``group``'s next rows (and bad records), after any earlier group's."""
        last = self.last_group
        if last is not None and last != group:
            if not self._same_files(last, group):
                self._close_all()
            self._flush_dead(last)  # dead letters stay per group
        self.last_group = group
        self.open_keys.add(self.key_of[group] if self.key_of is not None else None)
        if dead is not None and dead.num_rows:
            self.dead.append(dead)
        if rows.num_rows == 0:
            return
        for folder, part in split_partitions(rows, self.specs, self.in_files, self.whole):
            opened = self.current.get(folder)
            if opened is not None and opened[0].schema != part.schema:
                opened[0].close()  # new columns: a file of their own
                opened = None
            if opened is None:
                opened = self.current[folder] = self._open(
                    group, part.schema, self.staging_rel, folder
                )
            opened[0].write(part)
            self._holds(group, opened[1])

    def finish(self) -> list[tuple[int, str]]:
        """Close every file; the (group, path) rows of all files written."""
        self._close_all()
        if self.last_group is not None:
            self._flush_dead(self.last_group)
        return self.written

    def abort(self) -> None:
        self._close_all()  # idempotent
