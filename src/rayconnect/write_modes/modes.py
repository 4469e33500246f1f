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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.protocol.types import DataFile
from rayconnect.storage.location import TableLocation
from rayconnect.write_modes.changes import Appended, RoundChanges, Upserted
from rayconnect.write_modes.fold import fold


class StagedTable(Protocol):
    """What a mode needs of the table it writes: where the round's files are staged, and
    each file in the format's own terms."""

    @property
    def location(self) -> TableLocation: ...

    @property
    def filesystem(self) -> Any: ...

    def file_entry(self, data_file: DataFile) -> Any: ...


class WriteMode(Protocol):
    """A write mode: the changes of one round's files, read on ``read``."""

    def changes(self, table: StagedTable, read: Any, files: Sequence[DataFile]) -> RoundChanges: ...


class Append:
    """``write_mode: append`` (the default)."""

    def changes(self, table: StagedTable, read: Any, files: Sequence[DataFile]) -> RoundChanges:
        return Appended(adds=tuple(table.file_entry(f) for f in files))


APPEND = Append()


class Upsert:
    """Upserts by ``key_columns`` (a format with upsert keys)."""

    def __init__(self, key_columns: tuple[str, ...]) -> None:
        self.key_columns = key_columns

    def changes(self, table: StagedTable, read: Any, files: Sequence[DataFile]) -> RoundChanges:
        if not files:
            return Appended()
        staged = [
            pq.read_table(table.location.path(f.path), filesystem=table.filesystem) for f in files
        ]
        rows = pa.concat_tables(staged, promote_options="permissive")
        folded = fold(rows, list(self.key_columns))
        return Upserted(folded, self.key_columns, staged=tuple(f.path for f in files))
