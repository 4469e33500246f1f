"""What a round does to a table besides moving its offsets: one tagged union, one variant
per write mode. A format's ``_write`` takes each variant in one place (``match``), so a new
mode (merge-on-read's deletes) is a new variant and one case per format - never a flag
tested in every hook.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec

from rayconnect.write_modes.fold import Folded
from rayconnect.write_modes.row_delta import FileDeletes, LiveFile


class Appended(msgspec.Struct, frozen=True, tag="append"):
    """The round adds files and removes nothing (Kafka records are facts; the offsets'
    compare-and-set keeps each in the table once). ``adds``: the files in the format's own
    terms (``TableCommitter.file_entry``: a Delta add action, an Iceberg file path)."""

    adds: tuple[Any, ...] = ()

    @property
    def discard(self) -> tuple[str, ...]:
        """Staged files the version does not reference: none, it references them all."""
        return ()


class Upserted(msgspec.Struct, frozen=True, tag="upsert"):
    """The round writes each key's last change in place (``fold``): the rows it upserts
    and the keys it deletes. ``staged``: the files the writers staged (every change); the
    version rewrites their rows and never references them - deleted once it landed."""

    folded: Folded
    key_columns: tuple[str, ...]
    staged: tuple[str, ...] = ()

    @property
    def discard(self) -> tuple[str, ...]:
        return self.staged


class RowDelta(msgspec.Struct, frozen=True, tag="row_delta"):
    """Merge-on-read (``write_modes.row_delta``): the round marks the rows it replaces or
    deletes as deleted where they are (``deletes``: Iceberg position delete files, Delta
    deletion vectors), drops whole files (``drop``: a truncate of the table), and appends
    ``rows`` (each key's last version, the format writes them in its partitions). No live
    file is rewritten. ``staged``: as ``Upserted.staged``."""

    rows: Any  # pa.Table: msgspec has no Arrow type; never encoded
    deletes: tuple[FileDeletes, ...] = ()
    drop: tuple[LiveFile, ...] = ()
    staged: tuple[str, ...] = ()

    @property
    def discard(self) -> tuple[str, ...]:
        return self.staged


#: what one table version changes (a claim or an adoption: ``NOTHING``)
RoundChanges: TypeAlias = Appended | Upserted | RowDelta

NOTHING: RoundChanges = Appended()
