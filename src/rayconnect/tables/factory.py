"""The one place that maps a sink's configuration to its table kind's committer, upkeep and
upkeep schedule: actors never look at the sink's type."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rayconnect.config.sink import DeltaSink, IcebergSink, TableSink
from rayconnect.formats.settings import RecordFormat
from rayconnect.protocol.upkeep import CompactSettings, LogSettings, RouteUpkeep, UpkeepSchedule
from rayconnect.tables.base import TableCommitter, TableUpkeep
from rayconnect.write_modes.modes import APPEND, MergeOnRead, Upsert, WriteMode
from rayconnect.write_modes.row_delta import Search, search_here

if TYPE_CHECKING:
    from rayconnect.tables.iceberg import IcebergCommitter


def open_committer(
    sink: TableSink,
    pipeline: str,
    record_format: RecordFormat | None = None,
    search: Search = search_here,
) -> TableCommitter:
    """The committer for ``sink``'s table, for pipeline ``pipeline`` (no IO yet);
    ``record_format``: the source's decoding (None or raw: the raw table); ``search``:
    where a merge-on-read round's key search runs (``write_modes.key_search``)."""
    if isinstance(sink, IcebergSink):
        return iceberg_committer(sink, pipeline, record_format, search)
    if isinstance(sink, DeltaSink):
        from rayconnect.tables.delta import DeltaCommitter

        return DeltaCommitter(
            sink.location(),
            pipeline,
            record_format=record_format,
            apply=write_mode(record_format, sink, search),
        )
    raise TypeError(f"no committer for a sink of type {type(sink).__name__}")


def iceberg_committer(
    sink: IcebergSink,
    pipeline: str,
    record_format: RecordFormat | None,
    search: Search = search_here,
) -> IcebergCommitter:
    from rayconnect.tables.iceberg import IcebergCommitter

    return IcebergCommitter(
        sink.catalog_config(),
        sink.table,
        sink.location(),
        pipeline,
        catalog_name=sink.catalog_name,
        keep_snapshots=sink.keep_snapshots,
        record_format=record_format,
        apply=write_mode(record_format, sink, search),
    )


def open_own_table(sink: TableSink, pipeline: str) -> TableCommitter:
    """A routed sink's own table (``tables.table_set``): a dead-letter table for the records
    no route takes, and where the epoch is claimed. Delta: ``<path>/_dead_letters``;
    Iceberg: ``table`` itself, its files in ``<location>/_dead_letters``. Its files are
    staged under ``sink.location()``, as a typed table's dead letters are."""
    from rayconnect.formats.rows import DEAD_LETTER_SCHEMA
    from rayconnect.formats.settings import DEAD_LETTER_DIR
    from rayconnect.storage.location import TableLocation

    location = sink.location()
    dead = TableLocation(location.join(DEAD_LETTER_DIR), location.options)
    if isinstance(sink, IcebergSink):
        from rayconnect.tables.iceberg import IcebergCommitter

        return IcebergCommitter(
            sink.catalog_config(),
            sink.table,
            dead,
            pipeline,
            DEAD_LETTER_SCHEMA,
            sink.catalog_name,
            sink.keep_snapshots,
        )
    from rayconnect.tables.delta import DeltaCommitter

    return DeltaCommitter(dead, pipeline, DEAD_LETTER_SCHEMA, dead_letters=True)


def route_tables(sink: TableSink, pipeline: str, catalog: Any = None) -> list[str]:
    """The route tables of ``sink`` that exist now (by name): Delta tables in folders of
    ``sink.path``, Iceberg tables of the sink table's namespace (not its own, nor the
    dead-letter tables of others; ``catalog``: an open one to ask)."""
    from rayconnect.config.routes import bad_table_name

    if isinstance(sink, IcebergSink):
        namespace, own = sink.table.rsplit(".", 1)
        if catalog is None:
            catalog = iceberg_committer(sink, pipeline, None).catalog()
        if not catalog.namespace_exists(namespace):
            return []
        listed = {ident[-1] for ident in catalog.list_tables(namespace)}
        return sorted(
            n
            for n in listed
            if n != own
            and bad_table_name(n) is None
            and not (n.endswith("_dead_letters") and n.removesuffix("_dead_letters") in listed)
        )
    import pyarrow.fs as pafs

    location = sink.location()
    filesystem = location.filesystem()
    try:
        found = filesystem.get_file_info(pafs.FileSelector(location.path(), allow_not_found=True))
    except FileNotFoundError:
        return []
    names = []
    for info in found:
        if info.type != pafs.FileType.Directory or bad_table_name(info.base_name) is not None:
            continue
        log_dir = filesystem.get_file_info(location.path(f"{info.base_name}/_delta_log"))
        if log_dir.type == pafs.FileType.Directory:
            names.append(info.base_name)
    return sorted(names)


def write_mode(
    record_format: RecordFormat | None,
    sink: DeltaSink | IcebergSink,
    search: Search = search_here,
) -> WriteMode:
    """How a round's files change the table: upserted by key if the format has keys,
    copy-on-write or merge-on-read as the sink says."""
    if record_format is None or not record_format.upsert_keys:
        return APPEND
    if sink.upsert_mode == "merge_on_read":
        return MergeOnRead(record_format.upsert_keys, sink.key_index_rows, search=search)
    return Upsert(record_format.upsert_keys, search)


def open_upkeep(
    sink: TableSink, pipeline: str, record_format: RecordFormat | None = None
) -> TableUpkeep:
    """Upkeep for ``sink``'s table (no IO yet), with table objects of its own: it runs in a
    thread beside the rounds' committer. A Delta table's: compaction, checkpoints, log
    cleanup, vacuum; an Iceberg table's: vacuum (its committer expires snapshots and merges
    manifests as it commits). A sink with routes: none for its own table (its unrouted
    records, a few); each route table's is ``open_upkeep(sink.route_table(name), ...)``,
    opened by the coordinator at the table's first job (``route_upkeep_schedule``)."""
    if sink.routes is not None:
        return NoUpkeep()
    if isinstance(sink, IcebergSink):
        from rayconnect.tables.iceberg_upkeep import IcebergUpkeep

        committer = iceberg_committer(sink, pipeline, record_format)
        return IcebergUpkeep(committer, sink.vacuum_retention_hours, sink.fold_deletes)
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


class NoUpkeep:
    """The upkeep of a sink whose tables are not known in advance (routes): nothing yet."""

    def configure_table(self) -> dict[str, str]:
        return {}

    def compact(self) -> dict[str, Any]:
        return {}

    def tidy(self) -> dict[str, Any]:
        return {}


#: how often an Iceberg sink's table is vacuumed (a Delta sink's: ``sink.log.tidy_every_s``)
VACUUM_EVERY_S = 3600.0


def route_upkeep_schedule(sink: TableSink) -> RouteUpkeep:
    """The upkeep schedules of ``sink``'s route tables: each table's as a sink of its own
    (``upkeep_schedule``), with its rule's ``compact``/``log`` (``route_table``)."""
    return RouteUpkeep(lambda name, now: upkeep_schedule(sink.route_table(name), now))


def upkeep_schedule(sink: TableSink, now: float) -> UpkeepSchedule:
    """When the coordinator runs ``sink``'s upkeep jobs: a Delta sink's from its ``compact``
    and ``log`` settings; an Iceberg committer expires snapshots as it commits, so only the
    hourly tidy (vacuum of files no metadata reaches) is scheduled."""
    if isinstance(sink, DeltaSink):
        return UpkeepSchedule(sink.compact, sink.log, now)
    folds = sink.write_mode == "upsert" and sink.upsert_mode == "merge_on_read"
    compact = sink.fold_deletes.schedule() if folds else CompactSettings(enabled=False)
    return UpkeepSchedule(compact, LogSettings(tidy_every_s=VACUUM_EVERY_S), now)
