"""The one place that maps a sink's configuration to the committer of its table kind."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayconnect.formats.settings import RecordFormat
from rayconnect.pipelines.sink_config import DeltaSink, IcebergSink, TableSink
from rayconnect.tables.base import TableCommitter

if TYPE_CHECKING:
    from rayconnect.tables.delta_upkeep import DeltaUpkeep


def open_committer(
    sink: TableSink, pipeline: str, record_format: RecordFormat | None = None
) -> TableCommitter:
    """The committer for ``sink``'s table, for pipeline ``pipeline`` (no IO yet);
    ``record_format``: the source's decoding (None or raw: the raw table)."""
    if isinstance(sink, IcebergSink):
        from rayconnect.tables.iceberg import IcebergCommitter

        return IcebergCommitter(
            sink.catalog_properties(),
            sink.table,
            sink.location(),
            pipeline,
            catalog_name=sink.catalog_name,
            keep_snapshots=sink.keep_snapshots,
            record_format=record_format,
        )
    if isinstance(sink, DeltaSink):
        from rayconnect.tables.delta import DeltaCommitter

        return DeltaCommitter(sink.location(), pipeline, record_format=record_format)
    raise TypeError(f"no committer for a sink of type {type(sink).__name__}")


def open_upkeep(
    sink: TableSink, pipeline: str, record_format: RecordFormat | None = None
) -> DeltaUpkeep | None:
    """Compaction and log upkeep for ``sink``'s table (no IO yet); None for Iceberg, whose
    committer expires snapshots and merges manifests as it commits."""
    if isinstance(sink, DeltaSink):
        from rayconnect.tables.delta_upkeep import DeltaUpkeep

        return DeltaUpkeep(
            sink.location(),
            pipeline,
            sink.compact,
            sink.log,
            sink.vacuum_retention_hours,
            record_format,
        )
    return None
