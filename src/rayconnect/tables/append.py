"""The append write mode: a round adds its files and removes nothing (Kafka records are
facts; the offsets' compare-and-set keeps each in the table once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayconnect.protocol.types import DataFile
from rayconnect.tables.base import RoundChanges, TableCommitter


class Append:
    """``RoundApply`` of ``write_mode: append`` (the only mode so far)."""

    def changes(self, table: TableCommitter, read: Any, files: Sequence[DataFile]) -> RoundChanges:
        return RoundChanges(adds=tuple(table.file_entry(f) for f in files))


APPEND = Append()
