"""DeltaTableSource: the rows each new version of a Delta table added, in version order.

One source partition per table (``{"table": path}``): versions are one ordered stream, so
task 0 of the pipeline reads it and other tasks idle. Offset ``{"version": v, "row": r}``:
row ``r`` of the rows version ``v`` added (files new in ``v`` against ``v - 1``, sorted by
path, rows in file order) - deterministic, so a restarted task resumes at the exact row.
Versions that add no file (metadata commits, e.g. a sink pipeline's epoch claims; deletes)
send nothing. Each row is sent as a JSON object; ``key_column`` keys records by a column,
otherwise every record goes to Kafka partition ``partition`` to keep the table's order.
A table written by a sink pipeline can so be replayed to Kafka.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from rayconnect.errors import require
from rayconnect.redact import redacted_repr
from rayconnect.settings_types import NonNegativeFloat, NonNegativeInt, PositiveInt
from rayconnect.source_tasks.base import (
    ConfiguredTask,
    SourceRecord,
    SourceTaskContext,
    check_topic,
)


class DeltaTableSettings(msgspec.Struct, frozen=True):
    """DeltaTableSource's parameters: its constructor's and a pipeline file's ``task:`` block's."""

    #: the Delta table read: the rows each new version added (offset = version + row)
    path: str
    #: the topic written to
    topic: str
    #: the first version read when nothing is committed
    starting_version: NonNegativeInt = 0
    #: the column whose value becomes the record's key; None: no key
    key_column: str | None = None
    #: the Kafka partition written to
    partition: NonNegativeInt = 0
    #: most records one poll returns
    batch_size: PositiveInt = 1000
    #: how long a poll waits when there is no new version
    idle_s: NonNegativeFloat = 0.5
    #: delta-rs storage options of a table on object storage
    storage_options: dict[str, str] | None = None

    __repr__ = redacted_repr  # storage options may hold cloud credentials

    def __post_init__(self) -> None:
        require(bool(self.path), "path: must not be empty")
        check_topic("topic", self.topic)


class DeltaTableSource(ConfiguredTask[DeltaTableSettings]):
    settings_type = DeltaTableSettings

    @property
    def source_partition(self) -> dict[str, str]:
        return {"table": self.settings.path}

    async def start(self, context: SourceTaskContext) -> None:
        self.context = context
        self.active = context.task_index == 0
        committed = context.offset(self.source_partition)
        if committed is None:
            self.version, self.row = self.settings.starting_version, 0
        else:
            self.version, self.row = committed["version"], committed["row"] + 1
        self._rows: list[dict[str, Any]] | None = None  # rows added by self.version

    async def poll(self) -> list[SourceRecord]:
        records = await asyncio.to_thread(self._read) if self.active else []
        if not records:
            await asyncio.sleep(self.settings.idle_s)
        return records

    def _read(self) -> list[SourceRecord]:
        from deltalake import DeltaTable

        latest = DeltaTable(self.settings.path, storage_options=self.settings.storage_options).version()
        while self.version <= latest:
            if self._rows is None:
                self._rows = self._added_rows(self.version)
            if self.row < len(self._rows):
                return self._records()
            self.version, self.row, self._rows = self.version + 1, 0, None
        return []

    def _records(self) -> list[SourceRecord]:
        assert self._rows is not None
        end = min(len(self._rows), self.row + self.settings.batch_size)
        out = []
        for r in range(self.row, end):
            row = self._rows[r]
            key = None if self.settings.key_column is None else row.get(self.settings.key_column)
            out.append(
                SourceRecord(
                    self.settings.topic,
                    msgspec.json.encode(row),
                    key=None if key is None else str(key).encode(),
                    partition=self.settings.partition if self.settings.key_column is None else None,
                    source_partition=self.source_partition,
                    source_offset={"version": self.version, "row": r},
                )
            )
        self.row = end
        return out

    def _added_rows(self, version: int) -> list[dict[str, Any]]:
        import pyarrow.dataset as pds
        from deltalake import DeltaTable

        from rayconnect.storage.delta_reads import delta_dataset
        from rayconnect.storage.location import TableLocation

        location = TableLocation.parse(self.settings.path, self.settings.storage_options)

        def fragments(v: int) -> tuple[dict[str, Any], Any]:
            ds = DeltaTable(self.settings.path, version=v, storage_options=self.settings.storage_options)
            dataset = delta_dataset(ds, location)
            return {f.path: f for f in dataset.get_fragments()}, dataset

        now, dataset = fragments(version)
        before = set(fragments(version - 1)[0]) if version > 0 else set()
        new = [now[p] for p in sorted(set(now) - before)]
        if not new:
            return []
        added = pds.FileSystemDataset(new, dataset.schema, dataset.format, dataset.filesystem)
        return added.to_table().to_pylist()
