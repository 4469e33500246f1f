"""Parquet footers -> ``DataFile`` entries and Delta stats JSON; where files are staged.

Shared by the writer (which describes the files Spark wrote) and the committer (which checks
every file against the table before committing it). Everything is read from the Parquet
footer, never from the data pages: ~0.5 ms a file, so describing the files of a round costs
nothing next to the Spark job that wrote them.

Why stats at all: delta-rs, polars and DuckDB take a file's row count from the AddAction
stats; with empty stats readers count 0 rows, and min/max let readers skip files.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.protocol.types import DataFile, FileStats, TopicPartition
from rayconnect.storage.location import TableLocation, as_location

#: Folder (under the table root) where writers stage files before they are committed. Not
#: ``_staging``: delta-rs's vacuum skips top-level folders starting with ``_`` or ``.``, so
#: the files of aborted rounds would never be removed.
STAGING_DIR = "staging"

#: Delta truncates string stats; a longer min/max could be wrong as a bound, so it is left
#: out (no stat = no file skipping, never a wrong answer).
MAX_STRING_STAT = 32


def _stat_value(value: Any) -> int | float | str | None:
    """A footer min/max as a Delta stats JSON value (timestamps as ISO-8601 UTC, µs)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING_STAT else None
    return None  # binary and anything else: no min/max


def footer_stats(metadata: pq.FileMetaData) -> FileStats:
    """Min/max/null count per top-level primitive column, merged over all row groups.

    Binary columns (Kafka key/value) get a null count only: their bounds are neither
    useful for skipping nor representable in Delta's JSON stats.
    """
    schema = metadata.schema.to_arrow_schema()
    primitive = {f.name for f in schema if not pa.types.is_nested(f.type)}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    no_minmax: set[str] = set()
    for rg in range(metadata.num_row_groups):
        row_group = metadata.row_group(rg)
        for ci in range(row_group.num_columns):
            col = row_group.column(ci)
            name = col.path_in_schema
            if name not in primitive:
                continue
            st = col.statistics
            if st is None:
                no_minmax.add(name)
                continue
            if st.has_null_count:
                nulls[name] = nulls.get(name, 0) + st.null_count
            if not st.has_min_max:
                # all-null row groups have no min/max and don't affect the file's bounds
                if st.has_null_count and st.null_count == row_group.num_rows:
                    continue
                no_minmax.add(name)
                continue
            lo, hi = st.min, st.max
            mins[name] = lo if name not in mins else min(mins[name], lo)
            maxs[name] = hi if name not in maxs else max(maxs[name], hi)
    min_values: dict[str, int | float | str | None] = {}
    max_values: dict[str, int | float | str | None] = {}
    for name in mins:
        if name in no_minmax:
            continue
        lo, hi = _stat_value(mins[name]), _stat_value(maxs[name])
        if lo is not None and hi is not None:
            min_values[name] = lo
            max_values[name] = hi
    return FileStats(min_values=min_values, max_values=max_values, null_count=nulls)


def describe_file(
    table: str | TableLocation, rel_path: str, filesystem: Any = None, dead_letters: bool = False
) -> tuple[DataFile, pa.Schema]:
    """Build the ``DataFile`` of one Parquet file under the table from its footer.

    Reads through the table's filesystem (a local folder or an object store: a footer is one
    ranged GET). ``filesystem`` reuses an open one. Also returns the file's Arrow schema, so
    a caller can check it without a second read. ``dead_letters``: the file holds bad
    records; their partitions are counted from its ``_kafka_*`` columns (one more read, of
    a small file: bad records are rare), not guessed from its min/max stats.
    """
    location = as_location(table)
    fs = filesystem if filesystem is not None else location.filesystem()
    path = location.path(rel_path)
    info = fs.get_file_info(path)
    if info.size is None:
        raise FileNotFoundError(f"{location.join(rel_path)}: no such file")
    with fs.open_input_file(path) as fh:
        metadata = pq.read_metadata(fh)
    mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
    data_file = DataFile(
        path=rel_path,
        size=info.size,
        records=metadata.num_rows,
        modification_time_ms=mtime,
        stats=footer_stats(metadata),
        dead_letters=_partition_counts(path, fs) if dead_letters else {},
    )
    return data_file, metadata.schema.to_arrow_schema()


#: the columns of a decoded row that say which partition it came from
_COORDINATES = ["_kafka_cluster", "_kafka_topic", "_kafka_partition"]


def _partition_counts(path: str, filesystem: Any) -> dict[str, int]:
    rows = pq.read_table(path, columns=_COORDINATES, filesystem=filesystem)
    counts = rows.group_by(_COORDINATES).aggregate([([], "count_all")]).to_pylist()
    return {TopicPartition(*(row[c] for c in _COORDINATES)).key: row["count_all"] for row in counts}


def delta_stats_json(data_file: DataFile) -> str:
    """The ``stats`` string of a Delta AddAction for this file."""
    stats: dict[str, Any] = {"numRecords": data_file.records}
    if data_file.stats.min_values:
        stats["minValues"] = data_file.stats.min_values
        stats["maxValues"] = data_file.stats.max_values
    if data_file.stats.null_count:
        stats["nullCount"] = data_file.stats.null_count
    return json.dumps(stats, separators=(",", ":"))
