"""Two compactions of one Delta table that raced: found in the log, their duplicates removed.

delta-rs 1.6.6 does not detect two OPTIMIZEs that rewrite the same file concurrently: its
conflict checker ignores a winning commit's removes that change no data (``dataChange=false``),
so both commit, and every row of the doubly compacted files is then in the table twice
(measured: 3 of 3 races of two ``optimize.compact()``, both orders; a DELETE against an OPTIMIZE
is detected in both orders). The pipeline compacts its table by itself and a user may run
OPTIMIZE on it too, so this can happen to any rayconnect table, and the exactly-once promise
would be broken by the table format's writer, not by the pipeline.

What gives it away: a logical file removed by two commits (its path and deletion vector are
unique, so only a writer that did not see the first remove removes it again). ``CompactionRaces`` reads each new log
entry once (upkeep calls it after each compaction and tidy, before expired log entries are
cleaned up), and for each such pair rewrites the rows of the doubly removed files' Kafka
coordinates - one copy each - with a predicate overwrite (``write_deltalake(mode="overwrite",
predicate=...)``, a data-changing commit that delta-rs does check against concurrent writers).
Rounds never conflict with it: they append offsets beyond every committed one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from rayconnect.storage.delta_reads import delta_dataset
from rayconnect.storage.location import TableLocation
from rayconnect.tables.delta_dv import dv_unique_id
from rayconnect.tables.delta_log import NO_LOG_CLEANUP

log = logging.getLogger(__name__)

#: the columns that identify a row (one Kafka record), raw and typed tables
RAW_COORDINATES = ("cluster", "topic", "partition", "offset")
TYPED_COORDINATES = ("_kafka_cluster", "_kafka_topic", "_kafka_partition", "_kafka_offset")
#: how far back a scan starts when upkeep starts (a race just before a restart is found)
SCAN_BACK_VERSIONS = 200
#: removed paths remembered this many versions (a compaction that read an older snapshot
#: than that would have lost to the log retention anyway)
REMEMBER_VERSIONS = 20_000


class Race:
    """Commit ``later`` removed ``paths`` that commit ``earlier`` had removed already."""

    def __init__(self, earlier: int, later: int, paths: list[str]) -> None:
        self.earlier, self.later, self.paths = earlier, later, paths

    def __repr__(self) -> str:
        return f"Race(versions {self.earlier} and {self.later}, {len(self.paths)} files)"


class CompactionRaces:
    """Scans one table's log for doubly removed files and rewrites their rows once."""

    def __init__(
        self,
        table_uri: str,
        storage_options: dict[str, str] | None,
        commit_actions: Callable[[int], list[dict]],
        read_file: Callable[[str], pa.Table],
    ) -> None:
        self.uri = table_uri
        self.options = storage_options
        self._commit_actions = commit_actions
        self._read_file = read_file  # a table-relative path -> its rows (coordinates at least)
        self.scanned: int | None = None
        self._removed_by: dict[tuple[str, str | None], int] = {}
        self.repaired = 0
        self._lock = threading.Lock()

    def check(self, dt: DeltaTable) -> dict[str, Any]:
        """Scan the log up to ``dt``'s version and repair what raced. Returns what it did.
        One check at a time (compaction and tidy may run in two upkeep threads)."""
        with self._lock:
            return self._check(dt)

    def _check(self, dt: DeltaTable) -> dict[str, Any]:
        latest = dt.version()
        if self.scanned is None:
            self.scanned = max(latest - SCAN_BACK_VERSIONS, -1)
        races = list(self._scan(self.scanned + 1, latest))
        self.scanned = latest
        forget = latest - REMEMBER_VERSIONS
        self._removed_by = {p: v for p, v in self._removed_by.items() if v > forget}
        rows = 0
        for race in races:
            log.error(
                "table %s: %r - two compactions rewrote the same files (delta-rs does not "
                "detect it); rewriting their rows once",
                self.uri,
                race,
            )
            rows += self.repair(race)
            self.repaired += 1
        return {"checked_to": latest, "races": len(races), "rows_rewritten": rows}

    def _scan(self, first: int, last: int) -> Iterable[Race]:
        for version in range(first, last + 1):
            removes = [a["remove"] for a in self._commit_actions(version) if "remove" in a]
            again = [r for r in removes if _logical_file(r) in self._removed_by]
            if again:
                first = self._removed_by[_logical_file(again[0])]
                yield Race(first, version, [r["path"] for r in again])
            for r in removes:
                self._removed_by.setdefault(_logical_file(r), version)

    def repair(self, race: Race) -> int:
        """Rewrite, one copy each, every row whose coordinates a doubly removed file held.
        Returns the rows written."""
        keys = pa.concat_tables([self._read_file(p) for p in race.paths], promote_options="default")
        dt = DeltaTable(self.uri, storage_options=self.options)
        names = dt.schema().to_arrow().names
        coords = TYPED_COORDINATES if TYPED_COORDINATES[3] in names else RAW_COORDINATES
        ranges = _offset_ranges(keys.select(list(coords)))
        location = TableLocation.parse(self.uri, self.options)
        current = delta_dataset(dt, location).to_table(filter=_expression(coords, ranges))
        once = _first_of_each(current, coords)
        write_deltalake(
            self.uri,
            once,
            mode="overwrite",
            predicate=_predicate(coords, ranges),
            storage_options=self.options or None,
            partition_by=dt.metadata().partition_columns or None,
            post_commithook_properties=NO_LOG_CLEANUP,
        )
        return once.num_rows


Range = tuple[str, str, int, int, int]  # cluster, topic, partition, first offset, last offset


def _logical_file(remove: dict[str, Any]) -> tuple[str, str | None]:
    """A removed file as Delta names a logical file: its path and its deletion vector (a
    merge-on-read round removes a path and adds it back with a new one - not a race)."""
    return remove["path"], dv_unique_id(remove)


def _offset_ranges(keys: pa.Table) -> list[Range]:
    """The rows' coordinates as contiguous offset ranges per (cluster, topic, partition)."""
    cluster, topic, partition, offset = (keys.column(i).to_pylist() for i in range(4))
    by_partition: dict[tuple[str, str, int], list[int]] = {}
    for c, t, p, o in zip(cluster, topic, partition, offset, strict=True):
        by_partition.setdefault((c, t, p), []).append(o)
    ranges: list[Range] = []
    for (c, t, p), offsets in sorted(by_partition.items()):
        offsets.sort()
        start = prev = offsets[0]
        for o in offsets[1:]:
            if o > prev + 1:
                ranges.append((c, t, p, start, prev))
                start = o
            prev = o
        ranges.append((c, t, p, start, prev))
    return ranges


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _predicate(coords: tuple[str, ...], ranges: list[Range]) -> str:
    """The ranges as a delta-rs (DataFusion SQL) predicate."""
    c, t, p, o = (f"`{n}`" for n in coords)
    return " OR ".join(
        f"({c} = {_quote(cl)} AND {t} = {_quote(tp)} AND {p} = {part} AND {o} >= {lo} "
        f"AND {o} <= {hi})"
        for cl, tp, part, lo, hi in ranges
    )


def _expression(coords: tuple[str, ...], ranges: list[Range]) -> ds.Expression:
    """The same ranges as a pyarrow dataset filter."""
    c, t, p, o = (ds.field(n) for n in coords)
    parts = [
        (c == cl) & (t == tp) & (p == part) & (o >= lo) & (o <= hi)
        for cl, tp, part, lo, hi in ranges
    ]
    expression = parts[0]
    for part in parts[1:]:
        expression = expression | part
    return expression


def _first_of_each(table: pa.Table, coords: tuple[str, ...]) -> pa.Table:
    """One row per coordinates (the copies are the same rows)."""
    indexed = table.select(list(coords)).append_column("_i", pa.array(range(table.num_rows)))
    first = indexed.group_by(list(coords), use_threads=False).aggregate([("_i", "min")])
    picked = first.column("_i_min")
    return table.take(pc.take(picked, pc.sort_indices(picked)))


def read_coordinates(filesystem: Any, path_of: Callable[[str], str]) -> Callable[[str], pa.Table]:
    """A ``read_file`` for ``CompactionRaces``: the file's coordinate columns, from storage."""

    def read(path: str) -> pa.Table:
        full = path_of(path)
        names = pq.read_schema(full, filesystem=filesystem).names
        # a Delta partition column is not in the file: its value is in the Hive folder
        folders = dict(seg.split("=", 1) for seg in path.split("/")[:-1] if "=" in seg)
        coords = TYPED_COORDINATES if "_kafka_offset" in names else RAW_COORDINATES
        rows = pq.read_table(full, columns=[c for c in coords if c in names], filesystem=filesystem)
        for i, name in enumerate(coords):
            if name not in rows.column_names:
                kind = pa.int32() if i == 2 else pa.string()
                value = pa.scalar(folders[name]).cast(kind)
                rows = rows.add_column(i, name, pa.array([value.as_py()] * rows.num_rows, kind))
        return rows.select(list(coords))

    return read
