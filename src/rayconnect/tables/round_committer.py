"""What a coordinator commits its rounds to: one table, or a routed sink's tables - one
contract (``RoundCommitter``), so the coordinator never asks which it has.

``tables.base.TableCommitter`` (one table) and ``tables.table_set.TableSet`` (a sink with
routes) both implement it; what a round landed comes back as a Struct (``RoundLanded``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol

import msgspec

from rayconnect.protocol.effects import CommitTable
from rayconnect.protocol.status import TableStatus


class TableLanded(msgspec.Struct, frozen=True):
    """One route table's part of a round: its new version, the rows and files it got."""

    version: int
    rows: int
    files: int


class RoundLanded(msgspec.Struct, frozen=True):
    """A round committed: the version the coordinator reports (a routed sink's is the sum
    of its tables'), and each route table the round committed (empty for one table)."""

    version: int
    tables: dict[str, TableLanded] = {}


class RoundCommitter(Protocol):
    """The coordinator's table(s). Every method may block (table IO): the coordinator
    calls them from a worker thread."""

    #: where the table is, for status and logs
    table_path: str

    def ensure_table(self) -> Any: ...

    def claim_epoch(self) -> int: ...

    def epoch(self) -> int: ...

    def version(self) -> int: ...

    def committed_offsets(self, keys: Iterable[str] | None = None) -> dict[str, int]: ...

    def committed_cut(self) -> int | None:
        """Consistent cuts: the newest cut recorded in the table (a routed sink's: the
        highest over its tables); None: none found. Read only with ``consistent_cuts``."""
        ...

    def dead_letter_counts(self) -> dict[str, int]: ...

    def commit_round(self, commit: CommitTable) -> RoundLanded:
        """The round as ONE version per table it touches (compare-and-set on the offsets it
        started from, the epoch re-asserted); raises and lands nothing on a table that
        refuses (``tables.base``'s errors)."""
        ...

    def check_reloaded(
        self, known: Mapping[str, int], current: Mapping[str, int], resetting: Collection[str]
    ) -> None:
        """After a reload: the offsets never moved back but for partitions starting over;
        raises ``TableBrokenError``."""
        ...

    def table_status(self) -> dict[str, TableStatus]:
        """Each route table's part of the status (empty for one table)."""
        ...

    def table_offsets(self) -> dict[str, dict[str, int]]:
        """Each route table's offsets as last read or committed (empty for one table)."""
        ...
