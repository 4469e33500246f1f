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

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from rayconnect.config.sink import TableSink
from rayconnect.formats.settings import RecordFormat
from rayconnect.protocol.effects import CommitTable
from rayconnect.protocol.table_offsets import restart_offsets, round_starts, table_round
from rayconnect.protocol.types import DataFile
from rayconnect.tables.base import (
    COORDINATOR_KEY,
    StaleEpochError,
    TableCommitter,
    check_not_behind,
)
from rayconnect.tables.skip_rows import without_rows_below

log = logging.getLogger(__name__)

#: Tests only: the path of a marker file; while it exists, a round that commits more than
#: one route table stops the process after the first (a coordinator killed between tables,
#: deterministically), and removes the marker so that the restarted one goes on.
FAULT_ENV = "RAYCONNECT_TEST_DIE_BETWEEN_TABLES"


class TableSet:
    """The committers of a routed sink's tables, by name, and the sink's own table (its
    unrouted records and the epoch). Not thread-safe; one per coordinator; blocking IO."""

    def __init__(
        self, sink: TableSink, pipeline: str, formats: Callable[[str], RecordFormat]
    ) -> None:
        from rayconnect.tables.factory import open_committer, open_own_table, route_tables

        self.sink, self.pipeline, self.formats = sink, pipeline, formats
        #: each table's committer keys, partitions and decodes as its own format says
        self._open = lambda name: open_committer(sink.route_table(name), pipeline, formats(name))
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
        read = {name: c.committed_offsets(None) for name, c in self.tables.items()}
        for name, known in self.offsets.items():
            # per table: the smallest offset may well be below what the last round
            # committed (a table the partition did not feed), a table's own never
            check_not_behind(known, read.get(name, {}))
        self.offsets = read
        start = restart_offsets(self.offsets, self.own.committed_offsets(None))
        return start if keys is None else {k: v for k, v in start.items() if k in set(keys)}

    def table_offsets(self) -> dict[str, dict[str, int]]:
        """Table name -> its offsets, as last read or committed (for status)."""
        return {name: dict(offsets) for name, offsets in sorted(self.offsets.items())}

    def version(self) -> int:
        """The sum of the tables' versions: it grows with every commit of any of them."""
        return sum(self._versions.values())

    def dead_letter_counts(self) -> dict[str, int]:
        """Partition key -> bad and unrouted records, over every table."""
        counts = self.own.partition_counts() if self.own.exists() else {}
        for committer in self.tables.values():
            for key, n in committer.dead_letter_counts().items():
                counts[key] = counts.get(key, 0) + n
        return counts

    # -- the round ------------------------------------------------------------------------

    def commit_round(self, commit: CommitTable) -> int:
        """Commit the round to every table it touches (the order in the module docstring).
        Raises like ``TableCommitter.commit``; whatever landed before stays consistent."""
        self._check_own_epoch(commit.epoch)
        starts = round_starts(commit.expected, commit.starts)
        by_table: dict[str | None, list[DataFile]] = {}
        for f in commit.files:
            by_table.setdefault(f.table, []).append(f)
        unrouted = by_table.pop(None, [])
        rounds = {
            name: table_round(
                self.offsets.get(name, {}), _partitions(files), starts, commit.offsets
            )
            for name, files in sorted(by_table.items(), key=lambda item: str(item[0]))
            if name is not None
        }
        for name, plan in rounds.items():  # 2: epoch and new partitions, before any rows
            if name in self._adopted and not plan.introduce:
                continue
            committer = self.committer(name)
            committer.ensure_table()
            self._versions[name] = committer.adopt_epoch(commit.epoch, plan.introduce)
            self._adopted.add(name)
            self.offsets.setdefault(name, {}).update(plan.introduce)
        if unrouted:  # 3
            moved = {k: commit.offsets[k] for k in _partitions(unrouted)}
            self.own.add_dead_letters(unrouted, moved, self.location, self.own.filesystem)
        metadata = commit.metadata.as_table_metadata()
        committed = 0
        for name, plan in rounds.items():  # 4
            committer = self.committer(name)
            files = without_rows_below(
                by_table[name], plan.floors, committer.location, committer.filesystem
            )
            if not files and not plan.moves:
                continue
            if committed == 1:
                _die_between_tables(len(rounds))
            version = committer.commit(files, plan.offsets, plan.expected, metadata, commit.epoch)
            self._versions[name] = version
            self.offsets[name].update(plan.offsets)
            committed += 1
        return self.version()

    def _check_own_epoch(self, epoch: int) -> None:
        current = self.own.epoch()
        if current != epoch:
            raise StaleEpochError({COORDINATOR_KEY: (epoch, current)})


def _partitions(files: Sequence[DataFile]) -> list[str]:
    """The partitions whose rows (or dead letters) ``files`` hold: a routed write names
    them in every file (``shared_by``)."""
    keys: dict[str, None] = {}
    for f in files:
        for key in (*f.shared_by, *f.dead_letters):
            keys[key] = None
    return list(keys)


def _die_between_tables(tables: int) -> None:
    marker = os.environ.get(FAULT_ENV)
    if marker and tables > 1 and os.path.exists(marker):
        os.remove(marker)
        log.error("%s: dying between the tables of a round (a test's fault point)", FAULT_ENV)
        os._exit(1)


class RouteSchemas:
    """The schemas of a routed sink's tables that exist now, by name: the writer decodes
    each table's rows against its own (a new table starts from its format's first schema).
    Picklable: the writer actor gets it and calls it before each write."""

    def __init__(
        self, sink: TableSink, pipeline: str, formats: Callable[[str], RecordFormat]
    ) -> None:
        self.sink, self.pipeline, self.formats = sink, pipeline, formats
        self._tables: dict[str, TableCommitter] = {}
        self._catalog: Any = None  # an Iceberg sink's, opened once

    def __call__(self) -> dict[str, pa.Schema]:
        from rayconnect.config.sink import IcebergSink
        from rayconnect.tables.factory import iceberg_committer, open_committer, route_tables

        if isinstance(self.sink, IcebergSink) and self._catalog is None:
            self._catalog = iceberg_committer(self.sink, self.pipeline, None).catalog()
        for name in route_tables(self.sink, self.pipeline, self._catalog):
            if name not in self._tables:
                route = self.sink.route_table(name)
                self._tables[name] = open_committer(route, self.pipeline, self.formats(name))
        return {name: table.current_schema() for name, table in self._tables.items()}

    def __getstate__(self) -> dict[str, Any]:
        return {"sink": self.sink, "pipeline": self.pipeline, "formats": self.formats}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["sink"], state["pipeline"], state["formats"])  # type: ignore[misc]
