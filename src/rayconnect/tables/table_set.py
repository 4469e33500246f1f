"""The tables of a sink with routes (``config.routes``): one round, one commit per table
touched, exactly once across them all.

Every table is committed by the same ``TableCommitter.commit`` as a sink of one table
(compare-and-set on that table's own offsets, the epoch re-asserted); this class only
decides, per round, what each table gets (``protocol.table_offsets``: the rule, pure) and
in which order:

1. the sink's own table is read for the epoch: a coordinator fenced there stops before it
   touches any route table;
2. every table the round touches that lacks this coordinator's epoch, or one of the round's
   partitions, gets them in a version of its own (``TableCommitter.adopt_epoch``) - the
   partitions at the round's START offset - before any table's rows land;
3. the unrouted records go to the sink's own table (its dead letters: they skip by their own
   offsets, as a typed table's dead letters do);
4. each route table commits its files - without the rows below its own offsets, which only
   a recovery makes it hold (``tables.skip_rows``) - and its partitions' offsets.

A coordinator that dies anywhere in between leaves every table consistent on its own, and
the partition restarts from the smallest offset among its tables.

The epoch is claimed in the sink's own table (one place: two racing claims cannot both win)
and adopted by each route table on its first commit of the epoch; a route table that holds
a newer epoch fences the coordinator the same way its own table does. A zombie that commits
a route table the new coordinator has not adopted yet can only do so with the offsets that
table has (compare-and-set), so what it commits is exactly once too, and the new
coordinator's next commit there fails on those offsets and reloads.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from rayconnect.config.sink import IcebergSink, TableSink
from rayconnect.formats.settings import RecordFormat
from rayconnect.protocol.effects import CommitTable
from rayconnect.protocol.status import TableStatus
from rayconnect.protocol.table_offsets import (
    idle_partitions,
    restart_offsets,
    round_starts,
    table_round,
)
from rayconnect.protocol.types import DataFile
from rayconnect.tables.base import (
    COORDINATOR_KEY,
    StaleEpochError,
    TableCommitter,
    check_not_behind,
)
from rayconnect.tables.round_committer import RoundLanded, TableLanded
from rayconnect.tables.skip_rows import without_rows_below
from rayconnect.write_modes.row_delta import Search, search_here

log = logging.getLogger(__name__)

T = TypeVar("T")

#: threads reading many tables at once (their logs or catalog entries: IO, not CPU)
READ_THREADS = 8


class TableSet:
    """The committers of a routed sink's tables, by name, and the sink's own table (its
    unrouted records and the epoch). Not thread-safe; one per coordinator; blocking IO."""

    def __init__(
        self,
        sink: TableSink,
        pipeline: str,
        formats: Callable[[str], RecordFormat],
        search: Search = search_here,
    ) -> None:
        from rayconnect.tables.factory import open_committer, open_own_table, route_tables

        self.sink, self.pipeline, self.formats = sink, pipeline, formats
        #: each table's committer keys, partitions and decodes as its own format says
        self._open = lambda name: open_committer(
            sink.route_table(name), pipeline, formats(name), search
        )
        self._route_tables = lambda: route_tables(sink, pipeline)
        #: the sink's own table: unrouted records (a dead-letter table) and the epoch
        self.own = open_own_table(sink, pipeline)
        self.location = sink.location()  # where the unrouted records are staged
        self.table_path = f"{sink.path} (and its route tables)"
        self.tables: dict[str, TableCommitter] = {}
        #: each table's offsets as last read or committed (compare-and-set's expected)
        self.offsets: dict[str, dict[str, int]] = {}
        #: tables that carry this coordinator's epoch
        self._adopted: set[str] = set()
        self._epoch = 0
        self._versions: dict[str, int] = {}
        self._rows: dict[str, int] = {}  # rows committed since this coordinator started
        self._last_commit: dict[str, float] = {}  # Unix time of its last commit
        #: tables read or committed side by side: Delta tables are independent; Iceberg
        #: ones share a catalog (its SQL database), so one at a time
        self._threads = 1 if isinstance(sink, IcebergSink) else READ_THREADS

    def committer(self, name: str) -> TableCommitter:
        committer = self.tables.get(name)
        if committer is None:
            committer = self.tables[name] = self._open(name)
        return committer

    # -- what the coordinator asks of its table(s) -----------------------------------------

    def ensure_table(self) -> None:
        self.own.ensure_table()

    def claim_epoch(self) -> int:
        """Claim a new epoch in the sink's own table; route tables adopt it as they are
        committed."""
        self._epoch = self.own.claim_epoch()
        self._adopted.clear()
        return self._epoch

    def epoch(self) -> int:
        return self.own.epoch()

    def committed_offsets(self, keys: Iterable[str] | None = None) -> dict[str, int]:
        """Where each partition restarts (``protocol.table_offsets.restart_offsets``),
        every table read again. Raises ``TableBrokenError`` if a table's offsets moved
        backwards since this set last read or committed them."""
        for name in self._route_tables():
            self.committer(name)
        names = sorted(self.tables)
        offsets = self._each(lambda n: self.tables[n].committed_offsets(None), names)
        read = dict(zip(names, offsets, strict=True))
        for name, known in self.offsets.items():
            # per table: the smallest offset may well be below what the last round
            # committed (a table the partition did not feed), a table's own never
            check_not_behind(known, read.get(name, {}))
        self.offsets = read
        start = restart_offsets(self.offsets, self.own.committed_offsets(None))
        if keys is None:
            return start
        wanted = set(keys)
        return {k: v for k, v in start.items() if k in wanted}

    def committed_cut(self) -> int | None:
        """The highest cut over the route tables (their commits are one after another: the
        table committed last holds the newest); the sink's own table holds none."""
        for name in self._route_tables():
            self.committer(name)
        names = sorted(self.tables)
        cuts = self._each(lambda n: self.tables[n].committed_cut(), names)
        return max((c for c in cuts if c is not None), default=None)

    def table_offsets(self) -> dict[str, dict[str, int]]:
        """Table name -> its offsets, as last read or committed (for status)."""
        # copies of copies (each atomic under the GIL): a commit thread may update them
        return {name: dict(offsets) for name, offsets in sorted(dict(self.offsets).items())}

    def table_status(self) -> dict[str, TableStatus]:
        """Each route table's part of the status (the handle adds its lag)."""
        return {
            name: TableStatus(
                version=self._versions.get(name),
                rows_since_start=self._rows.get(name, 0),
                last_commit_at=self._last_commit.get(name),
                offsets=dict(offsets),
            )
            for name, offsets in sorted(self.offsets.items())
        }

    def version(self) -> int:
        """The sum of the tables' versions: it grows with every commit of any of them."""
        return sum(self._versions.values())

    def dead_letter_counts(self) -> dict[str, int]:
        """Partition key -> bad and unrouted records, over every table."""
        counts = self.own.partition_counts() if self.own.exists() else {}
        names = sorted(self.tables)
        for each in self._each(lambda n: self.tables[n].dead_letter_counts(), names):
            for key, n in each.items():
                counts[key] = counts.get(key, 0) + n
        return counts

    def _each(self, read: Callable[[str], T], names: Sequence[str]) -> list[T]:
        """``read`` of each table, in parallel for Delta sinks (each table's log: IO, and
        200 tables one after another took seconds); one after another for Iceberg ones,
        whose tables share a catalog. Raises the first failure once all are done."""
        return _parallel(read, names, self._threads)

    # -- the round ------------------------------------------------------------------------

    def commit_round(self, commit: CommitTable) -> RoundLanded:
        """Commit the round to every table it touches (the order in the module docstring).
        Raises like ``TableCommitter.commit``; whatever landed before stays consistent."""
        if commit.resets:  # refused by the config check: route tables keep their own offsets
            raise ValueError(f"a routed sink cannot start partitions over: {sorted(commit.resets)}")
        self._check_own_epoch(commit.epoch)
        starts = round_starts(commit.expected, commit.starts)
        by_table: dict[str | None, list[DataFile]] = {}
        for f in commit.files:
            by_table.setdefault(f.table, []).append(f)
        unrouted = by_table.pop(None, [])
        idle = idle_partitions(self.offsets, _partitions(commit.files), commit.offsets)
        for name in idle:
            by_table.setdefault(name, [])  # moves its offsets alone (``idle_partitions``)
        rounds = {
            name: table_round(
                self.offsets.get(name, {}),
                set(_partitions(files)) | idle.get(name, set()),
                starts,
                commit.offsets,
            )
            for name, files in sorted(by_table.items(), key=lambda item: str(item[0]))
            if name is not None
        }
        adopting = [n for n, plan in rounds.items() if n not in self._adopted or plan.introduce]
        for name in adopting:
            self.committer(name)

        def adopt(name: str) -> int:  # 2: epoch and new partitions, before any rows
            committer, introduce = self.tables[name], rounds[name].introduce
            # a new table: made carrying them (and its first files' columns), one version
            made = committer.adopt_new(commit.epoch, introduce, by_table[name])
            if made is not None:
                return made
            committer.ensure_table()
            return committer.adopt_epoch(commit.epoch, introduce)

        adopted, failure = _landed(adopt, adopting, self._threads)
        for name, version in adopted:
            self._versions[name] = version
            self._adopted.add(name)
            self.offsets.setdefault(name, {}).update(rounds[name].introduce)
        if failure is not None:
            raise failure
        if unrouted:  # 3
            moved = {k: commit.offsets[k] for k in _partitions(unrouted)}
            self.own.add_dead_letters(unrouted, moved, self.location, self.own.filesystem)
        metadata = commit.metadata.as_table_metadata()

        def commit_one(name: str) -> TableLanded | None:  # 4
            plan, committer = rounds[name], self.committer(name)
            files = without_rows_below(
                by_table[name], plan.floors, committer.location, committer.filesystem
            )
            if not files and not plan.moves:
                return None
            version = committer.commit(files, plan.offsets, plan.expected, metadata, commit.epoch)
            rows = sum(f.records for f in files if not f.dead_letters)
            return TableLanded(version, rows, len(files))

        names = list(rounds)
        for name in names:
            self.committer(name)
        # the first table alone, then the others side by side: a coordinator that dies in
        # between leaves one table ahead, a state the tests make on purpose
        landed, failure = _landed(commit_one, names[:1], 1)
        if failure is None:
            rest, failure = _landed(commit_one, names[1:], self._threads)
            landed += rest
        now = time.time()
        tables = {name: done for name, done in landed if done is not None}
        for name, done in tables.items():
            self._versions[name] = done.version
            self.offsets[name].update(rounds[name].offsets)
            self._rows[name] = self._rows.get(name, 0) + done.rows
            self._last_commit[name] = now
        if failure is not None:
            raise failure
        return RoundLanded(self.version(), tables)

    def check_reloaded(
        self, known: Mapping[str, int], current: Mapping[str, int], resetting: Collection[str]
    ) -> None:
        """Nothing more: ``committed_offsets`` checked each table against itself (the
        smallest offset of a partition may well go down: a table it did not feed)."""

    def _check_own_epoch(self, epoch: int) -> None:
        current = self.own.epoch()
        if current != epoch:
            raise StaleEpochError({COORDINATOR_KEY: (epoch, current)})


def _parallel(read: Callable[[str], T], names: Sequence[str], threads: int) -> list[T]:
    """``read(name)`` of each name, in order, on up to ``threads`` threads; the first
    failure is raised once every call has ended."""
    if threads <= 1 or len(names) <= 1:
        return [read(n) for n in names]
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(names))) as pool:
        futures = [pool.submit(read, n) for n in names]
    return [f.result() for f in futures]


def _landed(
    write: Callable[[str], T], names: Sequence[str], threads: int
) -> tuple[list[tuple[str, T]], BaseException | None]:
    """``write(name)`` of each name on up to ``threads`` threads: (name, result) of those
    that landed, and the first failure (None: none failed). One after another (one thread)
    it stops at the first failure, as a loop would. The caller records what landed before
    it raises the failure: each table's offsets stay exact either way."""
    landed: list[tuple[str, T]] = []
    if threads <= 1 or len(names) <= 1:
        for n in names:
            try:
                landed.append((n, write(n)))
            except Exception as e:
                return landed, e
        return landed, None
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(names))) as pool:
        futures = [(n, pool.submit(write, n)) for n in names]
    failure: BaseException | None = None
    for n, f in futures:
        error = f.exception()
        if error is None:
            landed.append((n, f.result()))
        elif failure is None:
            failure = error
    return landed, failure


def _partitions(files: Sequence[DataFile]) -> list[str]:
    """The partitions whose rows (or dead letters) ``files`` hold: a routed write names
    them in every file (``shared_by``)."""
    keys: dict[str, None] = {}
    for f in files:
        for key in (*f.shared_by, *f.dead_letters):
            keys[key] = None
    return list(keys)


class RouteSchemas:
    """The schemas of a routed sink's tables that exist, by name: the writer decodes each
    table's rows against its own (a new table starts from the format's first schema).
    Picklable: the writer actor gets it and calls it before each write.

    Cached, not read before every write (200 tables: a listing and 200 log reads a write).
    A table's schema changes only when this pipeline commits files that bring it columns,
    and the writer sees that coming: a file whose schema is not its table's cached one
    (``spark_bridge.write_result``'s ``WriteResult.schema_changes``, a new table too) marks the table
    ``stale``, and the next call reads the stale tables again, by name. A table stays
    cached as read until a write mismatches it again (a commit not landed yet when it was
    read again makes the next write mismatch, and so on until it has): a write never
    decodes against an older schema than reading before every write would give it, but
    for that one write."""

    def __init__(
        self, sink: TableSink, pipeline: str, formats: Callable[[str], RecordFormat]
    ) -> None:
        self.sink, self.pipeline, self.formats = sink, pipeline, formats
        self._tables: dict[str, TableCommitter] = {}
        self._catalog: Any = None  # an Iceberg sink's, opened once
        self._schemas: dict[str, pa.Schema] | None = None  # None: not listed yet
        self._stale: set[str] = set()
        #: tables read so far (the listing at the first call, then the stale ones)
        self.reads = 0

    def __call__(self) -> dict[str, pa.Schema]:
        from rayconnect.tables.factory import iceberg_committer, route_tables

        if isinstance(self.sink, IcebergSink) and self._catalog is None:
            self._catalog = iceberg_committer(self.sink, self.pipeline, None).catalog()
        if self._schemas is None:
            names = route_tables(self.sink, self.pipeline, self._catalog)
            self._schemas = {}
            self._read(names, exist=True)
        elif self._stale:
            stale, self._stale = sorted(self._stale), set()
            self._read(stale, exist=False)
        return dict(self._schemas)

    def changed(self, names: Iterable[str]) -> None:
        """Tables whose schema the last write did not match (or that were new): read again
        at the next call."""
        self._stale.update(names)

    def _read(self, names: Sequence[str], exist: bool) -> None:
        """Read ``names``' schemas, in parallel (each a log or catalog read); ``exist``:
        they were just listed, else a table not made yet stays out."""
        from rayconnect.tables.factory import open_committer

        assert self._schemas is not None
        for name in names:
            if name not in self._tables:
                route = self.sink.route_table(name)
                self._tables[name] = open_committer(route, self.pipeline, self.formats(name))

        def read(name: str) -> pa.Schema | None:
            table = self._tables[name]
            return table.current_schema() if exist or table.exists() else None

        threads = 1 if isinstance(self.sink, IcebergSink) else READ_THREADS  # one catalog
        with concurrent.futures.ThreadPoolExecutor(min(threads, max(len(names), 1))) as pool:
            for name, schema in zip(names, pool.map(read, names), strict=True):
                if schema is not None:
                    self._schemas[name] = schema
        self.reads += len(names)

    def __getstate__(self) -> dict[str, Any]:
        return {"sink": self.sink, "pipeline": self.pipeline, "formats": self.formats}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sink"], state["pipeline"], state["formats"])  # type: ignore[misc]
