"""Table upkeep: its settings and the pure schedule that says when each job is due.

A pipeline commits a version every few seconds, each with a few small files per partition:
left alone, readers slow down with the file count and the log grows without end. Three jobs
keep the table healthy, run by the coordinator actor beside its rounds (see
``actors/coordinator.py`` for why there and not in an actor of their own):

- ``COMPACT``: bin-pack small files into ``target_file_mb`` files (Delta ``OPTIMIZE``,
  ``dataChange=false``; or Z-order). Due once ``min_files`` files were committed since the
  last compaction and at least ``every_s`` after it.
- ``TIDY``: every ``tidy_every_s``: make sure a checkpoint is recent, drop log entries older
  than ``log_retention_hours`` (before the last checkpoint), and vacuum: uncommitted files of
  aborted rounds and files compacted away, once older than the sink's
  ``vacuum_retention_hours``.

A sink with routes writes many tables, made on the fly: each gets an ``UpkeepSchedule`` of
its own at its first commit (``RouteUpkeep``), with its route's thresholds, and ONE job of
all of them runs at a time - 200 tables compacting side by side would swamp the machine the
rounds run on - the tables taking turns.

No IO here and time is an input (``now``, any clock): the coordinator's housekeeping machine
(``protocol.housekeeping``) asks ``due`` on its ticks and reports back with ``finished``; the
tests drive it without a table.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

import msgspec

from rayconnect.errors import require


class CompactSettings(msgspec.Struct, frozen=True):
    """When and how the pipeline compacts its table's small files (Delta sinks).

    On by default: a compaction changes no data (``dataChange=false``), and delta-rs lets a
    round's commit (a blind append with txn versions) and a compaction pass each other in
    either order, so it never costs a round (``tests/integration/tables``)."""

    #: the pipeline compacts its table
    enabled: bool = True
    #: files are bin-packed into files of about this size
    target_file_mb: int = 128
    #: compact once at least this many files were committed since the last compaction
    min_files: int = 64
    #: and at least this long after the last one started
    every_s: float = 300.0
    #: Z-order by these columns instead of bin-packing: rewrites the WHOLE table every time
    #: (keep ``every_s`` long); empty: plain compaction
    zorder_by: tuple[str, ...] = ()
    #: delta-rs tasks rewriting at once (each holds about one target file in memory)
    max_concurrent_tasks: int = 1
    #: a compaction that loses a race with another writer's commit is tried again this many
    #: times, then given up until it is next due
    retries: int = 2

    def __post_init__(self) -> None:
        require(self.target_file_mb >= 1, "sink.compact.target_file_mb must be >= 1")
        require(self.min_files >= 2, "sink.compact.min_files must be >= 2")
        require(self.every_s >= 0, "sink.compact.every_s must be >= 0")
        require(self.max_concurrent_tasks >= 1, "sink.compact.max_concurrent_tasks must be >= 1")
        require(self.retries >= 0, "sink.compact.retries must be >= 0")
        require(
            len(set(self.zorder_by)) == len(self.zorder_by),
            f"sink.compact.zorder_by names a column twice: {list(self.zorder_by)}",
        )


class FoldDeletes(msgspec.Struct, frozen=True):
    """When the pipeline folds a merge-on-read Iceberg table's deletes into its data files
    (``tables.iceberg_compaction``): every merge-on-read round adds delete files that every
    scan applies, so without this reads slow down round after round."""

    #: the pipeline folds deletes (an upsert table with ``upsert_mode: merge_on_read``)
    enabled: bool = True
    #: at most this often
    every_s: float = 300.0
    #: a data file is rewritten once at least this fraction of its rows is deleted
    min_deleted_fraction: float = 0.2
    #: data files rewritten in one run (most deleted first): a short run rarely loses the
    #: race with a round's commit
    max_files: int = 16
    #: a run that loses that race is tried again this many times, then left until next due
    retries: int = 2

    def __post_init__(self) -> None:
        require(self.every_s >= 0, "sink.fold_deletes.every_s must be >= 0")
        require(
            0 < self.min_deleted_fraction <= 1,
            "sink.fold_deletes.min_deleted_fraction must be in (0, 1]",
        )
        require(self.max_files >= 1, "sink.fold_deletes.max_files must be >= 1")
        require(self.retries >= 0, "sink.fold_deletes.retries must be >= 0")

    def schedule(self) -> CompactSettings:
        """As the upkeep schedule's compaction: due every ``every_s`` once a round landed."""
        return CompactSettings(enabled=self.enabled, min_files=2, every_s=self.every_s)


class LogSettings(msgspec.Struct, frozen=True):
    """The Delta log's health: checkpoints, log retention, and how often upkeep runs.

    ``checkpoint_interval`` and ``log_retention_hours`` are written into the table's
    properties (``delta.checkpointInterval``, ``delta.logRetentionDuration``) when the
    pipeline starts, so every writer of the table follows them."""

    #: delta-rs writes a checkpoint every this many versions; recovery reads the last one
    #: plus the commits after it, so its time does not grow with the log
    checkpoint_interval: int = 100
    #: log entries older than this (and older than the last checkpoint) are deleted; time
    #: travel cannot go further back. A week, not Delta's 30 days: a pipeline's log grows by
    #: ~40 KB a version at 32 partitions (bench/results/upkeep), ~1.7 GB a day at a 2 s
    #: interval; versions older than ``vacuum_retention_hours`` cannot be read anyway
    log_retention_hours: float = 168.0
    #: how often checkpoints are checked, the log cleaned and the table vacuumed
    tidy_every_s: float = 3600.0

    def __post_init__(self) -> None:
        require(self.checkpoint_interval >= 1, "sink.log.checkpoint_interval must be >= 1")
        require(self.log_retention_hours > 0, "sink.log.log_retention_hours must be > 0")
        require(self.tidy_every_s > 0, "sink.log.tidy_every_s must be > 0")
        require(
            self.log_retention_hours * 3600 >= 2 * self.tidy_every_s,
            "sink.log.log_retention_hours must keep log entries at least two tidy_every_s "
            f"({2 * self.tidy_every_s:g} s): upkeep reads each entry once to find compactions "
            "that raced another writer's OPTIMIZE (tables/compaction_races.py)",
        )


class Job(enum.Enum):
    COMPACT = "compact"
    TIDY = "tidy"


class UpkeepStatus(msgspec.Struct, frozen=True):
    """What upkeep did so far (the coordinator's status shows it)."""

    #: compactions done
    compactions: int
    #: compactions given up after losing races to other writers
    compactions_given_up: int
    #: tidies done (checkpoint, log cleanup, vacuum)
    tidies: int
    #: tidies that failed
    tidies_failed: int
    #: files committed since the last compaction
    files_since_compaction: int
    #: the jobs running now
    running: tuple[str, ...]
    #: the last job's failure
    last_error: str | None


class UpkeepSchedule:
    """Which upkeep job is due, one of each at a time.

    ``committed(files, now)`` after every commit of the pipeline; ``due(now)`` returns the
    jobs to start now (and marks them running); ``finished(job, ok, now, error)`` when one
    ends. A failed or given-up compaction keeps its file count, so it is due again after
    ``every_s``; a tidy that failed is tried again after ``tidy_every_s``.
    """

    def __init__(self, compact: CompactSettings, log: LogSettings, now: float) -> None:
        self.compact = compact
        self.log = log
        self._files = 0
        self._last: dict[Job, float] = {Job.COMPACT: now, Job.TIDY: now}
        self._running: set[Job] = set()
        self._compactions = self._given_up = self._tidies = self._tidies_failed = 0
        self._error: str | None = None
        self._counted_at_start = 0

    def committed(self, files: int, now: float) -> None:
        """The pipeline committed a version adding ``files`` files."""
        self._files += files

    def due(self, now: float, at_most: int | None = None) -> list[Job]:
        """Jobs to start now (no more than ``at_most``: a compaction first); they count as
        running until ``finished``."""
        jobs: list[Job] = []
        if (
            self.compact.enabled
            and Job.COMPACT not in self._running
            and self._files >= self.compact.min_files
            and now - self._last[Job.COMPACT] >= self.compact.every_s
        ):
            jobs.append(Job.COMPACT)
            self._counted_at_start = self._files
        if Job.TIDY not in self._running and now - self._last[Job.TIDY] >= self.log.tidy_every_s:
            jobs.append(Job.TIDY)
        jobs = jobs[:at_most]
        for job in jobs:
            self._running.add(job)
            self._last[job] = now
        return jobs

    def finished(self, job: Job, ok: bool, now: float, error: str | None = None) -> None:
        """A job ended: ``ok`` if it did its work (a compaction with nothing to do is ok)."""
        if job not in self._running:
            raise ValueError(f"{job.value} finished but was not running")
        self._running.discard(job)
        if not ok:
            self._error = f"{job.value}: {error}" if error else f"{job.value} failed"
        if job is Job.COMPACT:
            if ok:
                self._compactions += 1
                # files committed while it ran were not in its snapshot: they count on
                self._files -= self._counted_at_start
            else:
                self._given_up += 1
        elif ok:
            self._tidies += 1
        else:
            self._tidies_failed += 1

    def status(self) -> UpkeepStatus:
        return UpkeepStatus(
            compactions=self._compactions,
            compactions_given_up=self._given_up,
            tidies=self._tidies,
            tidies_failed=self._tidies_failed,
            files_since_compaction=self._files,
            running=tuple(sorted(j.value for j in self._running)),
            last_error=self._error,
        )


class TableJob(msgspec.Struct, frozen=True):
    """An upkeep job of one route table."""

    table: str
    job: Job


class RouteUpkeep:
    """The upkeep of a routed sink's tables: an ``UpkeepSchedule`` per table, made at its
    first commit by ``schedule_of(table, now)`` (its route's thresholds; the table's clock
    starts then), and at most ONE job of them all running at a time. Tables take turns:
    ``due`` looks at them starting after the last one served, so a table whose jobs are
    always due cannot keep the others waiting."""

    def __init__(self, schedule_of: Callable[[str, float], UpkeepSchedule]) -> None:
        self.schedule_of = schedule_of
        self.schedules: dict[str, UpkeepSchedule] = {}
        self._running: TableJob | None = None
        self._last_served: str | None = None

    def committed(self, files: Mapping[str, int], now: float) -> None:
        """A round committed ``files`` (table -> files it added) to these tables."""
        for table, n in files.items():
            if table not in self.schedules:
                self.schedules[table] = self.schedule_of(table, now)
            self.schedules[table].committed(n, now)

    def due(self, now: float) -> list[TableJob]:
        """The one job to start now, if none is running and a table has one due."""
        if self._running is not None or not self.schedules:
            return []
        tables = sorted(self.schedules)
        if self._last_served is not None:
            after = [t for t in tables if t > self._last_served]
            tables = after + [t for t in tables if t <= self._last_served]
        for table in tables:
            jobs = self.schedules[table].due(now, at_most=1)
            if jobs:
                self._running = TableJob(table, jobs[0])
                self._last_served = table
                return [self._running]
        return []

    def finished(
        self, table: str, job: Job, ok: bool, now: float, error: str | None = None
    ) -> None:
        """The running job ended (as ``UpkeepSchedule.finished``)."""
        if self._running != TableJob(table, job):
            raise ValueError(f"{job.value} of {table!r} finished but was not running")
        self._running = None
        self.schedules[table].finished(job, ok, now, error)

    def status(self) -> dict[str, UpkeepStatus]:
        return {table: self.schedules[table].status() for table in sorted(self.schedules)}
