"""Upkeep of a pipeline's Iceberg table, behind the same ``TableUpkeep`` door as Delta's.

Most of it rides on the commits: the committer expires snapshots every ``MAINTAIN_EVERY``
commits, the append merges manifests and drops old metadata files (table properties set
when the table is made). What is left is the tidy: vacuum of the files no metadata reaches
(aborted rounds', expired snapshots' manifests) - and, for a merge-on-read upsert table,
folding its deletes into its data files (``tables.iceberg_compaction``).
"""

from __future__ import annotations

import logging
from typing import Any

from rayconnect.protocol.upkeep import FoldDeletes
from rayconnect.tables.iceberg import IcebergCommitter
from rayconnect.tables.iceberg_compaction import fold_deletes
from rayconnect.write_modes.modes import MergeOnRead

log = logging.getLogger(__name__)


class IcebergUpkeep:
    """Tidies one Iceberg table for one pipeline. Its committer is its own, not the
    rounds' (this runs in the coordinator's upkeep thread)."""

    def __init__(
        self,
        committer: IcebergCommitter,
        vacuum_retention_hours: float,
        fold: FoldDeletes,
    ) -> None:
        self._committer = committer
        self.vacuum_retention_hours = vacuum_retention_hours
        self.fold = fold

    def configure_table(self) -> dict[str, str]:
        """Nothing: ``IcebergCommitter.ensure_table`` sets the properties upkeep needs."""
        return {}

    def compact(self) -> dict[str, Any]:
        """Fold deletes (scheduled for merge-on-read upsert tables only); a run that loses
        the race with a round is tried again on a fresh read."""
        from pyiceberg.exceptions import CommitFailedException

        if not isinstance(self._committer.apply, MergeOnRead):
            return {}  # nothing to fold: its rounds write no deletes
        for attempt in range(self.fold.retries + 1):
            table = self._committer.load_current()
            try:
                return fold_deletes(
                    table,
                    self.fold.max_files,
                    self.fold.min_deleted_fraction,
                    {"rayconnect.operation": "fold-deletes"},
                )
            except CommitFailedException as exc:
                log.info("iceberg %s: folding deletes lost a race (%s)", table.name(), exc)
                if attempt == self.fold.retries:
                    return {"files_rewritten": 0, "lost_races": attempt + 1}
        return {}

    def tidy(self) -> dict[str, Any]:
        removed = self._committer.vacuum(self.vacuum_retention_hours)
        return {"files_vacuumed": len(removed)}
