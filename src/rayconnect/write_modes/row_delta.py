"""Merge-on-read: where a round's keys live in the table, as (data file, row position).

A copy-on-write round rewrites every file that holds one of its keys, so its cost follows
the table. A merge-on-read round instead marks the rows it replaces as deleted - Iceberg
position delete files, Delta deletion vectors - and appends the new row versions: it reads
the key columns of the files that may hold its keys and writes only what changed.

This module is the part both table kinds share (written once): which live files may hold a
key (their key statistics: a file whose key range misses every key of the round is not
read), and the row positions of the round's keys in those that may. A row already deleted
by an earlier round may be found again (the search does not read the table's deletes);
deleting a position twice is harmless in both formats, and compaction folds them.

A file is a candidate for a per-partition truncate (``Folded.truncated_partitions``) unless
its ``_kafka_*`` statistics exclude those partitions; its rows of those partitions are
deleted by position as well.

The pruning runs where the round commits (it needs only the table's metadata); the join of
the round's keys with the candidates' key columns is a ``SearchJob`` - picklable, so it runs
wherever ``write_modes.key_search`` sends it (the writer's process, Spark's executors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayconnect.protocol.types import TopicPartition
from rayconnect.write_modes.fold import PARTITION_COLUMNS

#: string statistics at least this long may be truncated prefixes (Delta: 32, Iceberg's
#: default metrics mode: 16): not a bound to prune by
_STRING_BOUND_MAX = 16
#: files read at once (Parquet reads release the GIL)
_READERS = 4


@dataclass(frozen=True)
class LiveFile:
    """A data file the table reads now, as the search needs it: ``path`` as the table's
    filesystem opens it, ``entry`` the format's own record of it (an Iceberg ``DataFile``,
    a Delta add action), ``rows`` its row count, ``bounds`` column -> (min, max) where its
    statistics have them."""

    path: str
    entry: Any
    rows: int
    bounds: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    #: a Delta file's partition values (strings, as in its add action): its partition
    #: columns are not in the file
    partition_values: Mapping[str, str | None] = field(default_factory=dict)

    def searched(self) -> LiveFile:
        """What a search elsewhere needs of the file: not its entry or statistics."""
        return LiveFile(self.path, None, self.rows, partition_values=self.partition_values)


@dataclass(frozen=True)
class ColumnReader:
    """Reads some columns of a live file - every row, deleted ones too, in file order -
    through the table's ``filesystem``. Picklable: a search reads the files where it runs.
    A partition column that is not in the file (Delta) comes from the file's partition
    values, typed by ``partition_types`` (else a string)."""

    filesystem: Any
    partition_types: Mapping[str, pa.DataType] = field(default_factory=dict)

    def __call__(self, live: LiveFile, columns: list[str]) -> pa.Table:
        return _without_views(self._read(live, columns))

    def _read(self, live: LiveFile, columns: list[str]) -> pa.Table:
        if not live.partition_values:
            return pq.read_table(live.path, columns=columns, filesystem=self.filesystem)
        with self.filesystem.open_input_file(live.path) as source:
            parquet = pq.ParquetFile(source)
            in_file = set(parquet.schema_arrow.names)
            read = parquet.read(columns=[c for c in columns if c in in_file])
        arrays = []
        for name in columns:
            if name in in_file:
                arrays.append(read.column(name))
                continue
            if name not in live.partition_values:
                raise KeyError(f"{live.path} has no column {name!r}")
            column = pa.array([live.partition_values[name]] * live.rows, pa.string())
            if name in self.partition_types:
                column = column.cast(self.partition_types[name])
            arrays.append(column)
        return pa.table(arrays, names=list(columns))


@dataclass(frozen=True)
class FileDeletes:
    """The rows of ``file`` a round deletes: 0-based row positions, sorted, unique."""

    file: LiveFile
    positions: np.ndarray


def _without_views(table: pa.Table) -> pa.Table:
    """String and binary view columns (delta-rs writes them) as plain ones: Arrow's
    ``take`` and joins have no kernels for views."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(f.type in plain for f in table.schema):
        return table
    return table.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema]))


@dataclass(frozen=True)
class SearchJob:
    """The join of a round's keys with some live files' key columns: ``keys`` (its columns
    are the key columns), the Kafka partitions truncated (their rows go too), ``files``
    (``LiveFile.searched``) and the reader of their columns. Picklable, pure: the same
    answer wherever it runs."""

    files: tuple[LiveFile, ...]
    keys: pa.Table
    truncated: tuple[TopicPartition, ...]
    read: ColumnReader

    def positions(self, index: int) -> np.ndarray:
        """The sorted row positions in ``files[index]`` to delete (uint64, maybe none)."""
        columns = list(self.keys.column_names)
        if self.truncated:
            columns += list(PARTITION_COLUMNS)
        rows = self.read(self.files[index], columns)
        if self.keys.num_rows:
            mask = _matches(rows, self.keys)
        else:
            mask = np.zeros(rows.num_rows, dtype=bool)
        if self.truncated:
            mask |= _of_partitions(rows, self.truncated)
        return np.flatnonzero(mask).astype(np.uint64)


def search_here(job: SearchJob) -> list[np.ndarray]:
    """``job`` in this process: each file's positions, files read ``_READERS`` at a time."""
    if len(job.files) <= 1:
        return [job.positions(i) for i in range(len(job.files))]
    with ThreadPoolExecutor(min(_READERS, len(job.files))) as pool:
        return list(pool.map(job.positions, range(len(job.files))))


#: where a search job runs: each file's positions, in order
Search = Callable[[SearchJob], list[np.ndarray]]


def find_deletes(
    live: Sequence[LiveFile],
    keys: pa.Table,
    partitions: Iterable[TopicPartition],
    read: ColumnReader,
    search: Search = search_here,
) -> tuple[FileDeletes, ...]:
    """The positions in ``live`` of the rows whose key is in ``keys`` (its columns are the
    key columns) or whose ``_kafka_*`` partition is in ``partitions``: the files pruned
    here, the rest joined by ``search``."""
    truncated = tuple(sorted(partitions))
    if keys.num_rows == 0 and not truncated:
        return ()
    ranges = _key_ranges(keys) if keys.num_rows else {}
    candidates = [
        f
        for f in live
        if f.rows
        and ((keys.num_rows and _may_hold(f, ranges)) or _may_hold_partitions(f, truncated))
    ]
    if not candidates:
        return ()
    job = SearchJob(tuple(f.searched() for f in candidates), keys, truncated, read)
    found = search(job)
    return tuple(FileDeletes(f, p) for f, p in zip(candidates, found, strict=True) if len(p))


def rows_at(
    found: Sequence[FileDeletes], read: ColumnReader, columns: list[str]
) -> pa.Table:
    """``columns`` of the rows ``found`` (in the files where a key search found them)."""

    def take(hit: FileDeletes) -> pa.Table:
        return read(hit.file, columns).take(pa.array(hit.positions.astype(np.int64)))

    if len(found) <= 1:
        parts = [take(hit) for hit in found]
    else:
        with ThreadPoolExecutor(min(_READERS, len(found))) as pool:
            parts = list(pool.map(take, found))
    if not parts:
        return pa.table({c: pa.nulls(0) for c in columns})
    return pa.concat_tables(parts, promote_options="permissive")


def without_partitions(rows: pa.Table, partitions: Iterable[TopicPartition]) -> pa.Table:
    """``rows`` except those that came from ``partitions`` (by their ``_kafka_*`` columns)."""
    gone = tuple(partitions)
    if not gone or rows.num_rows == 0:
        return rows
    return rows.filter(pa.array(~_of_partitions(rows, gone)))


def _key_ranges(keys: pa.Table) -> dict[str, tuple[Any, Any]]:
    """Each key column's (min, max) in the round, where it can be compared to statistics."""
    ranges = {}
    for name in keys.column_names:
        column = keys.column(name)
        if not (pa.types.is_integer(column.type) or pa.types.is_string(column.type)):
            continue
        low_high = pc.min_max(column).as_py()
        ranges[name] = (low_high["min"], low_high["max"])
    return ranges


def _may_hold(f: LiveFile, ranges: Mapping[str, tuple[Any, Any]]) -> bool:
    """False only when some key column's statistics exclude every key of the round."""
    for name, (low, high) in ranges.items():
        bounds = f.bounds.get(name)
        if bounds is None or low is None:
            continue
        file_low, file_high = bounds
        if not _comparable(low, file_low) or not _comparable(high, file_high):
            continue
        if high < file_low or low > file_high:
            return False
    return True


def _comparable(value: Any, bound: Any) -> bool:
    if isinstance(value, str):
        return isinstance(bound, str) and len(bound) < _STRING_BOUND_MAX
    return isinstance(value, int) and isinstance(bound, int) and not isinstance(bound, bool)


def _may_hold_partitions(f: LiveFile, partitions: Sequence[TopicPartition]) -> bool:
    if not partitions:
        return False
    bounds = f.bounds.get(PARTITION_COLUMNS[2])
    if bounds is None:
        return True
    low, high = bounds
    return any(low <= tp.partition <= high for tp in partitions)


def _matches(rows: pa.Table, keys: pa.Table) -> np.ndarray:
    """Which of ``rows`` have a key in ``keys`` (a key column null in ``rows`` never
    matches: such a row was never upserted by key)."""
    names = keys.column_names
    if len(names) == 1:
        column = rows.column(names[0])
        wanted = keys.column(names[0]).cast(column.type)
        found = pc.fill_null(pc.is_in(column, value_set=wanted), False)
        return np.asarray(found.to_numpy(zero_copy_only=False))
    indexed = rows.select(names).append_column(
        "__pos", pa.array(np.arange(rows.num_rows, dtype=np.int64))
    )
    typed = pa.table({n: keys.column(n).cast(rows.column(n).type) for n in names})
    joined = indexed.join(typed, names, join_type="inner", use_threads=False)
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[joined.column("__pos").to_numpy()] = True
    return mask


def _of_partitions(rows: pa.Table, partitions: Sequence[TopicPartition]) -> np.ndarray:
    cluster, topic, partition = (
        rows.column(c).to_numpy(zero_copy_only=False) for c in PARTITION_COLUMNS
    )
    mask = np.zeros(rows.num_rows, dtype=bool)
    for tp in partitions:
        mask |= (cluster == tp.cluster) & (topic == tp.topic) & (partition == tp.partition)
    return mask
