"""Where each key of a merge-on-read table lives, kept by the pipeline between rounds, so a
round's cost follows its changes, not the table.

Without it a round reads the key column of every live file whose statistics may hold one of
its keys - and when keys are spread at random (an update of any row of a busy database
table), every file holds some: the search costs the table (measured: ~50 ns a table row).
Data files never change once written, so the key column of each is read once, when it
first appears among the live files, and kept as sorted runs (keys, file, row position) -
16 bytes a row. A round's lookup is a binary search of its keys in each run; new files
(the rounds' own, a compaction's, another writer's) add a run, files gone from the table
(compacted away, dropped by a truncate) are marked dead and swept when runs are merged.

The index is a cache of what the live files hold, never the truth: each round first brings
it in line with the table's live files on exactly the read the round commits on, so a file
added or removed by anyone is seen. A row deleted by a round is forgotten once the round's
version landed. Rows deleted by someone else (an outside DELETE with deletion vectors) stay
in it and are deleted again by a round that changes their key - harmless in both formats.

Only a single integer key column is indexed (its values are the index keys); the table
must hold at most ``max_rows`` rows, else the round searches the files as without an index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from rayconnect.write_modes.row_delta import FileDeletes, LiveFile

#: runs beyond the oldest (largest) one before the small ones are merged
_MAX_RUNS = 8


@dataclass
class _Run:
    """Index entries sorted by key: file id and row position of each, and whether the row
    may still be live."""

    keys: np.ndarray  # int64, sorted
    files: np.ndarray  # int32
    positions: np.ndarray  # uint32
    alive: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.alive = np.ones(len(self.keys), dtype=bool)

    @classmethod
    def merged(cls, runs: Sequence[_Run], file_alive: np.ndarray) -> _Run:
        keep = [r.alive & file_alive[r.files] for r in runs]
        keys = np.concatenate([r.keys[k] for r, k in zip(runs, keep, strict=True)])
        order = np.argsort(keys, kind="stable")  # sorted runs: a merge, not a sort
        return cls(
            keys[order],
            np.concatenate([r.files[k] for r, k in zip(runs, keep, strict=True)])[order],
            np.concatenate([r.positions[k] for r, k in zip(runs, keep, strict=True)])[order],
        )


@dataclass(frozen=True)
class Found:
    """Entries a lookup matched, to forget once the round that deletes them landed."""

    entries: tuple[tuple[_Run, np.ndarray], ...] = ()


class KeyIndex:
    """The index of one table's single integer key column (module docstring)."""

    def __init__(self, column: str, max_rows: int) -> None:
        self.column = column
        self.max_rows = max_rows
        self._ids: dict[str, int] = {}
        self._paths: list[str] = []
        self._file_alive = np.zeros(0, dtype=bool)
        self._runs: list[_Run] = []
        self._rows = 0
        self.usable = max_rows > 0

    @property
    def rows(self) -> int:
        """Entries held (rows of live files, deleted ones until swept)."""
        return self._rows

    def sync(
        self, live: Sequence[LiveFile], read_columns: Callable[[LiveFile, list[str]], pa.Table]
    ) -> bool:
        """Bring the index in line with ``live``: files gone are dead, new files read.
        False: the index cannot serve this table (too many rows, not an integer key)."""
        if not self.usable:
            return False
        wanted = {f.path for f in live}
        for path, i in self._ids.items():
            if path not in wanted:
                self._file_alive[i] = False
        new = [f for f in live if f.path not in self._ids and f.rows]
        if self._rows + sum(f.rows for f in new) > self.max_rows:
            return self._give_up()
        runs = [self._run_of(f, read_columns) for f in new]
        if any(r is None for r in runs):
            return self._give_up()
        for r in runs:
            assert r is not None
            self._runs.append(r)
            self._rows += len(r.keys)
        self._compact()
        return True

    def _give_up(self) -> bool:
        self.usable = False
        self._runs, self._ids, self._paths, self._rows = [], {}, [], 0
        return False

    def _run_of(
        self, f: LiveFile, read_columns: Callable[[LiveFile, list[str]], pa.Table]
    ) -> _Run | None:
        column = read_columns(f, [self.column]).column(0)
        if not pa.types.is_integer(column.type):
            return None
        keys = column.to_numpy(zero_copy_only=False)
        if column.null_count:  # a null key was never upserted by key: no entry
            valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False))
        else:
            valid = np.ones(len(keys), dtype=bool)
        positions = np.flatnonzero(valid).astype(np.uint32)
        keys = keys[valid].astype(np.int64)
        order = np.argsort(keys, kind="stable")
        file_id = self._file_id(f.path)
        return _Run(keys[order], np.full(len(keys), file_id, np.int32), positions[order])

    def _file_id(self, path: str) -> int:
        self._ids[path] = len(self._paths)
        self._paths.append(path)
        self._file_alive = np.append(self._file_alive, True)
        return self._ids[path]

    def _compact(self) -> None:
        """Merge the small runs into one when there are many, and into the base run when
        they grow to a quarter of it (sweeping dead entries), so a lookup searches a few."""
        if len(self._runs) <= _MAX_RUNS:
            return
        base, small = self._runs[0], self._runs[1:]
        if sum(len(r.keys) for r in small) * 4 >= len(base.keys):
            self._runs = [_Run.merged(self._runs, self._file_alive)]
        else:
            self._runs = [base, _Run.merged(small, self._file_alive)]
        self._rows = sum(len(r.keys) for r in self._runs)

    def find(
        self, keys: pa.Array | pa.ChunkedArray, live: Sequence[LiveFile]
    ) -> tuple[tuple[FileDeletes, ...], Found]:
        """The live rows holding ``keys``, per file; and the entries matched."""
        wanted = np.unique(
            np.asarray(keys.drop_null().cast(pa.int64()).to_numpy(zero_copy_only=False))
        )
        by_file: dict[int, list[np.ndarray]] = {}
        entries = []
        for run in self._runs:
            lo = np.searchsorted(run.keys, wanted, "left")
            hi = np.searchsorted(run.keys, wanted, "right")
            counts = hi - lo
            if not counts.any():
                continue
            starts = np.repeat(lo, counts)
            offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            idx = starts + offsets
            idx = idx[run.alive[idx] & self._file_alive[run.files[idx]]]
            entries.append((run, idx))
            files = run.files[idx]
            for file_id in np.unique(files):
                by_file.setdefault(int(file_id), []).append(run.positions[idx[files == file_id]])
        live_by_path = {f.path: f for f in live}
        deletes = tuple(
            FileDeletes(
                live_by_path[self._paths[i]],
                np.unique(np.concatenate(parts)).astype(np.uint64),
            )
            for i, parts in sorted(by_file.items())
        )
        return deletes, Found(tuple(entries))

    @staticmethod
    def forget(found: Found) -> None:
        """The rows ``found`` were deleted by a version that landed."""
        for run, idx in found.entries:
            run.alive[idx] = False
