"""The one place that maps a sink's configuration to the committer of its table kind."""

from __future__ import annotations

from rayconnect.errors import ConfigError
from rayconnect.formats.settings import RecordFormat
from rayconnect.pipelines.sink_config import DeltaSink, IcebergSink, TableSink
from rayconnect.tables.base import TableCommitter


def open_committer(
    sink: TableSink, pipeline: str, record_format: RecordFormat | None = None
) -> TableCommitter:
    """The committer for ``sink``'s table, for pipeline ``pipeline`` (no IO yet);
    ``record_format``: the source's decoding (typed tables are Delta only)."""
    typed = record_format is not None and record_format.typed
    if isinstance(sink, IcebergSink):
        if typed:
            raise ConfigError("source.value_format: typed tables are Delta-only so far")
        from rayconnect.tables.iceberg import IcebergCommitter

        return IcebergCommitter(
            sink.catalog_properties(),
            sink.table,
            sink.location(),
            pipeline,
            catalog_name=sink.catalog_name,
            keep_snapshots=sink.keep_snapshots,
        )
    if isinstance(sink, DeltaSink):
        from rayconnect.tables.delta import DeltaCommitter

        return DeltaCommitter(sink.location(), pipeline, record_format=record_format)
    raise TypeError(f"no committer for a sink of type {type(sink).__name__}")
