"""Where each key of a merge-on-read table lives, kept by the pipeline between rounds, so a
round's cost follows its changes, not the table.

Without it a round reads the key column of every live file whose statistics may hold one of
its keys - and when keys are spread at random (an update of any row of a busy database
table), every file holds some: the search costs the table (bench/results/merge-on-read).
Data files never change once written, so the key column of each is read once, when it first
appears among the live files, and kept as sorted runs of (key, file, row position) - 17
bytes a row with its alive flag. A round's lookup is a binary search of its keys in each
run.

- **Built in the background.** The first index of a table (at the pipeline's start, after a
  coordinator restart) reads every file's key column and sorts them in a thread of its own;
  rounds meanwhile search the files as without an index, so no round waits for it.
- **Brought in line with the table** by each round, on exactly the read the round commits
  on: files that appeared (the rounds' own, a compaction's, another writer's) are read into
  a new run; files gone (compacted away, dropped by a truncate) are marked dead. It is a
  cache of what the live files hold, never the truth.
- **Forgets** the rows a round deleted once its version landed. Rows deleted by anyone else
  (an outside DELETE, rounds searched without the index) stay in it and are deleted again
  by a round that changes their key - harmless in both formats.
- **Runs are merged** like timsort's: the newest two while the older is at most twice the
  newer, each merge one linear pass (no sort) that also sweeps dead entries; so a lookup
  searches O(log rows) runs and a merge into the largest run is rare.

Only a single integer key column is indexed (its values are the index keys), and a table of
at most ``max_rows`` rows, else the round searches the files as without an index.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.write_modes.row_delta import FileDeletes, LiveFile

ReadColumns = Callable[[LiveFile, list[str]], pa.Table]
#: files read at once while building (Parquet reads release the GIL)
_READERS = 4


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
    def sorted_from(cls, keys: np.ndarray, files: np.ndarray, positions: np.ndarray) -> _Run:
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], files[order], positions[order])

    def kept(self, file_alive: np.ndarray) -> _Run:
        """Without dead entries (rows deleted, files gone)."""
        keep = self.alive & file_alive[self.files]
        if keep.all():
            return self
        return _Run(self.keys[keep], self.files[keep], self.positions[keep])

    def merged_with(self, newer: _Run, file_alive: np.ndarray) -> _Run:
        """One run of both, dead entries swept: a linear merge of two sorted runs."""
        old, new = self.kept(file_alive), newer.kept(file_alive)
        at = np.searchsorted(old.keys, new.keys, "right")
        return _Run(
            np.insert(old.keys, at, new.keys),
            np.insert(old.files, at, new.files),
            np.insert(old.positions, at, new.positions),
        )


@dataclass(frozen=True)
class Found:
    """Entries a lookup matched, to forget once the round that deletes them landed."""

    entries: tuple[tuple[_Run, np.ndarray], ...] = ()


class KeyIndex:
    """The index of one table's single integer key column (module docstring). Used from
    one thread (the committer's); only its first build runs in another."""

    def __init__(self, column: str, max_rows: int, background: bool = True) -> None:
        self.column = column
        self.max_rows = max_rows
        self.background = background
        self._ids: dict[str, int] = {}
        self._paths: list[str] = []
        self._file_alive = np.zeros(0, dtype=bool)
        self._runs: list[_Run] = []
        self._rows = 0
        self._build: Future[_Run | None] | None = None
        self._built = False
        self.usable = max_rows > 0

    @property
    def rows(self) -> int:
        """Entries held (rows of live files, deleted ones until swept)."""
        return self._rows

    @property
    def ready(self) -> bool:
        """Installed: rounds look their keys up in it."""
        return self._built

    @property
    def building(self) -> bool:
        """The first build runs in its thread (the round after it ends installs it)."""
        return self._build is not None and not self._build.done()

    def sync(self, live: Sequence[LiveFile], read_columns: ReadColumns) -> bool:
        """Bring the index in line with ``live``: files gone are dead, new files read.
        False: not usable for this round (still being built, too many rows, not an integer
        key) - the round searches the files itself."""
        if not self.usable:
            return False
        if not self._built and not self._install_build(live, read_columns):
            return False
        wanted = {f.path for f in live}
        for path, i in self._ids.items():
            if path not in wanted:
                self._file_alive[i] = False
        new = [f for f in live if f.path not in self._ids and f.rows]
        if self._rows + sum(f.rows for f in new) > self.max_rows:
            return self._give_up()
        run = self._read_files(new, self._new_ids(new), read_columns)
        if run is None:
            return self._give_up()
        if len(run.keys):
            self._runs.append(run)
        self._merge_runs()
        return True

    def _install_build(self, live: Sequence[LiveFile], read_columns: ReadColumns) -> bool:
        """Start the first build (over ``live``), or install it once done."""
        if self._build is None:
            files = [f for f in live if f.rows]
            if sum(f.rows for f in files) > self.max_rows:
                return self._give_up()
            ids = self._new_ids(files)
            if not self.background:
                return self._installed(self._read_files(files, ids, read_columns))
            self._build = Future()
            build = self._build
            threading.Thread(
                target=lambda: _settle(build, lambda: self._read_files(files, ids, read_columns)),
                name="key-index-build",
                daemon=True,
            ).start()
            return False
        if not self._build.done():
            return False
        return self._installed(self._build.result())

    def _installed(self, run: _Run | None) -> bool:
        if run is None:
            return self._give_up()
        self._runs = [run] if len(run.keys) else []
        self._rows = len(run.keys)
        self._built = True
        return True

    def _give_up(self) -> bool:
        self.usable = False
        self._runs, self._ids, self._paths, self._rows = [], {}, [], 0
        return False

    def _read_files(
        self, files: Sequence[LiveFile], ids: list[int], read_columns: ReadColumns
    ) -> _Run | None:
        """One run of every row of ``files`` (``ids`` theirs; None: the key column is not
        an integer). Touches nothing of the index: the first build runs it in a thread."""
        if len(files) > 1:
            with ThreadPoolExecutor(min(_READERS, len(files))) as pool:
                columns = list(pool.map(lambda f: read_columns(f, [self.column]), files))
        else:
            columns = [read_columns(f, [self.column]) for f in files]
        keys, file_ids, positions = [], [], []
        for file_id, table in zip(ids, columns, strict=True):
            column = table.column(0)
            if not pa.types.is_integer(column.type):
                return None
            valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
            keys.append(column.to_numpy(zero_copy_only=False)[valid].astype(np.int64))
            positions.append(np.flatnonzero(valid).astype(np.uint32))
            file_ids.append(np.full(len(positions[-1]), file_id, np.int32))
        if not keys:
            return _Run(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.uint32))
        return _Run.sorted_from(
            np.concatenate(keys), np.concatenate(file_ids), np.concatenate(positions)
        )

    def _new_ids(self, files: Sequence[LiveFile]) -> list[int]:
        """Ids for ``files`` (new to the index), alive."""
        first = len(self._paths)
        for n, f in enumerate(files):
            self._ids[f.path] = first + n
            self._paths.append(f.path)
        self._file_alive = np.concatenate([self._file_alive, np.ones(len(files), dtype=bool)])
        return list(range(first, len(self._paths)))

    def _merge_runs(self) -> None:
        """Timsort's rule: merge the newest two while the older is at most twice the newer."""
        runs = self._runs
        while len(runs) >= 2 and len(runs[-2].keys) <= 2 * len(runs[-1].keys):
            newer = runs.pop()
            runs[-1] = runs[-1].merged_with(newer, self._file_alive)
        self._rows = sum(len(r.keys) for r in runs)

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
            if not len(idx):  # every match deleted already, or in a file gone
                continue
            entries.append((run, idx))
            order = np.argsort(run.files[idx], kind="stable")  # grouped by file, one pass
            files, positions = run.files[idx][order], run.positions[idx][order]
            ids, starts = np.unique(files, return_index=True)
            for file_id, part in zip(ids, np.split(positions, starts[1:]), strict=True):
                by_file.setdefault(int(file_id), []).append(part)
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


def _settle(future: Future[_Run | None], build: Callable[[], _Run | None]) -> None:
    try:
        future.set_result(build())
    except BaseException as exc:  # the round that installs it raises it
        future.set_exception(exc)
