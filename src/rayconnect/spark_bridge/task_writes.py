"""What one writing task does with each raw block: decode it with its table's format and
put its rows and dead letters into that table's files (``TableWrites``), or - a routed
write (``RoutedWrite``) - split it by table first and do so per table (``RoutedFiles``).
``FilesLayout`` is what all of a task's files share, and picks the one or the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from rayconnect.formats.route_split import Router, split_block
from rayconnect.formats.rows import BadRecordError, decode_block
from rayconnect.formats.settings import RecordFormat, typed_format
from rayconnect.spark_bridge.task_files import TaskFiles
from rayconnect.storage.location import TableLocation


@dataclass(frozen=True)
class RoutedWrite:
    """A write whose records go to many tables (``config.routes``): pickled into each task.

    ``locate`` gives a route table's location from its name (the sink's ``route_table``);
    ``formats`` its ``RecordFormat`` - its rule's own settings, else the sink's
    (``config.routes.RouteFormats``); ``schemas`` the schemas of the tables that exist (a
    new one starts from its format's first schema, as a new typed table does)."""

    routes: Router
    locate: Callable[[str], TableLocation]
    formats: Callable[[str], RecordFormat]
    schemas: dict[str, pa.Schema] = field(default_factory=dict)


class TableWrites:
    """A task's files of a write into one table: each raw block decoded with the table's
    format (typed formats) against its schema, then into the table's ``TaskFiles`` -
    rows, and bad records as dead letters (``errors: stop``: ``BadRecordError``)."""

    def __init__(
        self, files: TaskFiles, record_format: RecordFormat | None, table_schema: pa.Schema | None
    ) -> None:
        self.files, self.format, self.table_schema = (
            files,
            typed_format(record_format),
            table_schema,
        )

    def add(self, group: int, raw: pa.Table) -> None:
        if self.format is None:
            self.files.add(group, raw)
            return
        decoded = decode_block(raw, self.format, self.table_schema)
        self.files.add(group, decoded.rows, decoded.dead_letters)

    def finish(self) -> list[tuple[int, str]]:
        return self.files.finish()

    def abort(self) -> None:
        self.files.abort()


class RoutedFiles:
    """A task's files of a routed write: the raw block is split by table first
    (``formats.route_split``), then each table's rows are decoded with that table's own
    format against its own schema into files of its own (``TableWrites`` per table, under
    the table's location). Unrouted records are dead letters of the sink's own
    ``location``, or - ``unrouted: stop`` - fail the write like a bad record."""

    def __init__(self, layout: FilesLayout, routing: RoutedWrite) -> None:
        self.layout, self.routing = layout, routing
        self.tables: dict[str | None, TableWrites] = {}

    def _files(self, name: str | None) -> TableWrites:
        files = self.tables.get(name)
        if files is None:
            if name is None:  # the unrouted records' dead letters, in the sink's own table
                files = TableWrites(self.layout.files(self.layout.record_format), None, None)
            else:
                fmt = self.routing.formats(name)
                task_files = self.layout.files(fmt, self.routing.locate(name))
                files = TableWrites(task_files, fmt, self.routing.schemas.get(name))
            self.tables[name] = files
        return files

    def add(self, group: int, raw: pa.Table) -> None:
        block = split_block(raw, self.routing.routes)
        unrouted = block.unrouted
        if unrouted is not None:
            if self.routing.routes.unrouted == "stop":
                first = unrouted.slice(0, 1).to_pylist()[0]
                key = f"{first['_kafka_cluster']}/{first['_kafka_topic']}/"
                raise BadRecordError(
                    key + str(first["_kafka_partition"]), first["_kafka_offset"], first["reason"]
                )
            self._files(None).files.add(group, raw.slice(0, 0), unrouted)
        for name, rows in block.tables.items():
            self._files(name).add(group, rows)

    def finish(self) -> list[tuple[int, str, str | None]]:
        return [
            (group, rel, name)
            for name, files in self.tables.items()
            for group, rel in files.finish()
        ]

    def abort(self) -> None:
        for files in self.tables.values():
            files.abort()


@dataclass(frozen=True)
class FilesLayout:
    """What every table's files of one task share: where the write's files are staged,
    the blocks' schema, the groups and how they share files; ``record_format`` the write's
    own (the sink's)."""

    location: TableLocation
    staging_rel: str
    schema: pa.Schema
    n_groups: int
    record_format: RecordFormat | None
    share_of: list[str | None] | None
    key_of: Sequence[str | None] | None

    def files(
        self, record_format: RecordFormat | None, location: TableLocation | None = None
    ) -> TaskFiles:
        return TaskFiles(
            location or self.location,
            self.staging_rel,
            self.schema,
            record_format,
            self.share_of,
            self.key_of,
            self.n_groups,
        )

    def writes(
        self, table_schema: pa.Schema | None, routing: RoutedWrite | None
    ) -> TableWrites | RoutedFiles:
        """The task's writes: into the one table, or - ``routing`` - into each record's."""
        if routing is not None:
            return RoutedFiles(self, routing)
        return TableWrites(self.files(self.record_format), self.record_format, table_schema)
