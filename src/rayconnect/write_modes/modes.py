"""The write modes: how a round's checked data files become a table version's changes
(``changes.RoundChanges``). The round-commit algorithm (``TableCommitter.commit``) calls
the table's mode once per commit, on the read it commits on; each format then writes the
variant it gets (``TableCommitter._write``).

- ``APPEND``: the files are added as they are.
- ``Upsert``: the files the writers staged (every change, with its ``_kafka_*`` coordinates
  and delete flag) are read back and folded (the last change of each key wins); the format
  writes that in place (Delta: one MERGE; Iceberg: DELETE + APPEND in one transaction) with
  the round's offsets in the same version. The staged files are never referenced by the
  table: deleted once the version landed (vacuum removes those of a round that never did).
- ``MergeOnRead``: folded as ``Upsert``, but the keys' old rows are found by position
  (``write_modes.row_delta``) and marked deleted, the new versions appended: the format
  writes deletes (Iceberg position delete files, Delta deletion vectors), no file rewritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.protocol.types import DataFile
from rayconnect.storage.location import TableLocation
from rayconnect.write_modes.changes import Appended, RoundChanges, RowDelta, Upserted
from rayconnect.write_modes.fold import OFFSET_COLUMN, PARTITION_COLUMNS, Folded, fold
from rayconnect.write_modes.key_index import Found, KeyIndex
from rayconnect.write_modes.row_delta import (
    ColumnReader,
    FileDeletes,
    LiveFile,
    Search,
    find_deletes,
    rows_at,
    search_here,
    without_partitions,
)
from rayconnect.write_modes.unchanged import fill_from_table, marks_of


class StagedTable(Protocol):
    """What a mode needs of the table it writes: where the round's files are staged, and
    each file in the format's own terms."""

    @property
    def location(self) -> TableLocation: ...

    @property
    def filesystem(self) -> Any: ...

    def file_entry(self, data_file: DataFile) -> Any: ...

    def live_files(self, read: Any) -> Sequence[LiveFile]:
        """The data files ``read`` reads (merge-on-read searches them for keys)."""
        ...

    @property
    def column_reader(self) -> ColumnReader:
        """Reads some columns of a live file, every row in file order (deleted rows too)."""
        ...


class WriteMode(Protocol):
    """A write mode: the changes of one round's files, read on ``read``; told when the
    version of the last changes it made landed."""

    def changes(self, table: StagedTable, read: Any, files: Sequence[DataFile]) -> RoundChanges: ...

    def landed(self) -> None: ...


class Append:
    """``write_mode: append`` (the default)."""

    def changes(self, table: StagedTable, read: Any, files: Sequence[DataFile]) -> RoundChanges:
        return Appended(adds=tuple(table.file_entry(f) for f in files))

    def landed(self) -> None:
        """Nothing kept between rounds."""


APPEND = Append()


class Upsert:
    """Upserts by ``key_columns`` (a format with upsert keys). The values a change does not
    carry (``write_modes.unchanged``: Postgres's unchanged TOAST) are read from the key's
    row, found by ``search`` (``write_modes.key_search``)."""

    def __init__(self, key_columns: tuple[str, ...], search: Search = search_here) -> None:
        self.key_columns = key_columns
        self.search = search

    def landed(self) -> None:
        """Nothing kept between rounds."""

    def changes(self, table: StagedTable, read: Any, files: Sequence[DataFile]) -> RoundChanges:
        if not files:
            return Appended()
        folded = self._with_table_values(table, read, _fold_staged(table, files, self.key_columns))
        return Upserted(folded, self.key_columns, staged=tuple(f.path for f in files))

    def _with_table_values(
        self,
        table: StagedTable,
        read: Any,
        folded: Folded,
        found: Sequence[FileDeletes] | None = None,
    ) -> Folded:
        """``folded`` with the values its rows do not carry read from the table: from the
        rows ``found`` (the round's key search, merge-on-read) or a search for those keys."""
        if not marks_of(folded.rows):
            return folded
        gone = folded.truncated_partitions

        def current(keys: pa.Table, columns: list[str]) -> pa.Table:
            if folded.truncated:  # the table's rows all go: none to take values from
                return pa.table({})
            hits = found
            if hits is None:
                hits = find_deletes(
                    table.live_files(read), keys, (), table.column_reader, self.search
                )
            wanted = [*self.key_columns, *columns, OFFSET_COLUMN]
            if not gone:
                return rows_at(hits, table.column_reader, wanted)
            rows = rows_at(hits, table.column_reader, [*wanted, *PARTITION_COLUMNS])
            return without_partitions(rows, gone).select(wanted)  # those rows go now

        rows = fill_from_table(folded.rows, self.key_columns, current)
        return dataclasses.replace(folded, rows=rows)


class MergeOnRead(Upsert):
    """Upserts by ``key_columns``, merge-on-read (``upsert_mode: merge_on_read``). The rows
    a round replaces are looked up in the key index (``write_modes.key_index``: tables of up
    to ``index_rows`` rows, one key column, in this process's memory), else joined with the
    candidate files' key columns where ``search`` runs the job (``write_modes.key_search``:
    the pipeline's writer, Spark's executors)."""

    def __init__(
        self,
        key_columns: tuple[str, ...],
        index_rows: int = 0,
        background: bool = True,
        search: Search = search_here,
    ) -> None:
        super().__init__(key_columns, search)
        rows = index_rows if len(key_columns) == 1 else 0
        self.index = KeyIndex(key_columns[0], rows, background)
        self._found = Found()

    def landed(self) -> None:
        self.index.forget(self._found)
        self._found = Found()

    def changes(self, table: StagedTable, read: Any, files: Sequence[DataFile]) -> RoundChanges:
        if not files:
            return Appended()
        folded = _fold_staged(table, files, self.key_columns)
        staged = tuple(f.path for f in files)
        live = table.live_files(read)
        if folded.truncated:  # every row the table held goes: whole files
            folded = self._with_table_values(table, read, folded, ())
            return RowDelta(folded.rows, drop=tuple(live), staged=staged)
        keys = pa.concat_tables(
            [folded.rows.select(list(self.key_columns)), folded.deleted],
            promote_options="permissive",
        )
        self._found = Found()
        reader = table.column_reader
        if not folded.truncated_partitions and self.index.sync(live, reader):
            deletes, self._found = self.index.find(keys.column(0), live)
        else:
            deletes = find_deletes(live, keys, folded.truncated_partitions, reader, self.search)
        folded = self._with_table_values(table, read, folded, deletes)
        return RowDelta(folded.rows, deletes=deletes, staged=staged)


def _fold_staged(
    table: StagedTable, files: Sequence[DataFile], key_columns: tuple[str, ...]
) -> Folded:
    staged = [
        pq.read_table(table.location.path(f.path), filesystem=table.filesystem) for f in files
    ]
    rows = pa.concat_tables(staged, promote_options="permissive")
    return fold(rows, list(key_columns))
