"""Merge-on-read vs copy-on-write upserts (issue 37): the cost of one round by table size,
and what merge-on-read costs a full scan.

    .venv/bin/python bench/merge_on_read.py [--rows 1000000,10000000,50000000] [--repeats 4]
        [--file-rows 250000] [--changes 100000] [--cow-max-rows 10000000]
        [--only round,scan] [--kinds iceberg,delta] [--scan-rounds 20] [--profile]

**round**: a keyed table of ``--rows`` rows (``id`` int64 and the narrow row of
``upsert_throughput._rows``: ~60 B, plus the ``_kafka_*`` columns), in Parquet files of
``--file-rows`` rows whose keys are a random permutation (every file spans the whole key
range, as a table after many upserts does: no file can be skipped by its statistics). The
files are written once per size with pyarrow, hard-linked into each table's ``staging/``
folder and committed as ONE append through the table's committer (its write mode set to
append for that commit only): the same table for every kind and mode, built outside the
timing. Then ``--repeats`` (4) consecutive rounds on that table, each ``--changes`` random-key
changes (70% updates of live keys, 20% inserts of new keys, 10% deletes of live keys), each
staged as one change file (as the writers stage it) and committed through the real
committer (``TableCommitter.commit``: what the coordinator runs), the SAME committer object
(and write mode) for every round of a table - the key index lives in it (checked: a cell
fails if either changes). Timed: ``commit`` alone. Three modes per kind: merge-on-read with
the key index (the defaults: ``write_modes.key_index``, Iceberg position delete files /
Delta deletion vectors), merge-on-read with ``key_index_rows=0`` (every round reads every
live file's key column) and copy-on-write (Iceberg delete + append, Delta one delta-rs
MERGE; skipped above ``--cow-max-rows``). The load commits as an append, so the FIRST round
of the index mode builds the index (reads every file's key column, sorts): reported apart
(``build``), and the ``steady`` figure is the median of the following rounds.
Reported per cell: first and steady round (and every round), the index's entries (x 16 B)
and the process's RSS (growth over the rounds, peak in the 1st), the files and bytes the round
wrote
(the table folder before and after: data files, delete files / DV files; metadata and log
apart), the data files it removed from the table, the rows it rewrote (rows of its new data
files minus the round's upserted rows), and the table checked (rows and distinct keys =
the model) after the last round. The merge-on-read round's time by phase (timers wrapped
around the committer's steps in this process: fold, live files, key search and its key
column reads, index sync/find, delete/data file writes, snapshot, catalog commit), first
round and steady median; ``--profile``: cProfile of one more round of each merge-on-read
mode at the largest size.

**scan**: ``--scan-rounds`` (20) rounds of the same changes into a merge-on-read and a
copy-on-write table of ``--scan-rows`` (1M) rows; then a full scan of each (pyiceberg
``scan().to_arrow()``; delta-rs ``QueryBuilder``, ``SELECT *``; a warm-up, then the median of
5), merge-on-read
over copy-on-write (issue target <= 1.5x). Then the merge-on-read table's upkeep compaction
(``open_upkeep(sink, "p", fmt).compact()``: Iceberg folds the deletes into the data files,
``FoldDeletes(min_deleted_fraction=0.05, max_files=1000)``; Delta runs delta-rs OPTIMIZE)
and both tables scanned again, alternating: the ratio after folding (target <= 1.1x). Both tables are
checked equal (id, amount, version) before and after.

Machine guard: the run stops (KeyboardInterrupt) if the machine's used memory passes
``--max-used-gib`` (18). Prints a markdown table; writes ``results/merge-on-read/results.md``,
``results.json`` and ``round.png`` (scenarios not run keep their last results).
"""

from __future__ import annotations

import _thread
import argparse
import cProfile
import gc
import inspect
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from upsert_throughput import _rows  # noqa: E402  (the narrow row of the upsert bench)

RESULTS = Path(__file__).resolve().parent / "results" / "merge-on-read"
#: the value columns of ``upsert_throughput._rows``
VALUE_SCHEMA = {
    "id": "long",
    "name": "string",
    "amount": "long",
    "price": "double",
    "country": "string",
    "paid": "boolean",
    "version": "long",
}
CLUSTER, TOPIC, PARTITIONS = "bench", "changes", 8
KINDS = ("iceberg", "delta")
MODES = ("merge_on_read", "merge_on_read_no_index", "copy_on_write")
MOR_MODES = MODES[:2]
MODE_LABEL = {
    "merge_on_read": "merge_on_read",
    "merge_on_read_no_index": "merge_on_read, key_index_rows=0",
    "copy_on_write": "copy_on_write",
}
#: the issue's figure: a random round of 100k changes, delta-rs MERGE, 50M rows
ISSUE_DELTA_COW_50M_S = 68.5
TARGET_MOR_50M_S = 3.0
TARGET_GROWTH = 1.5
TARGET_SCAN = 1.5
TARGET_SCAN_FOLDED = 1.1
#: bytes an index entry is counted at (key 8, file 4, position 4; the alive flag apart)
INDEX_ENTRY_BYTES = 16
#: full scans a table, after a warm-up one (their median is reported)
SCAN_REPEATS = 5


# --------------------------------------------------------------------------------------
# rows and changes
# --------------------------------------------------------------------------------------


def table_rows(ids: np.ndarray, version: int, first_offset: int, schema: pa.Schema) -> pa.Table:
    """``upsert_throughput._rows`` with the ``_kafka_*`` columns a pipeline's rows carry,
    in the table's column order (offsets ascend from ``first_offset``)."""
    rows = _rows(ids, version)
    n = rows.num_rows
    offsets = pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64))
    rows = rows.set_column(rows.schema.get_field_index("_kafka_offset"), "_kafka_offset", offsets)
    rows = rows.append_column("_kafka_cluster", pa.array([CLUSTER] * n))
    rows = rows.append_column("_kafka_topic", pa.array([TOPIC] * n))
    stamps = pa.array(np.full(n, 1_700_000_000_000_000 + version, dtype=np.int64))
    rows = rows.append_column("_kafka_timestamp", stamps.cast(pa.timestamp("us", tz="UTC")))
    return rows.select(schema.names).cast(schema)


class Changes:
    """Rounds of random-key changes against a model of the table's live keys: updates and
    deletes pick live keys (any key below ``next_id`` not deleted), inserts take new ids."""

    def __init__(self, rows: int, n: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.n = n
        self.next_id = rows
        self.deleted = np.empty(0, dtype=np.int64)
        self.round = 0
        self.offset = rows  # the load's offsets are 0 .. rows - 1

    @property
    def live(self) -> int:
        return self.next_id - len(self.deleted)

    def next(self, schema: pa.Schema) -> tuple[pa.Table, dict[str, int]]:
        """The round's change rows (with ``DELETE_COLUMN``) and its counts."""
        from rayconnect.write_modes.fold import DELETE_COLUMN

        self.round += 1
        updates, deletes = int(self.n * 0.7), int(self.n * 0.1)
        inserts = self.n - updates - deletes
        picked = np.empty(0, dtype=np.int64)
        while len(picked) < updates + deletes:  # live keys: drop the deleted ones
            draw = self.rng.choice(self.next_id, int((updates + deletes) * 1.1), replace=False)
            picked = np.unique(np.concatenate([picked, draw[~np.isin(draw, self.deleted)]]))
        picked = self.rng.permutation(picked)[: updates + deletes]
        gone = picked[updates:]
        new = np.arange(self.next_id, self.next_id + inserts, dtype=np.int64)
        ids = np.concatenate([picked, new])
        self.rng.shuffle(ids)
        rows = table_rows(ids, self.round, self.offset, schema)
        rows = rows.append_column(DELETE_COLUMN, pa.array(np.isin(ids, gone)))
        self.offset += len(ids)
        self.next_id += inserts
        self.deleted = np.concatenate([self.deleted, gone])
        return rows, {"updates": updates, "inserts": inserts, "deletes": deletes}

    def offsets(self) -> dict[str, int]:
        """Every partition's next offset (one counter for all: they only have to grow)."""
        return {f"{CLUSTER}/{TOPIC}/{p}": self.offset for p in range(PARTITIONS)}


def build_source(rows: int, file_rows: int, folder: Path, schema: pa.Schema, seed: int) -> dict:
    """The loaded table's files: ids 0..rows-1 permuted, ``file_rows`` a file, written in
    chunks (only the permutation is held: 8 B a row)."""
    folder.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    perm = np.random.default_rng(seed).permutation(rows).astype(np.int64)
    paths = []
    for i, start in enumerate(range(0, rows, file_rows)):
        path = folder / f"load-{i:05d}.parquet"
        pq.write_table(table_rows(perm[start : start + file_rows], 0, start, schema), path)
        paths.append(path)
    del perm
    size = sum(p.stat().st_size for p in paths)
    return {"paths": paths, "bytes": size, "build_s": time.monotonic() - t}


# --------------------------------------------------------------------------------------
# timers around the committer's steps
# --------------------------------------------------------------------------------------


class Phases:
    """Seconds per labelled step, summed until ``take``; threads add up (a sum of threads'
    wall time can exceed the round)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.patched: list[tuple[Any, str, Any]] = []

    def add(self, label: str, seconds: float) -> None:
        with self.lock:
            self.seconds[label] += seconds
            self.calls[label] += 1

    def wrap(self, owner: Any, attr: str, label: str, materialize: bool = False) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return
        static = isinstance(inspect.getattr_static(owner, attr, None), staticmethod)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                out = original(*args, **kwargs)
                return list(out) if materialize else out
            finally:
                self.add(label, time.perf_counter() - t)

        setattr(owner, attr, staticmethod(timed) if static else timed)
        self.patched.append((owner, attr, original))

    def take(self) -> dict[str, float]:
        with self.lock:
            out = {k: round(v, 4) for k, v in self.seconds.items()}
            self.seconds.clear()
            self.calls.clear()
        return out

    def install(self) -> None:
        """The steps of ``TableCommitter.commit`` and of each format's write (whatever of
        them exists in this tree: the Delta merge-on-read path is being built)."""
        import pyiceberg.io.pyarrow as pyiceberg_arrow
        from pyiceberg.table import Transaction

        from rayconnect.tables import delta, iceberg, iceberg_row_delta
        from rayconnect.write_modes import modes, row_delta

        for cls in (iceberg.IcebergCommitter, delta.DeltaCommitter):
            self.wrap(cls, "_snapshot", "read table")
            self.wrap(cls, "_grow", "check files")
            self.wrap(cls, "live_files", "live files")
            self.wrap(cls, "_discard", "discard staged")
            self.wrap(cls, "_after_commit", "after commit")
        self.wrap(row_delta.ColumnReader, "__call__", "read key columns (sum of threads)")
        self.wrap(modes, "_fold_staged", "read staged + fold")
        self.wrap(modes, "find_deletes", "key search")
        from rayconnect.write_modes.key_index import KeyIndex

        self.wrap(KeyIndex, "sync", "index sync")
        self.wrap(KeyIndex, "_run_of", "index: read + sort a new file")
        self.wrap(KeyIndex, "_compact", "index: merge runs")
        self.wrap(KeyIndex, "find", "index find")
        self.wrap(KeyIndex, "forget", "index forget")
        self.wrap(iceberg, "row_delta", "iceberg: row delta (files + manifests)")
        self.wrap(iceberg, "upsert_round", "iceberg: copy-on-write delete + append")
        self.wrap(iceberg_row_delta, "_write_delete_file", "iceberg: write delete files")
        self.wrap(pyiceberg_arrow, "_dataframe_to_data_files", "iceberg: write data files", True)
        self.wrap(Transaction, "commit_transaction", "iceberg: catalog commit")
        self.wrap(delta.DeltaCommitter, "_merge", "delta: MERGE")
        try:
            from rayconnect.tables import delta_row_delta
        except Exception:  # noqa: BLE001  (being built)
            return
        for name in ("commit_row_delta", "_write_rows", "_dv_actions", "_put_if_absent"):
            self.wrap(delta_row_delta, name, f"delta: {name}")
            if hasattr(delta, name):
                self.wrap(delta, name, f"delta: {name}")


PHASES = Phases()
PROCESS = psutil.Process()


# --------------------------------------------------------------------------------------
# one table: a kind, a mode, its committer
# --------------------------------------------------------------------------------------


def record_format() -> Any:
    from rayconnect.formats.settings import RecordFormat

    return RecordFormat(value_format="json", value_schema=VALUE_SCHEMA, upsert_keys=("id",))


@dataclass
class Table:
    kind: str
    mode: str
    root: Path
    committer: Any = None
    sink: Any = None
    note: str = ""
    expected: dict[str, int | None] = field(default_factory=dict)

    def open(self) -> None:
        """The sink (``self.mode``: a ``MODES`` entry) and its committer, made once: every
        round of the table commits through this same object (the key index lives in it)."""
        import rayconnect as rc
        from rayconnect.protocol.upkeep import FoldDeletes
        from rayconnect.tables.factory import open_committer

        fmt = record_format()
        mor = self.mode.startswith("merge_on_read")
        common: dict[str, Any] = dict(
            write_mode="upsert",
            key_columns=("id",),
            upsert_mode="merge_on_read" if mor else "copy_on_write",
        )
        if self.mode == "merge_on_read_no_index":
            common["key_index_rows"] = 0
        if self.kind == "iceberg":
            fold = FoldDeletes(min_deleted_fraction=0.05, max_files=1000)
            sink = rc.IcebergSink(
                "bench.t", warehouse=str(self.root / "warehouse"), fold_deletes=fold, **common
            )
        else:
            sink = rc.DeltaSink(str(self.root / "table"), **common)
        self.sink = sink
        self.committer = open_committer(sink, "p", fmt)
        self.committer.ensure_table()
        self.expected = {f"{CLUSTER}/{TOPIC}/{p}": None for p in range(PARTITIONS)}

    @property
    def folder(self) -> str:
        return self.committer.location.path("")

    @property
    def index(self) -> Any:
        """The merge-on-read key index the committer holds (None: copy-on-write)."""
        return getattr(self.committer.apply, "index", None)

    def live_counts(self) -> dict[str, int]:
        """Live data files and the delete / deletion-vector files they carry."""
        if self.kind == "iceberg":
            tasks = list(self.committer._snapshot().scan().plan_files())
            deletes = {d.file_path for t in tasks for d in t.delete_files}
            return {"data": len(tasks), "deletes": len(deletes)}
        # delta-rs's add actions have no deletion vectors: the committer's own replay
        live = self.committer.live_files(self.committer._snapshot())
        return {"data": len(live), "deletes": sum("deletionVector" in f.entry for f in live)}

    def stage(self, rows: pa.Table) -> list:
        from rayconnect.tables.files import STAGING_DIR, describe_file

        c = self.committer
        rel = f"{STAGING_DIR}/{uuid.uuid4().hex}.parquet"
        c.filesystem.create_dir(c.location.path(STAGING_DIR), recursive=True)
        pq.write_table(rows, c.location.path(rel), filesystem=c.filesystem)
        return [describe_file(c.location, rel, c.filesystem)[0]]

    def load(self, source: list[Path], offsets: dict[str, int]) -> float:
        """The source files hard-linked into staging/ and committed as one append."""
        from rayconnect.tables.files import STAGING_DIR, describe_file
        from rayconnect.write_modes.modes import APPEND

        c = self.committer
        staging = Path(c.location.path(STAGING_DIR))
        staging.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        files = []
        for p in source:
            os.link(p, staging / p.name)
            files.append(describe_file(c.location, f"{STAGING_DIR}/{p.name}", c.filesystem)[0])
        apply, c.apply = c.apply, APPEND
        try:
            self.commit(files, offsets)
        finally:
            c.apply = apply
        return time.monotonic() - t

    def commit(self, files: list, offsets: dict[str, int]) -> float:
        t = time.perf_counter()
        self.committer.commit(files, offsets, self.expected)
        seconds = time.perf_counter() - t
        self.expected = dict(offsets)
        return seconds

    def disk(self) -> dict[str, int]:
        out = {}
        for folder, _, names in os.walk(self.folder):
            for name in names:
                path = os.path.join(folder, name)
                out[path] = os.path.getsize(path)
        return out

    def classify(self, path: str) -> str:
        rel = os.path.relpath(path, self.folder)
        name = os.path.basename(path)
        if rel.startswith(("metadata", "_delta_log")) or name.endswith((".json", ".crc")):
            return "metadata"
        if name.startswith("deletion_vector") or (
            self.kind == "iceberg" and name.startswith("delete-")
        ):
            return "deletes"
        return "data" if name.endswith(".parquet") else "other"

    def live_data_files(self) -> set[str]:
        if self.kind == "iceberg":
            c = self.committer
            return {f.path for f in c.live_files(c._snapshot())}
        from deltalake import DeltaTable

        adds = DeltaTable(self.folder).get_add_actions(flatten=True)
        return {self.committer.location.path(p) for p in adds.column("path").to_pylist()}

    def check(self, model: Changes) -> dict[str, Any]:
        """Rows and distinct keys equal the model's live keys."""
        t = time.monotonic()
        if self.kind == "iceberg":
            ids = self.committer._snapshot().scan(selected_fields=("id",)).to_arrow()["id"]
            rows, distinct = len(ids), pc.count_distinct(ids).as_py()
            del ids
        else:
            from deltalake import DeltaTable, QueryBuilder

            got = (
                QueryBuilder()
                .register("t", DeltaTable(self.folder))
                .execute("SELECT count(*) AS n, count(DISTINCT id) AS d FROM t")
                .read_all()
            )
            rows, distinct = got["n"][0].as_py(), got["d"][0].as_py()
        ok = rows == distinct == model.live
        return {"rows": rows, "distinct": distinct, "model": model.live, "ok": ok,
                "check_s": round(time.monotonic() - t, 2)}  # fmt: skip


def round_once(table: Table, model: Changes) -> dict[str, Any]:
    """One round: staged, committed (timed), and what it wrote."""
    rows, counts = model.next(table.committer.schema)
    files = table.stage(rows)
    del rows
    before, live_before = table.disk(), table.live_data_files()
    PHASES.take()
    seconds = table.commit(files, model.offsets())
    phases = PHASES.take()
    rss = PROCESS.memory_info().rss
    index = table.index
    after, live_after = table.disk(), table.live_data_files()
    written: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    new_data_rows = positions = 0
    for path in set(after) - set(before):
        kind = table.classify(path)
        written[kind][0] += 1
        written[kind][1] += after[path]
        if kind == "data":
            new_data_rows += pq.read_metadata(path).num_rows
        elif kind == "deletes" and path.endswith(".parquet"):
            positions += pq.read_metadata(path).num_rows
    upserted = counts["updates"] + counts["inserts"]
    return {
        "seconds": seconds,
        "phases": phases,
        "written": dict(written),
        "files_removed": len(live_before - live_after),
        "new_data_rows": new_data_rows,
        "rows_rewritten": new_data_rows - upserted,
        "positions_deleted": positions if table.kind == "iceberg" else None,
        "live_files_after": len(live_after),
        "load": os.getloadavg()[0],
        "mem_used_gib": psutil.virtual_memory().used / 2**30,
        "rss_mb": rss / 1e6,
        "committer_id": id(table.committer),
        "apply_id": id(table.committer.apply),
        "index_rows": index.rows if index is not None else None,
        "index_ready": index.ready if index is not None else None,
        "index_usable": index.usable if index is not None else None,
        "index_array_bytes": _index_bytes(index),
    }


def wait_for_index_build(index: Any) -> float | None:
    """Seconds the index's first build still ran after the first round (None: no index)."""
    if index is None:
        return None
    t = time.monotonic()
    while index.building:
        time.sleep(0.05)
    return time.monotonic() - t


def _index_bytes(index: Any) -> int | None:
    """What the index's arrays hold (its runs: keys, files, positions, alive flags)."""
    if index is None:
        return None
    runs = getattr(index, "_runs", [])
    arrays = ("keys", "files", "positions", "alive")
    return int(sum(getattr(r, a).nbytes for r in runs for a in arrays))


def _error(exc: BaseException) -> dict[str, Any]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"error": f"{type(exc).__name__}: {exc}"[:500], "traceback": "".join(tb)[-4000:]}


# --------------------------------------------------------------------------------------
# memory guard
# --------------------------------------------------------------------------------------


class MemoryGuard:
    """Interrupts the run when the machine's used memory passes ``limit_gib`` (no swap
    here: the OOM killer would pick some process); keeps the peak."""

    def __init__(self, limit_gib: float) -> None:
        self.limit = limit_gib * 2**30
        self.peak = 0
        self.rss_peak = 0
        self.tripped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            used = psutil.virtual_memory().used
            self.peak = max(self.peak, used)
            self.rss_peak = max(self.rss_peak, PROCESS.memory_info().rss)
            if used > self.limit and not self.tripped:
                self.tripped = True
                print(f"memory guard: {used / 2**30:.1f} GiB used: stopping", file=sys.stderr)
                _thread.interrupt_main()

    def reset(self) -> float:
        peak, self.peak = self.peak, psutil.virtual_memory().used
        return peak / 2**30

    def reset_rss(self) -> float:
        """The bench process's peak RSS (MB, sampled every 0.2 s) since the last call."""
        peak, self.rss_peak = self.rss_peak, PROCESS.memory_info().rss
        return max(peak, self.rss_peak) / 1e6

    def __enter__(self) -> MemoryGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


# --------------------------------------------------------------------------------------
# round
# --------------------------------------------------------------------------------------


def run_cell(
    a: argparse.Namespace, kind: str, mode: str, rows: int, source: dict, work: Path,
    guard: MemoryGuard, profile: bool,
) -> dict[str, Any]:  # fmt: skip
    table = Table(kind, mode, work / f"{kind}-{mode}-{rows}")
    out: dict[str, Any] = {"kind": kind, "mode": mode, "table_rows": rows,
                           "table_files": len(source["paths"]), "table_mb": source["bytes"] / 1e6}  # fmt: skip
    guard.reset()
    try:
        table.open()
        model = Changes(rows, a.changes, seed=rows)
        out["load_s"] = table.load(source["paths"], model.offsets())
        gc.collect()
        out["rss_before_mb"] = PROCESS.memory_info().rss / 1e6
        guard.reset_rss()
        rounds = []
        for n in range(a.repeats):
            rounds.append(round_once(table, model))
            r = rounds[-1]
            if n == 0:  # the index builds in a thread beside the rounds: how long
                out["build_wait_s"] = wait_for_index_build(table.index)
            r["peak_rss_mb"] = guard.reset_rss()
            idx = f", index {r['index_rows']:,} rows" if r["index_rows"] is not None else ""
            print(f"  {kind} {mode} {rows:,}: round {r['seconds']:.2f} s, wrote "
                  f"{ {k: v for k, v in r['written'].items()} }, removed {r['files_removed']}, "
                  f"rewrote {r['rows_rewritten']:,} rows{idx}, rss {r['rss_mb']:.0f} MB, "
                  f"used {r['mem_used_gib']:.1f} GiB", file=sys.stderr)  # fmt: skip
        same = {(r["committer_id"], r["apply_id"]) for r in rounds}
        if len(same) != 1:
            raise AssertionError(f"the committer or its write mode changed between rounds: {same}")
        out["same_committer"] = True
        out["rounds"] = rounds
        out["build_s"] = rounds[0]["seconds"]
        steady = rounds[1:] or rounds
        out["round_s"] = statistics.median(r["seconds"] for r in steady)  # the steady state
        last = rounds[-1]
        out["index_rows"] = last["index_rows"]
        if last["index_rows"] is not None:
            out["index_mb"] = last["index_rows"] * INDEX_ENTRY_BYTES / 1e6
            out["index_usable"] = last["index_usable"]
        out["rss_growth_build_mb"] = rounds[0]["rss_mb"] - out["rss_before_mb"]
        out["rss_growth_mb"] = last["rss_mb"] - out["rss_before_mb"]
        out["check"] = table.check(model)
        if profile:
            out["profile"] = profile_round(table, model, a.out)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001  (Delta merge-on-read: being built)
        out.update(_error(exc))
        print(f"  {kind} {mode} {rows:,}: FAILED {out['error']}", file=sys.stderr)
    finally:
        out["note"] = table.note
        out["peak_used_gib"] = guard.reset()
        shutil.rmtree(table.root, ignore_errors=True)
    return out


def profile_round(table: Table, model: Changes, out_dir: str) -> str:
    """cProfile of one more round (not in the median): the main thread's functions by
    cumulative time (the key search's file reads run in its thread pool: see the timers)."""
    rows, _ = model.next(table.committer.schema)
    files = table.stage(rows)
    profiler = cProfile.Profile()
    profiler.enable()
    table.commit(files, model.offsets())
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    path = Path(out_dir) / f"profile-{table.kind}-{table.mode}-{model.next_id // 1_000_000}M.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())
    return str(path)


def run_round(a: argparse.Namespace, work: Path, guard: MemoryGuard) -> list[dict[str, Any]]:
    schema = Table("iceberg", "merge_on_read", work / "schema")
    schema.open()
    table_schema = schema.committer.schema
    shutil.rmtree(schema.root, ignore_errors=True)
    out = []
    for rows in a.rows:
        source = build_source(rows, a.file_rows, work / f"source-{rows}", table_schema, seed=1)
        print(f"{rows:,} rows: {len(source['paths'])} files, {source['bytes'] / 1e6:.0f} MB, "
              f"built in {source['build_s']:.0f} s", file=sys.stderr)  # fmt: skip
        for kind in a.kinds:
            for mode in MODES:
                if mode == "copy_on_write" and rows > a.cow_max_rows:
                    out.append({"kind": kind, "mode": mode, "table_rows": rows,
                                "skipped": f"copy-on-write above --cow-max-rows {a.cow_max_rows:,}"})  # fmt: skip
                    continue
                profile = a.profile and mode in MOR_MODES and rows == max(a.rows)
                out.append(run_cell(a, kind, mode, rows, source, work, guard, profile))
        shutil.rmtree(work / f"source-{rows}", ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------
# scan
# --------------------------------------------------------------------------------------


def full_scan(table: Table) -> pa.Table:
    if table.kind == "iceberg":
        return table.committer._snapshot().scan().to_arrow()
    from deltalake import DeltaTable, QueryBuilder

    query = QueryBuilder().register("t", DeltaTable(table.folder))
    return pa.table(query.execute("SELECT * FROM t").read_all())  # arro3 -> pyarrow, no copy


def scan_pair(tables: list[Table]) -> tuple[list[list[float]], list[pa.Table]]:
    """A warm-up scan of each table, then ``SCAN_REPEATS`` scans of each, alternating (so
    both see the same machine): every table's seconds and its last scan's rows."""
    for table in tables:
        full_scan(table)
    seconds: list[list[float]] = [[] for _ in tables]
    got: list[pa.Table] = [pa.table({}) for _ in tables]
    for _ in range(SCAN_REPEATS):
        for i, table in enumerate(tables):
            t = time.perf_counter()
            got[i] = full_scan(table)
            seconds[i].append(time.perf_counter() - t)
    return seconds, got


def _plain(value: Any) -> Any:
    """An upkeep's metrics as JSON (delta-rs returns nested dicts of numbers)."""
    return json.loads(json.dumps(value, default=str))


def run_scan(a: argparse.Namespace, work: Path, guard: MemoryGuard) -> list[dict[str, Any]]:
    """Per kind: merge-on-read (the defaults) and copy-on-write tables, the same rounds,
    scanned; then the merge-on-read table's deletes folded (upkeep compaction) and both
    scanned again."""
    from rayconnect.tables.factory import open_upkeep

    schema = Table("iceberg", "merge_on_read", work / "schema")
    schema.open()
    table_schema = schema.committer.schema
    shutil.rmtree(schema.root, ignore_errors=True)
    rows = a.scan_rows
    source = build_source(rows, a.file_rows, work / f"scan-source-{rows}", table_schema, seed=2)
    scan_modes = ("merge_on_read", "copy_on_write")
    out = []
    for kind in a.kinds:
        r: dict[str, Any] = {"kind": kind, "table_rows": rows, "rounds": a.scan_rounds}
        tables = {mode: Table(kind, mode, work / f"scan-{kind}-{mode}") for mode in scan_modes}
        models: dict[str, Changes] = {}
        contents: dict[str, pa.Table] = {}
        try:
            for mode, table in tables.items():
                m: dict[str, Any] = {}
                r[mode] = m
                try:
                    table.open()
                    model = models[mode] = Changes(rows, a.changes, seed=7)
                    table.load(source["paths"], model.offsets())
                    times = []
                    for _ in range(a.scan_rounds):
                        changes, _ = model.next(table.committer.schema)
                        times.append(table.commit(table.stage(changes), model.offsets()))
                    m["round_s_median"] = statistics.median(times)
                    m["files"] = defaultdict(int)
                    for path in table.disk():
                        m["files"][table.classify(path)] += 1
                    m["files"] = dict(m["files"])
                    m["live"] = table.live_counts()
                    (m["scan_s_all"],), (got,) = scan_pair([table])
                    m["scan_s"] = statistics.median(m["scan_s_all"])
                    m["scan_rows"] = got.num_rows
                    m["rows_ok"] = got.num_rows == model.live
                    contents[mode] = got.select(["id", "amount", "version"]).sort_by("id")
                    del got
                    print(f"  scan {kind} {mode}: {m['scan_s']:.2f} s, live {m['live']}",
                          file=sys.stderr)  # fmt: skip
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # noqa: BLE001
                    m.update(_error(exc))
                    print(f"  scan {kind} {mode}: FAILED {m['error']}", file=sys.stderr)
                finally:
                    m["note"] = tables[mode].note
            if len(contents) == 2:
                r["equal"] = contents["merge_on_read"].equals(contents["copy_on_write"])
                r["ratio"] = r["merge_on_read"]["scan_s"] / r["copy_on_write"]["scan_s"]
                r["folded"] = fold_and_scan(tables, models, contents, open_upkeep)
        finally:
            for table in tables.values():
                shutil.rmtree(table.root, ignore_errors=True)
        r["peak_used_gib"] = guard.reset()
        out.append(r)
    shutil.rmtree(work / f"scan-source-{rows}", ignore_errors=True)
    return out


def fold_and_scan(
    tables: dict[str, Table], models: dict[str, Changes], contents: dict[str, pa.Table],
    open_upkeep: Any,
) -> dict[str, Any]:  # fmt: skip
    """The merge-on-read table's upkeep compaction, then both tables scanned again."""
    mor, cow = tables["merge_on_read"], tables["copy_on_write"]
    f: dict[str, Any] = {}
    try:
        upkeep = open_upkeep(mor.sink, "p", record_format())
        t = time.perf_counter()
        f["metrics"] = _plain(upkeep.compact())
        f["compact_s"] = time.perf_counter() - t
        f["live"] = mor.live_counts()
        (f["mor_scan_s_all"], f["cow_scan_s_all"]), (got, _) = scan_pair([mor, cow])
        f["mor_scan_s"] = statistics.median(f["mor_scan_s_all"])
        f["cow_scan_s"] = statistics.median(f["cow_scan_s_all"])
        f["ratio"] = f["mor_scan_s"] / f["cow_scan_s"]
        f["rows_ok"] = got.num_rows == models["merge_on_read"].live
        f["equal"] = (
            got.select(["id", "amount", "version"]).sort_by("id").equals(contents["copy_on_write"])
        )
        print(f"  scan {mor.kind} after folding ({f['compact_s']:.2f} s, live {f['live']}): "
              f"MOR {f['mor_scan_s']:.2f} s, COW {f['cow_scan_s']:.2f} s, equal {f['equal']}",
              file=sys.stderr)  # fmt: skip
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001
        f.update(_error(exc))
        print(f"  scan {mor.kind} folding: FAILED {f['error']}", file=sys.stderr)
    return f


# --------------------------------------------------------------------------------------
# the table and the plot
# --------------------------------------------------------------------------------------


def _mb(pair: list[int] | None) -> str:
    return f"{pair[0]} / {pair[1] / 1e6:.2f} MB" if pair else "0"


def _cell(r: dict[str, Any]) -> str:
    return "skipped" if r.get("skipped") else "FAILED" if r.get("error") else ""


def targets(rounds: list[dict[str, Any]]) -> list[str]:
    """The issue's targets on the steady-state medians, per kind and merge-on-read mode."""
    lines = []
    for kind in KINDS:
        for mode in MOR_MODES:
            mor = {r["table_rows"]: r["round_s"] for r in rounds
                   if r["kind"] == kind and r["mode"] == mode and "round_s" in r}  # fmt: skip
            if not mor:
                continue
            big, small = max(mor), min(mor)
            name = f"{kind} {MODE_LABEL[mode]}"
            if big >= 50_000_000:
                ok = "met" if mor[big] <= TARGET_MOR_50M_S else "NO"
                lines.append(f"- {name}: steady round at {big / 1e6:g}M {mor[big]:.2f} s "
                             f"(target <= {TARGET_MOR_50M_S:g} s: {ok})")  # fmt: skip
            if big > small:
                growth = mor[big] / mor[small]
                ok = "met" if growth <= TARGET_GROWTH else "NO"
                lines.append(f"- {name}: steady {big / 1e6:g}M / {small / 1e6:g}M "
                             f"{growth:.2f}x (target <= {TARGET_GROWTH:g}x: {ok})")  # fmt: skip
    return lines


def _peak(r: dict[str, Any]) -> str:
    peak = r["rounds"][0].get("peak_rss_mb")
    return f"{peak - r['rss_before_mb']:+.0f}" if peak is not None else ""


def _steady(r: dict[str, Any], key: str) -> float:
    steady = r["rounds"][1:] or r["rounds"]
    return statistics.median(x["phases"].get(key, 0.0) for x in steady)


def round_markdown(res: dict[str, Any], rounds: list[dict[str, Any]]) -> list[str]:
    repeats = max((len(r.get("rounds", [])) for r in rounds), default=0)
    lines = [
        f"### One round of {res['settings']['changes']:,} random-key changes (70% updates, "
        "20% inserts, 10% deletes) through the committer",
        "",
        f"Run {res['round_at']}. Table: files of {res['settings']['file_rows']:,} rows, keys "
        "spread at random over them. Seconds: `TableCommitter.commit` of the round; "
        f"{repeats} consecutive rounds on the same table through the same committer object. "
        "**1st**: the first round (merge-on-read with the index: its first build starts in a "
        "thread of its own, every file's key column read and sorted, while the round searches "
        "the files without it; 'build after' = how long that build still ran after the "
        "1st round, which the bench waits for); **steady**: median of rounds "
        f"2-{repeats}. Index: "
        f"entries after the last round x {INDEX_ENTRY_BYTES} B; RSS: the bench process's, "
        "over its RSS before the 1st round: after the 1st / after the last round, and its "
        "peak during the 1st (sampled every 0.2 s; allocator-retained memory counts, and "
        "earlier tables' leftovers can make it negative).",
        "",
        "| table rows | files | kind | mode | 1st round s (build after) | steady s (median) | rounds s | "
        "index entries / MB | RSS MB: +1st / +last / 1st peak | data files written / MB | "
        "delete or DV files / MB | files removed | rows rewritten | positions deleted | "
        "table ok | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        head = (
            f"| {r['table_rows']:,} | {r.get('table_files', '')} | {r['kind']} | "
            f"{MODE_LABEL.get(r['mode'], r['mode'])} "
        )
        status = _cell(r)
        if status:
            why = r.get("skipped") or r.get("error", "")
            lines.append(f"{head}| {status} | {why[:160]} |" + " |" * 10)
            continue
        last = r["rounds"][-1]
        each = ", ".join(f"{x['seconds']:.2f}" for x in r["rounds"])
        pos = [x["positions_deleted"] for x in r["rounds"]]
        index = (
            f"{r['index_rows']:,} / {r['index_mb']:.0f}" if r.get("index_rows") is not None else ""
        )
        if r["mode"] == "merge_on_read_no_index":
            index = "off"
        elif r.get("index_rows") is not None and not r.get("index_usable", True):
            index += " (gave up)"
        after = r.get("build_wait_s") if r["mode"] == "merge_on_read" else None
        first = f"{r['build_s']:.2f}" + (f" ({after:.1f})" if after is not None else "")
        lines.append(
            f"{head}| {first} | **{r['round_s']:.2f}** | {each} | {index} | "
            f"{r['rss_growth_build_mb']:+.0f} / {r['rss_growth_mb']:+.0f} / "
            f"{_peak(r)} | "
            f"{_mb(last['written'].get('data'))} | {_mb(last['written'].get('deletes'))} | "
            f"{last['files_removed']} | {last['rows_rewritten']:,} | "
            f"{', '.join(f'{p:,}' for p in pos) if pos[0] is not None else ''} | "
            f"{r['check']['ok']} | {last['load']:.1f} |"
        )
    skipped_50m = [r for r in rounds if r.get("skipped") and r["kind"] == "delta"
                   and r["table_rows"] >= 50_000_000]  # fmt: skip
    if skipped_50m:
        lines += [
            "",
            f"Delta copy-on-write at 50M, from the issue (bench/results/upsert/round-50m.md, "
            f"a random round, delta-rs MERGE): **{ISSUE_DELTA_COW_50M_S} s**.",
        ]
    t = targets(rounds)
    if t:
        lines += ["", "Targets (issue 37), on the steady medians:", "", *t]
    mor = [r for r in rounds if r["mode"] in MOR_MODES and "rounds" in r]
    if mor:
        labels: list[str] = []
        for r in mor:
            for x in r["rounds"]:
                for k in x["phases"]:
                    if k not in labels:
                        labels.append(k)
        lines += [
            "",
            "Merge-on-read round by step, seconds (1st round, and the median of the steady "
            "rounds; a step inside another is counted in both - 'index sync' holds 'index: "
            "read + sort a new file' and 'read key columns', 'index: merge runs'; 'key search' "
            "holds 'read key columns', which sums its 4 threads there):",
            "",
            "| table rows | kind | mode | round | s | " + " | ".join(labels) + " |",
            "|---|---|---|---|---|" + "---|" * len(labels),
        ]
        for r in mor:
            first = r["rounds"][0]
            rows_ = [("1st", first["seconds"], [first["phases"].get(k, 0.0) for k in labels])]
            rows_.append(("steady", r["round_s"], [_steady(r, k) for k in labels]))
            for which, seconds, cells in rows_:
                lines.append(
                    f"| {r['table_rows']:,} | {r['kind']} | {MODE_LABEL[r['mode']]} | {which} | "
                    f"{seconds:.2f} | " + " | ".join(f"{c:.3f}" for c in cells) + " |"
                )
    notes = {r["note"] for r in rounds if r.get("note")}
    for n in notes:
        lines += ["", f"Note: {n}"]
    return lines


def scan_markdown(res: dict[str, Any], scans: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        f"### Full scan after {scans[0]['rounds']} rounds of "
        f"{res['settings']['changes']:,} changes, {scans[0]['table_rows']:,}-row table",
        "",
        f"Run {res['scan_at']}. Scan: pyiceberg `scan().to_arrow()` / delta-rs "
        f"`QueryBuilder` `SELECT *`; a warm-up scan, then the median of {SCAN_REPEATS}. "
        "Merge-on-read with the defaults (key index). "
        "'after folding deletes': the merge-on-read table's upkeep compaction "
        '(`open_upkeep(sink, "p", fmt).compact()`: Iceberg folds deletes into data files, '
        "`FoldDeletes(min_deleted_fraction=0.05, max_files=1000)`; Delta: delta-rs OPTIMIZE), "
        "then both tables scanned again, alternating (the copy-on-write table unchanged).",
        "",
        "| kind | state | merge-on-read scan s | copy-on-write scan s | MOR / COW | target | "
        "MOR live files (data / with deletes) | MOR round s (median) | COW round s (median) | "
        "same rows |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in scans:
        mor, cow = s["merge_on_read"], s["copy_on_write"]
        if "scan_s" not in mor or "scan_s" not in cow:
            error = (mor.get("error") or cow.get("error") or "")[:160]
            lines.append(f"| {s['kind']} | after {s['rounds']} rounds | FAILED | | | | | | | "
                         f"{error} |")  # fmt: skip
            continue
        live = mor.get("live", {})
        ok = "met" if s["ratio"] <= TARGET_SCAN else "NO"
        lines.append(
            f"| {s['kind']} | after {s['rounds']} rounds | {mor['scan_s']:.2f} | "
            f"{cow['scan_s']:.2f} | **{s['ratio']:.2f}** | <= {TARGET_SCAN:g}x: {ok} | "
            f"{live.get('data', '')} / {live.get('deletes', '')} | "
            f"{mor['round_s_median']:.2f} | {cow['round_s_median']:.2f} | {s['equal']} |"
        )
        f = s.get("folded")
        if not f:
            continue
        if "ratio" not in f:
            lines.append(f"| {s['kind']} | after folding deletes | FAILED | | | | | | | "
                         f"{f.get('error', '')[:160]} |")  # fmt: skip
            continue
        ok = "met" if f["ratio"] <= TARGET_SCAN_FOLDED else "NO"
        lines.append(
            f"| {s['kind']} | after folding deletes (compaction {f['compact_s']:.2f} s) | "
            f"{f['mor_scan_s']:.2f} | {f['cow_scan_s']:.2f} | **{f['ratio']:.2f}** | "
            f"<= {TARGET_SCAN_FOLDED:g}x: {ok} | {f['live']['data']} / {f['live']['deletes']} "
            f"| | | {f['equal']} |"
        )
    return lines


def markdown(res: dict[str, Any]) -> str:
    lines: list[str] = []
    if res.get("round"):
        lines += round_markdown(res, res["round"])
    if res.get("scan"):
        lines += scan_markdown(res, res["scan"])
    return "\n".join(lines) + "\n"


def plot(rounds: list[dict[str, Any]], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    colors = {"iceberg": "#1f77b4", "delta": "#d62728"}
    styles = {"merge_on_read": "o-", "merge_on_read_no_index": "^:", "copy_on_write": "s--"}
    for kind in KINDS:
        for mode in MODES:
            cells = sorted((r["table_rows"], r["round_s"], r["build_s"]) for r in rounds
                           if r["kind"] == kind and r["mode"] == mode and "round_s" in r)  # fmt: skip
            if not cells:
                continue
            x = [c[0] for c in cells]
            ax.plot(x, [c[1] for c in cells], styles[mode], color=colors[kind],
                    label=f"{kind} {MODE_LABEL[mode]} (steady)")  # fmt: skip
            if mode == "merge_on_read":
                ax.plot(x, [c[2] for c in cells], "x", color=colors[kind], ms=8,
                        label=f"{kind} {mode}: 1st round (builds the index)")  # fmt: skip
    ax.plot([50_000_000], [ISSUE_DELTA_COW_50M_S], "*", color=colors["delta"], ms=10,
            label="delta copy-on-write 50M (issue's figure)")  # fmt: skip
    ax.axhline(TARGET_MOR_50M_S, ls=":", color="k", lw=0.8, label="target MOR <= 3 s at 50M")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("table rows")
    ax.set_ylabel("round seconds (steady median; x: 1st round)")
    ax.set_title("One round of 100k random-key changes: merge-on-read vs copy-on-write")
    ax.legend(fontsize=6.5)
    fig.tight_layout()
    path = out / "round.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1000000,10000000,50000000")
    ap.add_argument("--file-rows", type=int, default=250_000)
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=4, help="rounds a table: 1 build + steady")
    ap.add_argument("--cow-max-rows", type=int, default=10_000_000)
    ap.add_argument("--kinds", default="iceberg,delta")
    ap.add_argument("--only", default="round,scan", help="round,scan")
    ap.add_argument("--scan-rows", type=int, default=1_000_000)
    ap.add_argument("--scan-rounds", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="cProfile one more MOR round")
    ap.add_argument("--max-used-gib", type=float, default=18.0)
    ap.add_argument("--work", default="/tmp", help="where the temporary tables go")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--markdown", help="only print the table of a results .json")
    a = ap.parse_args()
    if a.markdown:
        print(markdown(json.loads(Path(a.markdown).read_text())))
        return
    a.rows = [int(x) for x in a.rows.split(",")]
    a.kinds = [k for k in a.kinds.split(",") if k]
    only = a.only.split(",")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "results.json"
    res: dict[str, Any] = json.loads(previous.read_text()) if previous.exists() else {}
    res["settings"] = {k: v for k, v in vars(a).items() if k not in ("markdown",)}
    PHASES.install()
    work = Path(tempfile.mkdtemp(prefix="rc-mor-bench-", dir=a.work))
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        with MemoryGuard(a.max_used_gib) as guard:
            if "round" in only:
                res["round"] = run_round(a, work, guard)
                res["round_at"] = at
            if "scan" in only:
                res["scan"] = run_scan(a, work, guard)
                res["scan_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["machine"] = {"cores": os.cpu_count(), "mem_gib": psutil.virtual_memory().total / 2**30}
    table = markdown(res)
    print(table)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "results.md").write_text(table)
    if res.get("round"):
        plot(res["round"], out)


if __name__ == "__main__":
    main()
