"""What the coordinator needs from a table, whatever its format (Delta, Iceberg).

The table is the only source of truth for committed offsets (docs/design.md, I2), and only the
coordinator of the newest epoch may commit (I3). Each format keeps both in its own way (Delta
``txn`` actions, Iceberg snapshot summaries and table properties); the coordinator sees only
this interface and these errors, so a new format is one module and one factory entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from rayconnect.protocol.types import DataFile

#: The key of the coordinator epoch beside the partition keys (never a partition).
COORDINATOR_KEY = "_coordinator"


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


def check_not_behind(known: Mapping[str, int], current: Mapping[str, int | None]) -> None:
    """After a reload: every partition's offset in the table is at least the one the
    coordinator last knew the table to have. The pipeline only ever moves its offsets
    forward, so an offset that went back (or vanished) was moved by hand or the table was
    replaced; re-reading from there would write records twice. Raises ``TableBrokenError``."""
    behind = {
        key: (was, current.get(key))
        for key, was in known.items()
        if current.get(key) is None or current[key] < was  # type: ignore[operator]
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
) -> None:
    """Compare-and-set's compare: every partition of the round must still be at the offset
    the round started from (``expected``; None = never committed) in the table (``current``).

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
        if start is not None and new < start:
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


class TableCommitter(Protocol):
    """One pipeline's view of one table: its offsets, its epoch, its commits.

    Not thread-safe; one per coordinator. Every method may block (table IO): the coordinator
    calls them from a worker thread.
    """

    #: Where the table is, for status and logs.
    table_path: str

    def ensure_table(self) -> Any:
        """Create the table (all columns nullable) if missing; else check its schema
        (``SchemaMismatchError``)."""
        ...

    def current_schema(self) -> Any:
        """The table's schema now (``pa.Schema``; its first one if it does not exist yet):
        what the writer decodes typed records against."""
        ...

    def claim_epoch(self) -> int:
        """Bump the coordinator epoch in the table and return it: from then on commits of
        older epochs fail. Two racing claims: one raises ``CommitConflictError``."""
        ...

    def epoch(self) -> int:
        """The current coordinator epoch (0 = never claimed)."""
        ...

    def committed_offsets(self, keys: Iterable[str] | None = None) -> dict[str, int]:
        """Partition key -> next offset to read; partitions never committed are absent.
        ``None``: every partition this pipeline ever committed."""
        ...

    def version(self) -> int:
        """The table's latest version (increases with every commit)."""
        ...

    def commit(
        self,
        files: Sequence[DataFile],
        offsets: Mapping[str, int],
        expected: Mapping[str, int | None],
        metadata: Mapping[str, str] | None = None,
        epoch: int | None = None,
    ) -> int:
        """Commit ``files`` and every partition's offset in ONE table version, if the table
        still has ``expected`` and ``epoch``; else raise and commit nothing. Returns the
        new version."""
        ...

    def vacuum(self, retention_hours: float, dry_run: bool = False) -> list[str]:
        """Delete files the table does not reference (aborted rounds') older than
        ``retention_hours``; returns what was (or would be) removed."""
        ...
