"""The upsert write mode: a round's changes folded by key, then written by the table's
format as it writes rows in place (Delta: one MERGE; Iceberg: DELETE + APPEND in one
transaction) - ``write_modes``.

The round's rows reach the committer as the files the writers staged (every change, with
its ``_kafka_*`` coordinates and delete flag); they are read back, folded (the last change
of each key wins), and rewritten into the table with the round's offsets in the same
version. The staged files themselves are never referenced by the table: they are deleted
once the version landed (vacuum removes those of a round that never did).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.protocol.types import DataFile
from rayconnect.tables.base import RoundChanges, TableCommitter
from rayconnect.write_modes.fold import Folded, fold


class UpsertRound(msgspec.Struct, frozen=True):
    """What an upsert round writes: each key's last change, and the key's columns."""

    folded: Any  # write_modes.fold.Folded (Arrow tables)
    key_columns: tuple[str, ...]


class Upsert:
    """``RoundApply`` of ``write_mode: upsert``."""

    def __init__(self, key_columns: tuple[str, ...]) -> None:
        self.key_columns = key_columns

    def changes(self, table: TableCommitter, read: Any, files: Sequence[DataFile]) -> RoundChanges:
        if not files:
            return RoundChanges()
        staged = [
            pq.read_table(table.location.path(f.path), filesystem=table.filesystem) for f in files
        ]
        rows = pa.concat_tables(staged, promote_options="permissive")
        folded: Folded = fold(rows, list(self.key_columns))
        return RoundChanges(
            upsert=UpsertRound(folded, self.key_columns), discard=tuple(f.path for f in files)
        )
