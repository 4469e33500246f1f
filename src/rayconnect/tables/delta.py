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
import dataclasses
import math
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, assert_never

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, Transaction

from rayconnect.formats import evolution, partitioning
from rayconnect.formats.evolution import normalize_type, schema_differences
from rayconnect.formats.rows import (
    DEAD_LETTER_SCHEMA,
    conform_to_table,
    initial_schema,
    partition_specs,
)
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat, typed_format
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables import delta_row_delta
from rayconnect.tables.base import (
    COORDINATOR_KEY,
    EMPTY_SCHEMA,
    CommitConflictError,
    SchemaMismatchError,
    TableBrokenError,
    TableCommitter,
    VersionWrite,
    new_columns,
)
from rayconnect.tables.consistent_cut import CUT_LOOKBACK, recorded_cut
from rayconnect.tables.delta_log import NO_LOG_CLEANUP, DeltaLog, LogState
from rayconnect.tables.delta_metrics import OPERATION_METRICS, operation_metrics
from rayconnect.tables.delta_txns import TxnVersions
from rayconnect.tables.files import STAGING_DIR, delta_stats_json
from rayconnect.write_modes.changes import Appended, RowDelta, Upserted
from rayconnect.write_modes.delta_merge import merge_round
from rayconnect.write_modes.modes import APPEND, MergeOnRead, WriteMode
from rayconnect.write_modes.row_delta import ColumnReader, LiveFile

#: delta-rs refuses a vacuum retention below this (table default) unless told not to check.
DEFAULT_MIN_RETENTION_HOURS = 168
_COMMIT_ID = "rayconnect.commitId"


class DeltaCommitter(TableCommitter):
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
        apply: WriteMode = APPEND,
    ) -> None:
        self.location = as_location(table)
        self.table_path = self.location.uri
        self.pipeline = pipeline
        #: typed: the table's schema may grow (``formats.evolution``), never shrink
        typed = typed_format(record_format)
        self.typed = typed is not None
        self.schema = initial_schema(typed) if typed is not None else schema
        self.partition_by = [p.name for p in partition_specs(typed)] if typed is not None else []
        self.apply = apply
        self._dead: DeltaCommitter | None = None
        if self.typed and not dead_letters:
            # Bad records (errors: dead_letter) go to a Delta table of their own inside this
            # one's folder; it carries the same txn app ids (``tables.dead_letters``).
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

    #: a round's commit that another writer's DELETE/UPDATE made conflict is tried this often
    commit_attempts = 3
    #: delta-rs would commit a file with a column the table lacks; readers then miss it
    rejects_unknown_columns = True

    @property
    def filesystem(self) -> Any:
        """The table's pyarrow filesystem (made on first use)."""
        if self._fs is None:
            self._fs = self.location.filesystem()
        return self._fs

    @property
    def dead_letter_table(self) -> DeltaCommitter | None:
        return self._dead

    def exists(self) -> bool:
        return bool(DeltaTable.is_deltatable(self.table_path, storage_options=self._options))

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
        if isinstance(self.apply, MergeOnRead):
            dt = DeltaTable(self.table_path, storage_options=self._options)
            if not delta_row_delta.has_deletion_vectors(dt):
                delta_row_delta.enable_deletion_vectors(dt)
        self._ensured = True

    def adopt_new(
        self, epoch: int, offsets: Mapping[str, int], files: Sequence[DataFile]
    ) -> int | None:
        """The table created with the epoch and offsets as txns of its CREATE (delta-rs
        writes a create's ``app_transactions``), its schema grown by the files' columns -
        the checks of ``adopt_epoch`` hold by construction on a table that did not exist.
        ``mode="ignore"``: a rival that made it first wins, and our version is not in the
        log (its commit id says so): None, and the caller adopts as usual."""
        if self.log.state() is not None:
            return None
        schema = self.schema
        rows = [f for f in files if not f.dead_letters]
        if self.typed and rows:
            schema = pa.schema(
                [*schema, *new_columns(schema, {f.path: self._footer(f) for f in rows})]
            )
        txns = [Transaction(self.app_id(k), v) for k, v in sorted(offsets.items())]
        txns.append(Transaction(self.app_id(COORDINATOR_KEY), epoch))
        commit_id = uuid.uuid4().hex
        metadata = {
            "rayconnect.epoch": str(epoch),
            "rayconnect.adopted": "true",
            _COMMIT_ID: commit_id,
        }
        DeltaTable.create(
            self.table_path,
            pa.schema([f.with_nullable(True) for f in schema]),
            mode="ignore",
            partition_by=self.partition_by or None,
            storage_options=self._options,
            commit_properties=CommitProperties(app_transactions=txns, custom_metadata=metadata),
        )
        self.ensure_table()  # the table's checks, on whoever's table it is
        ours = any(
            a.get("commitInfo", {}).get(_COMMIT_ID) == commit_id for a in self.log.commit_actions(0)
        )
        return 0 if ours else None

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

    def committed_cut(self) -> int | None:
        """The newest cut this pipeline recorded (``rayconnect.cut_lsn`` in a version's
        commit info), among the latest ``CUT_LOOKBACK`` versions: the commits after the
        last checkpoint, then older ones newest first (``DeltaLog.newest_commit_info``)."""
        if not self._ensured:
            self.ensure_table()
        info = self.log.newest_commit_info(
            lambda i: recorded_cut(i, self.pipeline) is not None, CUT_LOOKBACK
        )
        return recorded_cut(info, self.pipeline)

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

    # -- the round commit's hooks (the algorithm: ``TableCommitter.commit``) ------------

    def _snapshot(self) -> DeltaTable:
        return self._table()

    def _fence_state(
        self, read: DeltaTable, keys: Sequence[str]
    ) -> tuple[int, dict[str, int | None]]:
        apps = {k: self.app_id(k) for k in keys}
        coordinator = self.app_id(COORDINATOR_KEY)
        versions = self._txns.of(read.version(), [coordinator, *apps.values()])
        return versions[coordinator] or 0, {k: versions[app] for k, app in apps.items()}

    def _schema_at(self, read: DeltaTable) -> pa.Schema:
        return self._table_arrow_schema(read)

    def _add_columns(self, read: DeltaTable, columns: pa.Schema) -> tuple[DeltaTable, pa.Schema]:
        """delta-rs 1.6.6 cannot put a metaData action into ``create_write_transaction``'s
        commit (delta-rs issue #3934), so new columns are one schema-only version right
        before the data's. Crash in between: the table has a column nobody wrote yet (null
        in every row), the round is retried and commits into it - nothing is lost or
        doubled."""
        from deltalake.schema import Schema as DeltaSchema

        fields = DeltaSchema.from_arrow(columns).fields
        read.alter.add_columns(fields, post_commithook_properties=NO_LOG_CLEANUP)
        read.update_incremental()
        return read, EMPTY_SCHEMA

    def file_entry(self, data_file: DataFile) -> AddAction:
        return AddAction(
            path=data_file.path,
            size=data_file.size,
            partition_values=partitioning.values_of(data_file.path),
            modification_time=data_file.modification_time_ms,
            data_change=True,
            stats=delta_stats_json(data_file),
        )

    def live_files(self, read: DeltaTable) -> list[LiveFile]:
        return delta_row_delta.live_files(read, self.location, self.filesystem)

    @property
    def column_reader(self) -> ColumnReader:
        """(Never through ``_table()``: that would move the read the round commits on.
        Partition columns are typed by the first schema: they never change.)"""
        types = {
            name: self.schema.field(name).type
            for name in self.partition_by
            if self.schema is not None and name in self.schema.names
        }
        return ColumnReader(self.filesystem, types)

    def _write(self, read: DeltaTable, write: VersionWrite) -> int:
        """Every partition's offset is a txn; the epoch is re-asserted (same value) in one
        more, so a racing ``claim_epoch`` conflicts with this commit instead of being
        rebased around it."""
        assert not len(write.pending), "Delta adds columns in a version of their own"
        txns = [Transaction(self.app_id(k), v) for k, v in sorted(write.offsets.items())]
        if write.epoch is not None:
            txns.append(Transaction(self.app_id(COORDINATOR_KEY), write.epoch))
        read_version = read.version()
        commit_id = uuid.uuid4().hex
        metadata: dict[str, Any] = {**write.metadata, _COMMIT_ID: commit_id}
        changes = write.changes
        if isinstance(changes, Appended) and changes.adds:  # a MERGE writes its own
            metadata[OPERATION_METRICS] = operation_metrics(changes.adds)
        commit = CommitProperties(app_transactions=txns, custom_metadata=metadata)
        try:
            match changes:
                case Upserted():
                    self._merge(read, changes, commit)
                case RowDelta():
                    delta_row_delta.commit_row_delta(
                        read,
                        self.location,
                        self.filesystem,
                        changes,
                        [(t.app_id, t.version) for t in txns],
                        metadata,
                        self.partition_by,
                        self._table_arrow_schema(read),
                    )
                case Appended():
                    read.create_write_transaction(
                        list(changes.adds),
                        "append",
                        self._table_arrow_schema(read),
                        commit_properties=commit,
                        post_commithook_properties=NO_LOG_CLEANUP,
                    )
                case _:  # a new write mode's variant: mypy says it is not handled here
                    assert_never(changes)
        except CommitFailedError as exc:
            raise CommitConflictError(
                f"a concurrent commit to {self.table_path} conflicted (this commit's app ids: "
                f"{[t.app_id for t in txns]}); nothing committed: {exc}"
            ) from exc
        read.update_incremental()
        return self._find_commit(commit_id, read_version, read.version())

    def _merge(self, read: DeltaTable, upsert: Upserted, commit: CommitProperties) -> None:
        """An upsert round as one MERGE (``write_modes.delta_merge``), its rows in the
        table's columns (a column the round's rows lack is null: a row is its record)."""
        schema = self._table_arrow_schema(read)
        rows = conform_to_table(upsert.folded.rows, schema).select(schema.names)
        folded = dataclasses.replace(upsert.folded, rows=rows)
        merge_round(read, folded, upsert.key_columns, commit, NO_LOG_CLEANUP)

    def _after_commit(self) -> None:
        """None: a Delta table's upkeep is ``DeltaUpkeep``'s, on its own schedule."""

    def partition_counts(self) -> dict[str, int]:
        """From the log's file stats alone (a dead-letter file holds one partition's bad
        records)."""
        adds = pa.table(self._table().get_add_actions(flatten=True)).to_pylist()
        counts: dict[str, int] = {}
        for add in adds:
            parts = [add.get(f"min._kafka_{c}") for c in ("cluster", "topic", "partition")]
            key = "?" if None in parts else "/".join(str(p) for p in parts)
            counts[key] = counts.get(key, 0) + int(add["num_records"] or 0)
        return counts

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

    def _vacuum_files(self, retention_hours: float, dry_run: bool) -> list[str]:
        """delta-rs's *full* vacuum: the default mode only removes files the log marks as
        removed, never files the log has not seen (an aborted round's). It skips the
        dead-letter folder (its leading "_"): that table's files go with its own vacuum."""
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
        # deletion vectors live where delta-rs's vacuum never looks (``delta_row_delta``)
        dt.update_incremental()
        unused = delta_row_delta.vacuum_dv_files(
            dt, self.location, self.filesystem, retention_hours, dry_run
        )
        return [*removed, *unused]


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
