"""Upkeep of a pipeline's Delta table: table properties, compaction, checkpoints, log cleanup,
vacuum (the *when* is ``protocol.upkeep.UpkeepSchedule``; this is the *how*).

Compaction beside running rounds (measured on delta-rs 1.6.6, ``tests/integration/tables/
test_delta_upkeep.py``): a compaction is ``OPTIMIZE`` with ``dataChange=false``; a round is a
blind append with txn actions that reads no files. delta-rs's conflict checker lets each pass
the other in both orders - a round that commits while a compaction rewrites is kept (the
compaction commits after it and leaves its files alone), and a round that read the table
before a compaction committed still commits, exactly once, because the coordinator's
compare-and-set looks at txn versions, which a compaction never touches. What can make a
compaction fail is another writer removing a file it rewrote (a user's DELETE): it is then
tried again on a fresh snapshot, ``retries`` times, and otherwise left until next due.

This object has its own ``DeltaTable``: it runs in the coordinator's upkeep thread, beside
(not inside) the committer of the rounds, which is not thread-safe.

A typed table's dead-letter table (``<table>/_dead_letters``, made on the first bad record)
gets the same upkeep with the same settings, right after the main table's: it commits in
every round that has bad records, so without it its log and small files would grow too.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from rayconnect.formats.rows import DEAD_LETTER_SCHEMA
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat
from rayconnect.protocol.upkeep import CompactSettings, LogSettings
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables.compaction_races import CompactionRaces, read_coordinates
from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.delta_log import NO_LOG_CLEANUP

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL = "delta.checkpointInterval"
LOG_RETENTION = "delta.logRetentionDuration"
#: how long checkpoints keep the remove actions (tombstones) of compacted-away files
TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"


def log_retention_value(hours: float) -> str:
    """A Delta duration property for ``hours`` (whole seconds, rounded up)."""
    return f"interval {math.ceil(hours * 3600)} seconds"


class DeltaUpkeep:
    """Compacts and tidies one Delta table for one pipeline. Not thread-safe; one thread."""

    def __init__(
        self,
        table: str | TableLocation,
        pipeline: str,
        compact: CompactSettings,
        log_settings: LogSettings,
        vacuum_retention_hours: float,
        record_format: RecordFormat | None = None,
        dead_letters: bool = False,
    ) -> None:
        self.location = as_location(table)
        self.compact_settings = compact
        self.log_settings = log_settings
        self.vacuum_retention_hours = vacuum_retention_hours
        # vacuum (and its safety rules) is the committer's; a committer of our own, so
        # that nothing here shares a DeltaTable with the rounds' committer
        if dead_letters:
            self._committer = DeltaCommitter(
                self.location, pipeline, DEAD_LETTER_SCHEMA, dead_letters=True
            )
        else:
            self._committer = DeltaCommitter(self.location, pipeline, record_format=record_format)
        self._options = self.location.delta_options()
        self.races = CompactionRaces(
            self.location.uri,
            self._options,
            self._committer.log.commit_actions,
            read_coordinates(self.location.filesystem(), self.location.path),
        )
        self._dead: DeltaUpkeep | None = None
        if record_format is not None and record_format.typed:
            dead = TableLocation(self.location.join(DEAD_LETTER_DIR), self.location.options)
            self._dead = DeltaUpkeep(
                dead, pipeline, compact, log_settings, vacuum_retention_hours, dead_letters=True
            )

    def dead_letter_upkeep(self) -> DeltaUpkeep | None:
        """The dead-letter table's upkeep, once that table exists (None before)."""
        dead = self._dead
        if dead is None or not DeltaTable.is_deltatable(
            dead.location.uri, storage_options=dead._options
        ):
            return None
        return dead

    def _table(self) -> DeltaTable:
        return DeltaTable(self.location.uri, storage_options=self._options)

    def configure_table(self) -> dict[str, str]:
        """Write the log settings (and the sink's vacuum retention as the tombstone
        retention) into the table's properties, where they differ (one metadata commit, at
        start-up only). Returns what was changed."""
        wanted = {
            CHECKPOINT_INTERVAL: str(self.log_settings.checkpoint_interval),
            LOG_RETENTION: log_retention_value(self.log_settings.log_retention_hours),
            # a checkpoint keeps a remove action per compacted-away file this long (Delta's
            # default: a week); vacuum deletes the files after vacuum_retention_hours, so
            # tombstones kept longer only make every checkpoint - and recovery - bigger
            TOMBSTONE_RETENTION: log_retention_value(self.vacuum_retention_hours),
        }
        # read from the log: at start-up, a snapshot load only when something must change
        state = self._committer.log.state()
        current = (state.metadata.get("configuration") or {}) if state is not None else {}
        changed = {k: v for k, v in wanted.items() if current.get(k) != v}
        if changed:
            self._table().alter.set_table_properties(
                changed, raise_if_not_exists=False, post_commithook_properties=NO_LOG_CLEANUP
            )
        return changed

    def compact(self) -> dict[str, Any]:
        """Bin-pack (or Z-order) the table's small files; on a lost race try again on a
        fresh snapshot, ``retries`` times. Returns delta-rs's metrics (``numFilesRemoved``
        0: nothing to do). Raises ``CommitFailedError`` once it gives up. The dead-letter
        table's outcome is under ``dead_letters`` (its failure does not undo the main
        table's compaction)."""
        metrics = self._compact_with_retries()
        metrics["races"] = self.races.check(self._table())
        dead = self.dead_letter_upkeep()
        if dead is not None:
            try:
                metrics["dead_letters"] = dead.compact()
            except CommitFailedError as exc:
                metrics["dead_letters"] = {"error": str(exc)}
        return metrics

    def _compact_with_retries(self) -> dict[str, Any]:
        settings = self.compact_settings
        attempts = settings.retries + 1
        for attempt in range(1, attempts + 1):
            dt = self._table()
            try:
                return self._compact_once(dt)
            except CommitFailedError as exc:
                if attempt == attempts:
                    raise
                log.info("compaction lost a race (attempt %d/%d): %s", attempt, attempts, exc)
        raise AssertionError("unreachable")

    def _compact_once(self, dt: DeltaTable) -> dict[str, Any]:
        settings = self.compact_settings
        target = settings.target_file_mb * 1024 * 1024
        if settings.zorder_by:
            return dt.optimize.z_order(
                list(settings.zorder_by),
                target_size=target,
                max_concurrent_tasks=settings.max_concurrent_tasks,
                post_commithook_properties=NO_LOG_CLEANUP,
            )
        return dt.optimize.compact(
            target_size=target,
            max_concurrent_tasks=settings.max_concurrent_tasks,
            post_commithook_properties=NO_LOG_CLEANUP,
        )

    def tidy(self, vacuum: bool = True) -> dict[str, Any]:
        """Checkpoint if the last one is more than two intervals old (delta-rs writes them
        after commits; one lost to a crash is made up here), delete expired log entries,
        vacuum. Returns what it did."""
        dt = self._table()
        version = dt.version()
        last = self.last_checkpoint()
        checkpointed = False
        if version - (last if last is not None else -1) > 2 * self.log_settings.checkpoint_interval:
            dt.create_checkpoint()
            checkpointed = True
        races = self.races.check(dt)  # before cleanup: it reads the log entries
        log_before = len(self._committer.log.names())
        dt.cleanup_metadata()
        log_after = len(self._committer.log.names())
        started = time.monotonic()
        removed = self._committer.vacuum(self.vacuum_retention_hours) if vacuum else []
        done: dict[str, Any] = {
            "version": version,
            "checkpoint_created": checkpointed,
            "log_entries_removed": log_before - log_after,
            "files_vacuumed": len(removed),
            "vacuum_s": round(time.monotonic() - started, 3),
            "races": races,
        }
        dead = self.dead_letter_upkeep()
        if dead is not None:  # made after start-up: its properties are set here
            dead.configure_table()
            # the main committer's vacuum has done the dead-letter table's already
            done["dead_letters"] = dead.tidy(vacuum=False)
        return done

    def last_checkpoint(self) -> int | None:
        """The version of the newest checkpoint in the log (None: none yet)."""
        return max(self._committer.log.checkpoint_versions(), default=None)
