"""The merge-on-read key index as a pure structure: random histories of files appearing,
rows being deleted and files being dropped, every lookup against a brute-force search of
the same files - through many run merges."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from rayconnect.write_modes.key_index import KeyIndex
from rayconnect.write_modes.row_delta import LiveFile


class Table:
    """Files of keys (a file never changes) and which of their rows are deleted."""

    def __init__(self) -> None:
        self.files: dict[str, pa.Table] = {}
        self.deleted: dict[str, set[int]] = {}
        self.reads = 0

    def add(self, name: str, keys: list[int | None]) -> None:
        self.files[name] = pa.table({"id": pa.array(keys, pa.int64())})
        self.deleted[name] = set()

    def live(self) -> list[LiveFile]:
        return [LiveFile(n, None, t.num_rows) for n, t in self.files.items()]

    def read_columns(self, f: LiveFile, columns: list[str]) -> pa.Table:
        self.reads += 1
        return self.files[f.path].select(columns)

    def holding(self, keys: set[int]) -> dict[str, set[int]]:
        """Live rows (not deleted) whose key is in ``keys``, by brute force."""
        out: dict[str, set[int]] = {}
        for name, t in self.files.items():
            for pos, key in enumerate(t.column("id").to_pylist()):
                if key in keys and pos not in self.deleted[name]:
                    out.setdefault(name, set()).add(pos)
        return out


def test_lookups_equal_a_brute_force_search_through_merges_and_dropped_files() -> None:
    rng = np.random.default_rng(3)
    table, index = Table(), KeyIndex("id", max_rows=1_000_000, background=False)
    for round_no in range(40):
        keys = sorted({int(k) for k in rng.integers(0, 500, 60)})
        assert index.sync(table.live(), table.read_columns)
        deletes, found = index.find(pa.array(keys), table.live())
        got = {d.file.path: set(d.positions.tolist()) for d in deletes}
        assert got == table.holding(set(keys)), f"round {round_no}"
        for d in deletes:  # the round lands: its rows are deleted ...
            table.deleted[d.file.path] |= set(d.positions.tolist())
        index.forget(found)
        new = [int(k) for k in keys if rng.random() < 0.8] + [None]  # ... its rows appended
        table.add(f"r{round_no}", new)
        if round_no % 9 == 8:  # a compaction or truncate drops the oldest file
            oldest = next(iter(table.files))
            del table.files[oldest], table.deleted[oldest]
    assert index.rows < 40 * 60  # deleted rows and dropped files were swept by merges


def test_the_first_build_runs_beside_the_rounds_which_search_without_it_meanwhile() -> None:
    table = Table()
    table.add("a", [1, 2, 3])
    index = KeyIndex("id", max_rows=1_000)
    assert not index.sync(table.live(), table.read_columns)  # started, not ready
    for _ in range(200):
        if index.sync(table.live(), table.read_columns):
            break
        time.sleep(0.01)
    assert index.ready
    table.add("b", [3, 4])  # not in the build's snapshot: read at the next sync
    assert index.sync(table.live(), table.read_columns)
    deletes, _ = index.find(pa.array([3]), table.live())
    assert {d.file.path: d.positions.tolist() for d in deletes} == {"a": [2], "b": [0]}


def test_keys_whose_rows_are_all_deleted_or_gone_find_nothing() -> None:
    table, index = Table(), KeyIndex("id", max_rows=1_000, background=False)
    table.add("a", [1, 2])
    table.add("b", [3])
    assert index.sync(table.live(), table.read_columns)
    _, found = index.find(pa.array([1]), table.live())
    index.forget(found)  # the round that deleted key 1's row landed
    del table.files["b"]  # and file b was compacted away
    assert index.sync(table.live(), table.read_columns)
    deletes, found = index.find(pa.array([1, 3]), table.live())
    assert deletes == () and found.entries == ()


def test_each_file_is_read_once() -> None:
    table, index = Table(), KeyIndex("id", max_rows=1_000, background=False)
    table.add("a", [1, 2, 3])
    assert index.sync(table.live(), table.read_columns)
    table.add("b", [4, 5])
    assert index.sync(table.live(), table.read_columns)
    assert index.sync(table.live(), table.read_columns)
    assert table.reads == 2


def test_a_table_beyond_max_rows_or_a_non_integer_key_is_not_indexed() -> None:
    table, index = Table(), KeyIndex("id", max_rows=4, background=False)
    table.add("a", [1, 2, 3])
    assert index.sync(table.live(), table.read_columns)
    table.add("b", [4, 5])
    assert not index.sync(table.live(), table.read_columns)
    assert not index.usable and index.rows == 0
    strings = Table()
    strings.files["s"] = pa.table({"id": pa.array(["x", "y"])})
    assert not KeyIndex("id", max_rows=100, background=False).sync(
        strings.live(), strings.read_columns
    )
