"""Commit staged Parquet files and Kafka offsets to a Delta table in ONE version (delta-rs).

The table is the only source of truth for committed offsets (docs/design.md, I2): each
topic-partition has a Delta ``txn`` action, app id ``"<pipeline>/<cluster>/<topic>/<part>"``,
version = the next offset to read. A commit adds the round's files and sets those versions
atomically.

Fencing (I3). delta-rs rejects a concurrent commit only when both carry a ``txn`` with the
same app id; it does not stop a txn version going backwards, and it silently rebases
commits with disjoint app ids. So:

- ``commit`` compares the table's current versions with the ones the round started from
  (``expected``) before writing - compare-and-set; a race inside that window is caught by
  delta-rs because the competing commit carries the same app ids.
- On an object store nothing of this needs a rename: ``TableLocation`` turns on S3's
  conditional put (``conditional_put=etag``), so of two commits of the same version exactly
  one creates the log entry and the other gets ``CommitFailedError``.
- The coordinator epoch lives in its own txn, ``"<pipeline>/_coordinator"``. ``claim_epoch``
  bumps it; every epoch-fenced ``commit`` re-asserts it (same value) in its own txn list, so a
  claim that races a commit conflicts instead of being rebased around it.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, Transaction

from rayconnect.formats import evolution, partitioning
from rayconnect.formats.rows import DEAD_LETTER_SCHEMA, initial_schema, partition_specs
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat, is_dead_letter_file
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.files import (
    STAGING_DIR,
    delta_stats_json,
    normalize_type,
    schema_differences,
)
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables import dead_letters
from rayconnect.tables.base import (
    COORDINATOR_KEY,
    CommitConflictError,
    OffsetMismatchError,
    SchemaMismatchError,
    TableBrokenError,
    check_epoch,
    check_offsets,
)
from rayconnect.tables.delta_log import NO_LOG_CLEANUP, DeltaLog, LogState
from rayconnect.tables.delta_txns import TxnVersions

#: delta-rs refuses a vacuum retention below this (table default) unless told not to check.
DEFAULT_MIN_RETENTION_HOURS = 168
_COMMIT_ID = "rayconnect.commitId"
#: a round's commit that another writer's DELETE/UPDATE made conflict is tried this often
COMMIT_ATTEMPTS = 3


class DeltaCommitter:
    """Commits rounds of one pipeline to one Delta table; reads back its committed offsets.

    Not thread-safe; one per coordinator. The table is a local path or an object-store URI
    (``TableLocation``); every read - log, footers - goes through its filesystem, so the
    committer need not share a disk with the writer's Spark executors. Credentials missing
    from the storage options are taken from this process's environment, once, here.
    """

    def __init__(
        self,
        table: str | TableLocation,
        pipeline: str,
        schema: pa.Schema = RAW_RECORD_SCHEMA,
        record_format: RecordFormat | None = None,
        dead_letters: bool = False,
    ) -> None:
        self.location = as_location(table)
        self.table_path = self.location.uri
        self.pipeline = pipeline
        #: typed: the table's schema may grow (``formats.evolution``), never shrink
        self.typed = record_format is not None and record_format.typed
        self.schema = initial_schema(record_format) if self.typed else schema  # type: ignore[arg-type]
        self.partition_by = (
            [p.name for p in partition_specs(record_format)] if self.typed else []  # type: ignore[arg-type]
        )
        self._dead: DeltaCommitter | None = None
        if self.typed and not dead_letters:
            # Bad records (errors: dead_letter) go to a Delta table of their own inside this
            # one's folder; it carries the same txn app ids (see ``_commit_dead_letters``).
            dl = TableLocation(self.location.join(DEAD_LETTER_DIR), self.location.options)
            self._dead = DeltaCommitter(dl, pipeline, DEAD_LETTER_SCHEMA, dead_letters=True)
        self._options = self.location.delta_options()
        self._fs: Any = None
        self._dt: DeltaTable | None = None
        self._ensured = False
        self.log = DeltaLog(self.location, lambda: self.filesystem)
        self._schema_state: LogState | None = None  # current_schema's, followed per call
        #: the partitions' committed offsets, followed through the log (compare-and-set)
        self._txns = TxnVersions(self.log)

    @property
    def filesystem(self) -> Any:
        """The table's pyarrow filesystem (made on first use)."""
        if self._fs is None:
            self._fs = self.location.filesystem()
        return self._fs

    # -- table ----------------------------------------------------------------------------

    def app_id(self, key: str) -> str:
        """Delta txn app id of a partition key (or of ``COORDINATOR_KEY``)."""
        return f"{self.pipeline}/{key}"

    def ensure_table(self) -> None:
        """Create the table (all columns nullable) if missing; else check its schema (a
        typed table's may have grown: it must only not contradict the declared columns).
        Checked from the log's metadata: the snapshot (every live file) is loaded only by
        the first commit. The dead-letter table is made on first use, inside the table's
        folder."""
        state = self.log.state()
        if state is None:
            nullable = pa.schema([f.with_nullable(True) for f in self.schema])
            # "ignore": another coordinator creating it at the same time is fine.
            DeltaTable.create(
                self.table_path,
                nullable,
                mode="ignore",
                partition_by=self.partition_by or None,
                storage_options=self._options,
            )
            state = self.log.state()
            assert state is not None
        self._txns.seed(state)  # the epoch claim follows on from this read
        other = f"existing table {self.table_path} has another schema"
        self._check_schema(self._normalized(state.arrow_schema()), SchemaMismatchError, other)
        if self.typed and state.partition_columns != self.partition_by:
            raise SchemaMismatchError(
                f"{other}: partitioned by {state.partition_columns}, not {self.partition_by}"
            )
        self._ensured = True

    def _check_schema(self, table_schema: pa.Schema, error: type[Exception], what: str) -> None:
        """The table's schema must be ours (a typed table's may have grown: evolution)."""
        if self.typed:
            _, problems = evolution.merge(table_schema, self.schema)
        else:
            problems = schema_differences(table_schema, self.schema)
        if problems:
            raise error(f"{what}: {'; '.join(problems)}")

    def _table(self) -> DeltaTable:
        """The table at its latest version (the object never sees commits by itself).

        Raises ``TableBrokenError`` if the table was dropped or its schema changed under
        a running pipeline (another writer did it): committing on would write into a table
        that is not the one the offsets came from, or files its readers cannot read."""
        if self._dt is None:
            if not self._ensured:
                self.ensure_table()
            self._dt = DeltaTable(self.table_path, storage_options=self._options)
        else:
            self._dt.update_incremental()
        self._check_still_ours(self._dt)
        return self._dt

    def _check_still_ours(self, dt: DeltaTable) -> None:
        """The latest commit this object knows is still in the log (a dropped table keeps
        no log: delta-rs would go on from its cached snapshot), and the schema is ours.
        One HEAD request per call."""
        from pyarrow import fs

        latest = self.log.path(f"{dt.version():020d}.json")
        if self.filesystem.get_file_info(latest).type == fs.FileType.NotFound:
            raise TableBrokenError(
                f"table {self.table_path} is gone: its log has no version {dt.version()} "
                "any more (dropped or replaced by another writer)"
            )
        self._check_schema(self._table_arrow_schema(dt), TableBrokenError, self._changed)

    @property
    def _changed(self) -> str:
        return f"table {self.table_path} changed its schema under the pipeline"

    @staticmethod
    def _normalized(schema: pa.Schema) -> pa.Schema:
        return pa.schema([pa.field(f.name, normalize_type(f.type)) for f in schema])

    @classmethod
    def _table_arrow_schema(cls, dt: DeltaTable) -> pa.Schema:
        return cls._normalized(pa.schema(dt.schema().to_arrow()))

    def current_schema(self) -> pa.Schema:
        """The schema rows are decoded against: the table's now (a typed table's grows; a
        value contradicting a column is a bad record), its first one while it does not
        exist yet. A fresh read (the writer's view must not lag behind the committer's),
        following the log from the last call's version: the commits since, not the
        checkpoint and every commit after it."""
        state = self._schema_state = self.log.follow(self._schema_state)
        return self.schema if state is None else self._normalized(state.arrow_schema())

    def version(self) -> int:
        """Latest table version."""
        return self._table().version()

    # -- offsets --------------------------------------------------------------------------

    def committed_offsets(self, keys: Iterable[str] | None = None) -> dict[str, int]:
        """Partition key -> committed next offset; partitions never committed are absent.

        ``keys=None`` lists every partition this pipeline ever committed. Read from the log
        (``DeltaLog``: last checkpoint's txn column + later commits), never from a loaded
        snapshot, so a restarted coordinator's reading does not grow with the file count.
        ``_coordinator`` is never included.
        """
        txns = self._log_state().txns
        if keys is None:
            prefix = f"{self.pipeline}/"
            keys = sorted(
                app[len(prefix) :]
                for app in txns
                if app.startswith(prefix) and app != self.app_id(COORDINATOR_KEY)
            )
        return {key: txns[self.app_id(key)] for key in keys if self.app_id(key) in txns}

    def epoch(self) -> int:
        """The current coordinator epoch (0 = never claimed)."""
        return self._log_state().txns.get(self.app_id(COORDINATOR_KEY), 0)

    def _log_state(self) -> LogState:
        """The table's txn versions and metadata now, from the log; ``TableBrokenError`` if
        it was dropped or its schema changed under the pipeline (``_table``'s checks)."""
        if not self._ensured:
            self.ensure_table()
        for attempt in (1, 2):
            try:
                state = self.log.state()
                break
            except FileNotFoundError:  # log cleanup ran between the listing and the read
                if attempt == 2:
                    raise
        known = self._dt.version() if self._dt is not None else -1
        if state is None or state.version < known:
            raise TableBrokenError(
                f"table {self.table_path} is gone: its log ends before version {known} "
                "(dropped or replaced by another writer)"
            )
        self._check_schema(self._normalized(state.arrow_schema()), TableBrokenError, self._changed)
        self._txns.seed(state)
        return state

    # -- commit ---------------------------------------------------------------------------

    def commit(
        self,
        files: Sequence[DataFile],
        offsets: Mapping[str, int],
        expected: Mapping[str, int | None],
        metadata: Mapping[str, str] | None = None,
        epoch: int | None = None,
    ) -> int:
        """Commit ``files`` and set each partition's offset, in ONE table version.

        ``expected[key]`` is the offset the round started from (None = never committed).
        Raises ``OffsetMismatchError`` (or ``StaleEpochError`` if ``epoch`` is given and a
        newer one was claimed) if the table moved on, ``SchemaMismatchError`` if a file has
        another schema, ``CommitConflictError`` if a concurrent commit won the race; in every
        case nothing is committed. Returns the new table version.
        """
        dt = self._table()
        self._check_fence(dt, offsets, expected, epoch)
        dead = [f for f in files if is_dead_letter_file(f)]
        files = [f for f in files if not is_dead_letter_file(f)]
        if self.typed:
            self._evolve(dt, files)
        txns = [Transaction(self.app_id(k), v) for k, v in sorted(offsets.items())]
        if epoch is not None:
            # Re-asserting the epoch makes a racing claim_epoch conflict with this commit.
            txns.append(Transaction(self.app_id(COORDINATOR_KEY), epoch))
        table_schema = self._table_arrow_schema(dt)
        adds = [self._add_action(f, table_schema) for f in files]
        if dead:
            if self._dead is None:
                raise SchemaMismatchError(f"dead-letter files for a raw table: {dead[0].path}")
            self._commit_dead_letters(dead, offsets)
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return self._write(dt, dt.version(), adds, txns, dict(metadata or {}))
            except CommitConflictError as conflict:
                # delta-rs also fails a blind append when another writer's DELETE, UPDATE or
                # MERGE (dataChange=true removes) landed since our read. If the table still
                # has our epoch and offsets, no rival of ours won: the same commit is as
                # right on the new snapshot (nothing landed; compare-and-set again).
                if attempt == COMMIT_ATTEMPTS:
                    raise
                dt = self._table()
                try:
                    self._check_fence(dt, offsets, expected, epoch)
                except OffsetMismatchError:
                    raise conflict from None
        raise AssertionError("unreachable")

    def _check_fence(
        self,
        dt: DeltaTable,
        offsets: Mapping[str, int],
        expected: Mapping[str, int | None],
        epoch: int | None,
    ) -> None:
        """Compare-and-set's compare: the epoch (if fenced), then every partition's offset."""
        apps = {k: self.app_id(k) for k in offsets}
        coordinator = self.app_id(COORDINATOR_KEY)
        versions = self._txns.of(dt.version(), [coordinator, *apps.values()])
        if epoch is not None:
            check_epoch(epoch, versions[coordinator] or 0)
        check_offsets(offsets, expected, {k: versions[app] for k, app in apps.items()})

    def _evolve(self, dt: DeltaTable, files: Sequence[DataFile]) -> None:
        """Add the columns the round's files bring (nullable) before the round's commit.

        delta-rs 1.6.6 cannot put a metaData action into ``create_write_transaction``'s
        commit (delta-rs issue #3934), so new columns are one schema-only version right
        before the data's. Crash in between: the table has a column nobody wrote yet (null
        in every row), the round is retried and commits into it - nothing is lost or
        doubled. A conflicting file raises ``SchemaMismatchError`` (nothing committed).
        """
        table_schema = self._table_arrow_schema(dt)
        merged = table_schema
        for f in files:
            footer = pq.read_schema(self.location.path(f.path), filesystem=self.filesystem)
            merged, conflicts = evolution.merge(merged, footer)
            if conflicts:
                raise SchemaMismatchError(f"{f.path}: {'; '.join(conflicts)}")
        new = [f for f in merged if f.name not in table_schema.names]
        if new:
            from deltalake.schema import Schema as DeltaSchema

            fields = DeltaSchema.from_arrow(pa.schema(new)).fields
            dt.alter.add_columns(fields, post_commithook_properties=NO_LOG_CLEANUP)
            dt.update_incremental()

    def _commit_dead_letters(self, dead: Sequence[DataFile], offsets: Mapping[str, int]) -> None:
        """Commit the round's dead letters to the dead-letter table, BEFORE the main commit
        (``tables.dead_letters``: why that is exactly once). The dead-letter table carries
        the same txn app ids, each at ``max(its version, the round's next offset)``."""
        assert self._dead is not None
        ddt = self._dead._table()
        read_version = ddt.version()
        apps = self._dead._txns.of(read_version, [self._dead.app_id(k) for k in offsets])
        done = {k: apps[self._dead.app_id(k)] or 0 for k in offsets}
        keep = dead_letters.unseen(dead, done, self.location, self._dead.location, self.filesystem)
        txns = [
            Transaction(self._dead.app_id(k), v)
            for k, v in dead_letters.next_offsets(done, offsets).items()
        ]
        dead_schema = self._dead._table_arrow_schema(ddt)
        adds = [self._dead._add_action(f, dead_schema) for f in keep]
        self._dead._write(ddt, read_version, adds, txns, {"rayconnect.deadLetters": "1"})

    def dead_letter_counts(self) -> dict[str, int]:
        """Partition key -> rows in the dead-letter table ({} if it was never made), from
        the log's file stats alone (a file holds one partition's bad records)."""
        if self._dead is None or not DeltaTable.is_deltatable(
            self._dead.table_path, storage_options=self._dead._options
        ):
            return {}
        adds = pa.table(self._dead._table().get_add_actions(flatten=True)).to_pylist()
        counts: dict[str, int] = {}
        for add in adds:
            parts = [add.get(f"min._kafka_{c}") for c in ("cluster", "topic", "partition")]
            key = "?" if None in parts else "/".join(str(p) for p in parts)
            counts[key] = counts.get(key, 0) + int(add["num_records"] or 0)
        return counts

    def claim_epoch(self) -> int:
        """Become the coordinator: bump ``<pipeline>/_coordinator`` and return the new epoch.

        From then on, commits with an older epoch fail. Two concurrent claims: one wins, the
        other raises ``CommitConflictError``.
        """
        dt = self._table()
        read_version = dt.version()
        coordinator = self.app_id(COORDINATOR_KEY)
        new_epoch = (self._txns.of(read_version, [coordinator])[coordinator] or 0) + 1
        txns = [Transaction(self.app_id(COORDINATOR_KEY), new_epoch)]
        self._write(dt, read_version, [], txns, {"rayconnect.epoch": str(new_epoch)})
        return new_epoch

    def _add_action(self, data_file: DataFile, table_schema: pa.Schema) -> AddAction:
        """Check the file's footer against the table (delta-rs would not) and describe it."""
        full = self.location.path(data_file.path)
        try:
            file_schema = pq.read_schema(full, filesystem=self.filesystem)
        except (OSError, pa.ArrowInvalid) as exc:
            raise SchemaMismatchError(
                f"{data_file.path}: not a readable Parquet file ({exc})"
            ) from exc
        if self.typed:  # a file may lack newer columns (null) or hold a narrower int/float
            _, problems = evolution.merge(table_schema, file_schema)
            extra = [n for n in file_schema.names if n not in table_schema.names]
            problems += [f"column {n!r} is not in the table" for n in extra]
        else:
            problems = schema_differences(file_schema, table_schema)
        if problems:
            raise SchemaMismatchError(
                f"{data_file.path} does not match the table schema: {'; '.join(problems)}"
            )
        return AddAction(
            path=data_file.path,
            size=data_file.size,
            partition_values=partitioning.values_of(data_file.path),
            modification_time=data_file.modification_time_ms,
            data_change=True,
            stats=delta_stats_json(data_file),
        )

    def _write(
        self,
        dt: DeltaTable,
        read_version: int,
        adds: list[AddAction],
        txns: list[Transaction],
        metadata: dict[str, str],
    ) -> int:
        commit_id = uuid.uuid4().hex
        metadata[_COMMIT_ID] = commit_id
        try:
            dt.create_write_transaction(
                adds,
                "append",
                self._table_arrow_schema(dt),
                commit_properties=CommitProperties(app_transactions=txns, custom_metadata=metadata),
                post_commithook_properties=NO_LOG_CLEANUP,
            )
        except CommitFailedError as exc:
            raise CommitConflictError(
                f"a concurrent commit to {self.table_path} conflicted (this commit's app ids: "
                f"{[t.app_id for t in txns]}); nothing committed: {exc}"
            ) from exc
        dt.update_incremental()
        return self._find_commit(commit_id, read_version, dt.version())

    def _find_commit(self, commit_id: str, after: int, latest: int) -> int:
        """The version our commit got (a concurrent, rebased-over commit may be later)."""
        for version in range(after + 1, latest + 1):
            actions = self.log.commit_actions(version)
            self._txns.advance(version, actions)  # the next compare need not read it again
            for action in actions:
                if action.get("commitInfo", {}).get(_COMMIT_ID) == commit_id:
                    return version
        return latest  # log cleaned up in between: only a concurrent writer could do that

    # -- maintenance ----------------------------------------------------------------------

    def vacuum(self, retention_hours: float, dry_run: bool = False) -> list[str]:
        """Delete files not in the table (aborted rounds' staging files) older than retention.

        ``retention_hours`` must exceed the longest open round, or a file being written for
        the current round could be deleted before it is committed. Runs delta-rs's *full*
        vacuum: the default mode only removes files the log marks as removed, never files
        the log has not seen. Returns the relative paths removed.
        """
        dt = self._table()
        # delta-rs takes whole hours; round UP so a file is never removed earlier than asked.
        hours = math.ceil(retention_hours)
        removed = dt.vacuum(
            retention_hours=hours,
            dry_run=dry_run,
            # delta-rs refuses a retention below the table's default (a week) unless told
            # not to check; rounds last seconds, so short retentions are the normal case.
            enforce_retention_duration=hours >= DEFAULT_MIN_RETENTION_HOURS,
            full=True,
        )
        if not dry_run and self.location.is_local:  # object stores have no folders to drop
            _remove_empty_dirs(os.path.join(self.table_path, STAGING_DIR))
        if self._dead is not None and DeltaTable.is_deltatable(
            self._dead.table_path, storage_options=self._dead._options
        ):
            # The main table's vacuum skips the dead-letter folder (its leading "_"): the
            # dead-letter files of aborted rounds go with the dead-letter table's own.
            dead = self._dead.vacuum(retention_hours, dry_run)
            removed = [*removed, *(f"{DEAD_LETTER_DIR}/{path}" for path in dead)]
        return removed


def _remove_empty_dirs(root: str) -> None:
    """Drop the staging folders vacuum emptied (it deletes files, never folders)."""
    if not os.path.isdir(root):
        return
    for dirpath, _dirnames, _filenames in os.walk(root, topdown=False):
        if dirpath != root:
            with contextlib.suppress(OSError):  # only succeeds when empty
                os.rmdir(dirpath)


def current_schema(table: TableLocation, record_format: RecordFormat) -> pa.Schema:
    """A typed table's schema now (its initial one if it does not exist yet)."""
    return DeltaCommitter(table, "", record_format=record_format).current_schema()
