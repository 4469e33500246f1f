"""Which table versions make one consistent cut (``commit.consistent_cuts``).

Each version a round commits records its cut (``rayconnect.cut_lsn``: Delta commit info,
Iceberg snapshot summary). The tables of one sink are committed one after another, so at
any moment some may hold a newer cut than others; and a table whose partitions moved
nothing in a round gets no version in it (it did not change). Hence the rule: the newest
cut every table has reached is the LOWEST of the tables' newest cuts, and each table's
version for it is its newest version whose cut is at or below it - the table as it was
at that LSN. Versions without a cut (a partial commit, upkeep, an epoch adopted) are
never picked: they are not a cut, or hold the same rows as the version before them.
Time travel needs the picked versions' files: keep them (vacuum retention) as long as
readers may ask for an older cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from rayconnect.errors import RayconnectError
from rayconnect.protocol.effects import CUT_LSN_KEY

#: how many versions back from the newest a restarted coordinator looks for its table's
#: last cut (``RoundCommitter.committed_cut``): a version without one is a partial commit,
#: an epoch claimed or adopted, upkeep - rare in a row; past it the cut counts as unknown
CUT_LOOKBACK = 256


class Cut(msgspec.Struct, frozen=True):
    """One consistent cut: its LSN and each table's version holding it (a Delta version,
    an Iceberg snapshot id)."""

    lsn: int
    versions: dict[str, int]


class NoCutError(RayconnectError):
    """A table has no version that records a cut (not written with consistent cuts, or
    nothing committed yet)."""


def pick_cut(histories: Mapping[str, Iterable[tuple[int, int | None]]]) -> Cut:
    """The newest cut of all tables from each table's ``(version, cut)`` history, in
    commit order (``cut`` None: the version records none)."""
    cuts: dict[str, list[tuple[int, int]]] = {}
    for name, history in histories.items():
        cuts[name] = [(version, cut) for version, cut in history if cut is not None]
        if not cuts[name]:
            raise NoCutError(f"table {name} has no version that records a consistent cut")
    lsn = min(max(cut for _, cut in versions) for versions in cuts.values())
    picked = {name: [v for v, cut in versions if cut <= lsn][-1] for name, versions in cuts.items()}
    return Cut(lsn, picked)


def delta_history(path: str, storage_options: Mapping[str, str] | None = None) -> list[Any]:
    """A Delta table's ``(version, cut)`` history, oldest first."""
    from deltalake import DeltaTable

    table = DeltaTable(path, storage_options=dict(storage_options or {}))
    return sorted((c["version"], _lsn(c.get(CUT_LSN_KEY))) for c in table.history())


def iceberg_history(table: Any) -> list[tuple[int, int | None]]:
    """A pyiceberg table's ``(snapshot id, cut)`` history, oldest first."""
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.sequence_number)
    return [(s.snapshot_id, _lsn((s.summary or {}).get(CUT_LSN_KEY))) for s in snapshots]


def recorded_cut(info: Mapping[str, Any] | None, pipeline: str) -> int | None:
    """The cut a version of ``pipeline`` records (Delta commit info, Iceberg snapshot
    summary); None: no cut, or another pipeline's version. What a restarted coordinator
    reads back (``RoundCommitter.committed_cut``)."""
    if not info or info.get("rayconnect.pipeline") != pipeline:
        return None
    return _lsn(info.get(CUT_LSN_KEY))


def _lsn(value: Any) -> int | None:
    return None if value is None else int(value)
