"""Upkeep of a pipeline's Iceberg table, behind the same ``TableUpkeep`` door as Delta's.

Most of it rides on the commits: the committer expires snapshots every ``MAINTAIN_EVERY``
commits, the append merges manifests and drops old metadata files (table properties set
when the table is made). What is left is the tidy: vacuum of the files no metadata reaches
(aborted rounds', expired snapshots' manifests). Compaction is not scheduled for Iceberg.
"""

from __future__ import annotations

from typing import Any

from rayconnect.tables.iceberg import IcebergCommitter


class IcebergUpkeep:
    """Tidies one Iceberg table for one pipeline. Its committer is its own, not the
    rounds' (this runs in the coordinator's upkeep thread)."""

    def __init__(self, committer: IcebergCommitter, vacuum_retention_hours: float) -> None:
        self._committer = committer
        self.vacuum_retention_hours = vacuum_retention_hours

    def configure_table(self) -> dict[str, str]:
        """Nothing: ``IcebergCommitter.ensure_table`` sets the properties upkeep needs."""
        return {}

    def compact(self) -> dict[str, Any]:
        """Nothing (never scheduled: manifests are merged by the appends themselves)."""
        return {}

    def tidy(self) -> dict[str, Any]:
        removed = self._committer.vacuum(self.vacuum_retention_hours)
        return {"files_vacuumed": len(removed)}
