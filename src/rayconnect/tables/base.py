"""What the coordinator needs from a table, whatever its format (Delta, Iceberg).

The table is the only source of truth for committed offsets (docs/design.md, I2), and only the
coordinator of the newest epoch may commit (I3). Each format keeps both in its own way (Delta
``txn`` actions, Iceberg snapshot summaries and table properties); the coordinator sees only
this interface (``TableCommitter``, ``TableUpkeep``) and these errors, so a new format is
one module of hooks and one factory entry. The round-commit algorithm itself is here, once
(``TableCommitter.commit``); how a round's files change the table is a write mode
(``write_modes.modes``), its result one variant of ``write_modes.changes.RoundChanges``,
so a new mode is one variant and one case per format.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.formats import evolution
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.protocol.effects import CommitTable
from rayconnect.protocol.status import TableStatus
from rayconnect.protocol.types import DataFile
from rayconnect.storage.location import TableLocation
from rayconnect.tables import dead_letters
from rayconnect.tables.round_committer import RoundLanded
from rayconnect.write_modes.changes import NOTHING, RoundChanges
from rayconnect.write_modes.fold import is_change_column
from rayconnect.write_modes.modes import WriteMode
from rayconnect.write_modes.row_delta import ColumnReader, LiveFile

log = logging.getLogger(__name__)

#: The key of the coordinator epoch beside the partition keys (never a partition).
COORDINATOR_KEY = "_coordinator"
EMPTY_SCHEMA = pa.schema([])


class OffsetMismatchError(RuntimeError):
    """The table's offsets are not the ones this round started from: nothing committed."""

    def __init__(self, mismatches: Mapping[str, tuple[int | None, int | None]]) -> None:
        self.mismatches = dict(mismatches)
        detail = ", ".join(
            f"{key}: expected {exp}, table has {cur}"
            for key, (exp, cur) in sorted(self.mismatches.items())
        )
        super().__init__(f"committed offsets changed since the round started ({detail})")


class StaleEpochError(OffsetMismatchError):
    """A newer coordinator epoch was claimed: this coordinator must never commit again."""


class SchemaMismatchError(ValueError):
    """A file (or the existing table) does not have the table's schema."""


class CommitConflictError(RuntimeError):
    """A concurrent commit touched the same partitions or epoch: this commit did not happen."""


class TableBrokenError(RuntimeError):
    """Someone changed the table so that the pipeline's assumptions no longer hold (the
    table was dropped, its schema changed, its offsets moved backwards): writing on could
    lose or duplicate records, so the pipeline stops with this reason."""


def check_not_behind(
    known: Mapping[str, int],
    current: Mapping[str, int | None],
    resetting: Collection[str] = (),
) -> None:
    """After a reload: every partition's offset in the table is at least the one the
    coordinator last knew the table to have. The pipeline only ever moves its offsets
    forward - but for a partition starting over (``resetting``: its offset lay outside its
    log, ``protocol.offset_range``) - so an offset that went back (or vanished) was moved by
    hand or the table was replaced; re-reading from there would write records twice.
    Raises ``TableBrokenError``."""
    behind = {
        key: (was, current.get(key))
        for key, was in known.items()
        if ((now := current.get(key)) is None or now < was) and key not in resetting
    }
    if behind:
        detail = ", ".join(
            f"{key}: was {was}, now {now}" for key, (was, now) in sorted(behind.items())
        )
        raise TableBrokenError(
            f"committed offsets moved backwards in the table ({detail}): someone wrote txn "
            "versions by hand or replaced the table; stopping rather than writing records twice"
        )


def check_offsets(
    offsets: Mapping[str, int],
    expected: Mapping[str, int | None],
    current: Mapping[str, int | None],
    resets: Collection[str] = (),
) -> None:
    """Compare-and-set's compare: every partition of the round must still be at the offset
    the round started from (``expected``; None = never committed) in the table (``current``).
    A partition in ``resets`` starts over below its stale offset: it may go down.

    Raises ValueError for a malformed round (a key without expected offset, an offset going
    backwards, the epoch key used as a partition), ``OffsetMismatchError`` if the table moved.
    """
    missing = sorted(set(offsets) - set(expected))
    if missing:
        raise ValueError(f"no expected offset given for {missing}")
    if COORDINATOR_KEY in offsets:
        raise ValueError(f"{COORDINATOR_KEY!r} is not a partition; use epoch=")
    mismatches: dict[str, tuple[int | None, int | None]] = {}
    for key, new in offsets.items():
        start = expected[key]
        if start is not None and new < start and key not in resets:
            raise ValueError(f"{key}: offset would go backwards ({start} -> {new})")
        if current.get(key) != start:
            mismatches[key] = (start, current.get(key))
    if mismatches:
        raise OffsetMismatchError(mismatches)


def check_epoch(epoch: int | None, current: int) -> None:
    """A fenced coordinator must learn that it is fenced (and stop), not that offsets moved
    (and retry): checked before the offsets."""
    if epoch is not None and current != epoch:
        raise StaleEpochError({COORDINATOR_KEY: (epoch, current)})


class VersionWrite(msgspec.Struct, frozen=True):
    """What one table version writes: a round's (or a claim's, with nothing but the epoch)."""

    changes: RoundChanges
    #: partition key -> its next offset, set in the version
    offsets: dict[str, int]
    metadata: dict[str, str]
    #: re-asserted (a round) or set (a claim); None: not fenced (a dead-letter table's)
    epoch: int | None = None
    #: the columns still to add in this version (``_add_columns``)
    pending: pa.Schema = EMPTY_SCHEMA


def new_columns(table_schema: pa.Schema, footers: Mapping[str, pa.Schema]) -> pa.Schema:
    """The columns the round's files (path -> footer schema) bring that the table lacks
    (``formats.evolution``); a file contradicting the table raises ``SchemaMismatchError``
    (nothing committed)."""
    merged = table_schema
    for path, footer in footers.items():
        merged, conflicts = evolution.merge(merged, footer)
        if conflicts:
            raise SchemaMismatchError(f"{path}: {'; '.join(conflicts)}")
    return pa.schema([f for f in merged if f.name not in table_schema.names])


class TableCommitter(abc.ABC):
    """One pipeline's view of one table: its offsets, its epoch, its commits - and THE
    round-commit algorithm, written once for every format (``commit``).

    A round's commit is always these steps, in this order: read the table; compare-and-set's
    compare (the epoch, then every partition's offset, on exactly that read); split off the
    dead letters; find the columns the files bring and check every file against the grown
    schema; commit the dead letters to the dead-letter table (before the round:
    ``tables.dead_letters``); commit the round - the files as the write mode (``apply``)
    makes them changes, every partition's offset, the epoch re-asserted - as ONE version
    built on that read; then the upkeep that rides on commits. A format supplies only the
    hooks (the underscore methods below and ``file_entry``): how it reads, where it keeps
    offsets and epoch, how it adds columns and writes one version.

    Not thread-safe; one per coordinator. Every method may block (table IO): the coordinator
    calls them from a worker thread.
    """

    #: Where the table is, for status and logs.
    table_path: str
    #: Where its files are (they are staged and committed relative to it).
    location: TableLocation
    pipeline: str
    #: typed: the table's schema may grow (``formats.evolution``), never shrink
    typed: bool
    #: the table's first schema (what it is created with)
    schema: pa.Schema
    #: how a round's files change the table (``write_modes.modes``)
    apply: WriteMode
    #: how often a round is tried when its write conflicts although the table still has
    #: its epoch and offsets (another writer's unrelated change landed first)
    commit_attempts: int = 1
    #: whether a file may not hold a column the table lacks (null-typed ones included)
    rejects_unknown_columns: bool = False

    # -- the table's state (per format) -----------------------------------------------------

    @abc.abstractmethod
    def ensure_table(self) -> Any:
        """Create the table (all columns nullable) if missing; else check its schema
        (``SchemaMismatchError``)."""

    @abc.abstractmethod
    def current_schema(self) -> pa.Schema:
        """The table's schema now (its first one if it does not exist yet): what the
        writer decodes typed records against."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the table was made (a dead-letter table is made on first use)."""

    @abc.abstractmethod
    def committed_offsets(self, keys: Iterable[str] | None = None) -> dict[str, int]:
        """Partition key -> next offset to read; partitions never committed are absent.
        ``None``: every partition this pipeline ever committed."""

    @abc.abstractmethod
    def committed_cut(self) -> int | None:
        """Consistent cuts: the newest cut this pipeline recorded in the table (a version's
        ``rayconnect.cut_lsn``, ``protocol.effects.CUT_LSN_KEY``); None: none found. Read
        only when the sink has ``commit.consistent_cuts``."""

    @abc.abstractmethod
    def epoch(self) -> int:
        """The current coordinator epoch (0 = never claimed)."""

    @abc.abstractmethod
    def version(self) -> int:
        """The table's latest version (increases with every commit)."""

    @abc.abstractmethod
    def partition_counts(self) -> dict[str, int]:
        """Partition key -> rows in this table (a dead-letter table's bad records)."""

    @abc.abstractmethod
    def live_files(self, read: Any) -> Sequence[LiveFile]:
        """The data files the table reads at ``read`` (merge-on-read searches them)."""

    @property
    def column_reader(self) -> ColumnReader:
        """Reads some columns of a live file: every row, deleted ones too, in file order
        (picklable: a merge-on-read search reads where it runs)."""
        return ColumnReader(self.filesystem)

    @property
    @abc.abstractmethod
    def filesystem(self) -> Any:
        """The table location's pyarrow filesystem."""

    @property
    @abc.abstractmethod
    def dead_letter_table(self) -> TableCommitter | None:
        """The committer of this table's dead-letter table (None: a raw table, or the
        dead-letter table itself)."""

    # -- the round commit (written once) ----------------------------------------------------

    def commit(
        self,
        files: Sequence[DataFile],
        offsets: Mapping[str, int],
        expected: Mapping[str, int | None],
        metadata: Mapping[str, str] | None = None,
        epoch: int | None = None,
        resets: Collection[str] = (),
    ) -> int:
        """Commit ``files`` and every partition's offset in ONE table version, if the table
        still has ``expected`` (the offsets the round started from; None = never
        committed) and ``epoch``; else raise and commit nothing. ``resets``: partitions
        whose offset goes down (they start over; ``protocol.offset_range``). Raises
        ``OffsetMismatchError`` (``StaleEpochError`` if a newer epoch was claimed),
        ``SchemaMismatchError`` if a file does not fit the table, ``CommitConflictError``
        if a concurrent commit won the race. Returns the new version."""
        read = self._snapshot()
        self._check_fence(read, offsets, expected, epoch, resets)
        dead = [f for f in files if f.dead_letters]
        files = [f for f in files if not f.dead_letters]
        read, pending = self._grow(read, files)
        if dead:
            dead_table = self.dead_letter_table
            if dead_table is None:
                raise SchemaMismatchError(f"dead-letter files for a raw table: {dead[0].path}")
            dead_table.add_dead_letters(dead, offsets, self.location, self.filesystem)
        for attempt in range(1, self.commit_attempts + 1):
            # the write mode works on the read the version is built on (a retry's too)
            changes = self.apply.changes(self, read, files)
            write = VersionWrite(changes, dict(offsets), dict(metadata or {}), epoch, pending)
            try:
                version = self._write(read, write)
                self.apply.landed()
                break
            except CommitConflictError as conflict:
                # delta-rs also fails a blind append when another writer's DELETE, UPDATE
                # or MERGE landed since our read. If the table still has our epoch and
                # offsets, no rival of ours won: the same commit is as right on the new
                # read (nothing landed; compare-and-set again).
                if attempt == self.commit_attempts:
                    raise
                read = self._snapshot()
                try:
                    self._check_fence(read, offsets, expected, epoch, resets)
                except OffsetMismatchError:
                    raise conflict from None
        self._discard(changes.discard)
        self._after_commit()
        return version

    def commit_round(self, commit: CommitTable) -> RoundLanded:
        """A round of the coordinator's (``RoundCommitter``): ``commit`` of its files."""
        version = self.commit(
            list(commit.files),
            commit.offsets,
            commit.expected,
            commit.metadata.as_table_metadata(),
            commit.epoch,
            commit.resets,
        )
        return RoundLanded(version)

    def check_reloaded(
        self, known: Mapping[str, int], current: Mapping[str, int], resetting: Collection[str]
    ) -> None:
        check_not_behind(known, current, resetting)

    def table_status(self) -> dict[str, TableStatus]:
        return {}

    def table_offsets(self) -> dict[str, dict[str, int]]:
        return {}

    def _discard(self, paths: Sequence[str]) -> None:
        """Delete staged files no version references (best effort: vacuum finds any left)."""
        for path in paths:
            try:
                self.filesystem.delete_file(self.location.path(path))
            except OSError as exc:
                log.warning(
                    "%s: staged file %s not deleted (vacuum will): %s", self.table_path, path, exc
                )

    def claim_epoch(self) -> int:
        """Become the coordinator: bump the epoch in a version of its own (no files) and
        return it. From then on commits of older epochs fail; of two racing claims one
        raises ``CommitConflictError``."""
        read = self._snapshot()
        new_epoch = self._fence_state(read, [])[0] + 1
        # "rayconnect.epoch", as in a round's metadata: history tools find the claim by it
        metadata = {"rayconnect.epoch": str(new_epoch)}
        self._write(read, VersionWrite(NOTHING, {}, metadata, new_epoch))
        return new_epoch

    def adopt_new(
        self, epoch: int, offsets: Mapping[str, int], files: Sequence[DataFile]
    ) -> int | None:
        """A table that does not exist yet, created carrying ``epoch``, the partitions'
        ``offsets`` and the columns ``files`` bring, in ONE version: what ``ensure_table``,
        ``adopt_epoch`` and the round's schema version would be (a table made on the fly:
        ``tables.table_set``). None - nothing done - if the table exists (another
        coordinator made it first, too), or the format cannot: then ``ensure_table`` and
        ``adopt_epoch``, with all their checks."""
        return None

    def adopt_epoch(self, epoch: int, offsets: Mapping[str, int]) -> int:
        """Carry ``epoch``, claimed in another table (``tables.table_set``: many tables, one
        claim), and for partitions the table never had, their ``offsets``, in one version of
        their own (no files). Raises ``StaleEpochError`` if the table has a newer epoch,
        ``OffsetMismatchError`` if one of the partitions has an offset here already (someone
        else committed it since we read). Returns the new version."""
        read = self._snapshot()
        table_epoch, current = self._fence_state(read, list(offsets))
        if table_epoch > epoch:
            raise StaleEpochError({COORDINATOR_KEY: (epoch, table_epoch)})
        check_offsets(offsets, dict.fromkeys(offsets), current)
        metadata = {"rayconnect.epoch": str(epoch), "rayconnect.adopted": "true"}
        return self._write(read, VersionWrite(NOTHING, dict(offsets), metadata, epoch))

    def add_dead_letters(
        self,
        files: Sequence[DataFile],
        offsets: Mapping[str, int],
        staged_in: TableLocation,
        filesystem: Any,
    ) -> int:
        """This (dead-letter) table's side of a round: the round's dead-letter ``files``
        (staged under ``staged_in``'s ``DEAD_LETTER_DIR``) without the rows an earlier
        attempt committed, and its offsets moved to ``max(what it had, offsets)``, in one
        version. No fence: only the main table's commit decides whether the round counts
        (``tables.dead_letters``: why that is exactly once). Returns the version."""
        read = self._snapshot()
        had = self._fence_state(read, list(offsets))[1]
        done = {k: had[k] or 0 for k in offsets}
        keep = dead_letters.unseen(files, done, staged_in, self.location, filesystem)
        read, pending = self._grow(read, keep)
        changes = self.apply.changes(self, read, keep)
        moved = dead_letters.next_offsets(done, offsets)
        metadata = {"rayconnect.deadLetters": "1"}
        version = self._write(read, VersionWrite(changes, moved, metadata, None, pending))
        self._after_commit()
        return version

    def commit_dead_letters(self, files: Sequence[DataFile], offsets: Mapping[str, int]) -> None:
        """The round's dead-letter step alone (what a coordinator that dies before the
        main commit leaves behind)."""
        dead_table = self.dead_letter_table
        assert dead_table is not None, "a raw table has no dead letters"
        dead_table.add_dead_letters(files, offsets, self.location, self.filesystem)

    def dead_letter_counts(self) -> dict[str, int]:
        """Partition key -> rows in the dead-letter table ({} if it was never made)."""
        dead = self.dead_letter_table
        if dead is None or not dead.exists():
            return {}
        return dead.partition_counts()

    def vacuum(self, retention_hours: float, dry_run: bool = False) -> list[str]:
        """Delete files the table does not reference (aborted rounds') older than
        ``retention_hours``, the dead-letter table's too; returns what was (or would be)
        removed, relative to the table. ``retention_hours`` must exceed the longest open
        round: its files are not in the table yet."""
        removed = self._vacuum_files(retention_hours, dry_run)
        dead = self.dead_letter_table
        if dead is not None and dead.exists():
            removed += [f"{DEAD_LETTER_DIR}/{p}" for p in dead.vacuum(retention_hours, dry_run)]
        return removed

    def _check_fence(
        self,
        read: Any,
        offsets: Mapping[str, int],
        expected: Mapping[str, int | None],
        epoch: int | None,
        resets: Collection[str] = (),
    ) -> None:
        """Compare-and-set's compare on ``read``: the epoch (if fenced), then every
        partition's offset."""
        table_epoch, current = self._fence_state(read, list(offsets))
        check_epoch(epoch, table_epoch)
        check_offsets(offsets, expected, current, resets)

    def _grow(self, read: Any, files: Sequence[DataFile]) -> tuple[Any, pa.Schema]:
        """Check every file against the table grown by the columns the files bring; returns
        the read to commit on and the columns still to add in the round's own version."""
        footers = {f.path: self._footer(f) for f in files}
        grown = new_columns(self._schema_at(read), footers) if self.typed else EMPTY_SCHEMA
        read, pending = self._add_columns(read, grown) if len(grown) else (read, grown)
        table_schema = self._schema_at(read)
        for f in files:
            self._check_file(f, footers[f.path], table_schema, pending)
        return read, pending

    def _footer(self, data_file: DataFile) -> pa.Schema:
        """The file's columns as the table would hold them (an upsert round's delete and
        truncate flags and LSNs are the write mode's, never table columns)."""
        try:
            schema = pq.read_schema(self.location.path(data_file.path), filesystem=self.filesystem)
        except (OSError, pa.ArrowInvalid) as exc:
            raise SchemaMismatchError(
                f"{data_file.path}: not a readable Parquet file ({exc})"
            ) from exc
        return pa.schema([f for f in schema if not is_change_column(f.name)], schema.metadata)

    def _check_file(
        self, data_file: DataFile, footer: pa.Schema, table: pa.Schema, pending: pa.Schema
    ) -> None:
        """The file's footer has the table's schema (a typed table's plus ``pending``: a
        file may lack newer columns or hold a narrower int/float): neither delta-rs nor
        pyiceberg checks it as clearly."""
        if self.typed:
            grown = pa.schema(list(table) + list(pending))
            problems = evolution.merge(grown, footer)[1]
            if self.rejects_unknown_columns:
                extra = [n for n in footer.names if n not in grown.names]
                problems += [f"column {n!r} is not in the table" for n in extra]
        else:
            problems = evolution.schema_differences(footer, table)
        if problems:
            raise SchemaMismatchError(
                f"{data_file.path} does not match the table schema: {'; '.join(problems)}"
            )

    # -- the format's hooks -----------------------------------------------------------------

    @abc.abstractmethod
    def _snapshot(self) -> Any:
        """The table as read now: a round is built on, and committed on, exactly this read."""

    @abc.abstractmethod
    def _fence_state(self, read: Any, keys: Sequence[str]) -> tuple[int, dict[str, int | None]]:
        """The epoch (0 = never claimed) and ``keys``' offsets (None = never committed) in
        ``read``."""

    @abc.abstractmethod
    def _schema_at(self, read: Any) -> pa.Schema:
        """``read``'s schema as the writers' files spell it (``normalize_type``)."""

    @abc.abstractmethod
    def _add_columns(self, read: Any, columns: pa.Schema) -> tuple[Any, pa.Schema]:
        """Make the round's new ``columns`` (nullable) part of the table: returns the read
        to commit on and the columns the round's own version must still add (a format that
        can add them in the same version defers them all)."""

    @abc.abstractmethod
    def file_entry(self, data_file: DataFile) -> Any:
        """A checked file as this format's commit names it (a Delta ``AddAction``, an
        Iceberg file path)."""

    @abc.abstractmethod
    def _write(self, read: Any, write: VersionWrite) -> int:
        """ONE version on exactly ``read``: the changes, the pending columns, every
        partition's offset set, the epoch (re-)asserted if given, the metadata beside.
        A concurrent commit makes it raise ``CommitConflictError`` (nothing committed).
        Returns the new version."""

    @abc.abstractmethod
    def _vacuum_files(self, retention_hours: float, dry_run: bool) -> list[str]:
        """This table's own vacuum (``vacuum`` adds the dead-letter table's)."""

    @abc.abstractmethod
    def _after_commit(self) -> None:
        """Upkeep that rides on a commit that landed (its failure is logged, never raised:
        the commit stands)."""


class TableUpkeep(Protocol):
    """Upkeep of one table, whatever its format, run in the coordinator's upkeep thread
    beside the rounds (``protocol.upkeep.UpkeepSchedule`` says when)."""

    def configure_table(self) -> dict[str, str]:
        """Set the table properties upkeep relies on, at start-up; returns what changed."""
        ...

    def compact(self) -> dict[str, Any]:
        """Merge small files; returns what it did."""
        ...

    def tidy(self) -> dict[str, Any]:
        """Tidy the table's metadata and vacuum unreferenced files; returns what it did."""
        ...
