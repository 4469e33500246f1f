"""The one place that maps a sink's configuration to its table kind's committer, upkeep and
upkeep schedule: actors never look at the sink's type."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayconnect.config.sink import DeltaSink, IcebergSink, TableSink
from rayconnect.formats.settings import RecordFormat
from rayconnect.protocol.upkeep import CompactSettings, LogSettings, UpkeepSchedule
from rayconnect.tables.append import APPEND
from rayconnect.tables.base import RoundApply, TableCommitter, TableUpkeep

if TYPE_CHECKING:
    from rayconnect.tables.iceberg import IcebergCommitter


def open_committer(
    sink: TableSink, pipeline: str, record_format: RecordFormat | None = None
) -> TableCommitter:
    """The committer for ``sink``'s table, for pipeline ``pipeline`` (no IO yet);
    ``record_format``: the source's decoding (None or raw: the raw table)."""
    if isinstance(sink, IcebergSink):
        return iceberg_committer(sink, pipeline, record_format)
    if isinstance(sink, DeltaSink):
        from rayconnect.tables.delta import DeltaCommitter

        return DeltaCommitter(
            sink.location(), pipeline, record_format=record_format, apply=write_mode(record_format)
        )
    raise TypeError(f"no committer for a sink of type {type(sink).__name__}")


def iceberg_committer(
    sink: IcebergSink, pipeline: str, record_format: RecordFormat | None
) -> IcebergCommitter:
    from rayconnect.tables.iceberg import IcebergCommitter

    return IcebergCommitter(
        sink.catalog_properties(),
        sink.table,
        sink.location(),
        pipeline,
        catalog_name=sink.catalog_name,
        keep_snapshots=sink.keep_snapshots,
        record_format=record_format,
        apply=write_mode(record_format),
    )


def write_mode(record_format: RecordFormat | None) -> RoundApply:
    """How a round's files change the table: upserted by key if the format has keys."""
    if record_format is not None and record_format.upsert_keys:
        from rayconnect.tables.upsert import Upsert

        return Upsert(record_format.upsert_keys)
    return APPEND


def open_upkeep(
    sink: TableSink, pipeline: str, record_format: RecordFormat | None = None
) -> TableUpkeep:
    """Upkeep for ``sink``'s table (no IO yet), with table objects of its own: it runs in a
    thread beside the rounds' committer. A Delta table's: compaction, checkpoints, log
    cleanup, vacuum; an Iceberg table's: vacuum (its committer expires snapshots and merges
    manifests as it commits)."""
    if isinstance(sink, IcebergSink):
        from rayconnect.tables.iceberg_upkeep import IcebergUpkeep

        committer = iceberg_committer(sink, pipeline, record_format)
        return IcebergUpkeep(committer, sink.vacuum_retention_hours)
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
    raise TypeError(f"no upkeep for a sink of type {type(sink).__name__}")


#: how often an Iceberg sink's table is vacuumed (a Delta sink's: ``sink.log.tidy_every_s``)
VACUUM_EVERY_S = 3600.0


def upkeep_schedule(sink: TableSink, now: float) -> UpkeepSchedule:
    """When the coordinator runs ``sink``'s upkeep jobs: a Delta sink's from its ``compact``
    and ``log`` settings; an Iceberg committer expires snapshots as it commits, so only the
    hourly tidy (vacuum of files no metadata reaches) is scheduled."""
    if isinstance(sink, DeltaSink):
        return UpkeepSchedule(sink.compact, sink.log, now)
    return UpkeepSchedule(
        CompactSettings(enabled=False), LogSettings(tidy_every_s=VACUUM_EVERY_S), now
    )
