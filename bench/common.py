"""Shared helpers of the benchmark: backlog production, memory sampling, Ray session
clean-up, Delta-log latency reading, and running a helper script as a subprocess.

Nothing here is rayconnect-specific except ``produce_backlog`` (it uses the demo records of
``rayconnect.kafka.admin``, ~200 B of JSON each).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import json
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

from rayconnect.spark_bridge.native_library import young

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
RAY_TMP = Path("/tmp/ray")
# Short (Ray's socket paths must stay under 107 bytes) and one per benchmark run, inherited by
# the processes it starts: two runs at once shared /tmp/rcb, and one's cleanup of the Spark
# scratch folder there killed the other's executors mid-job.
PRIVATE_TMP = Path(os.environ.setdefault("RAYCONNECT_BENCH_TMP", f"/tmp/rcb{os.getpid()}"))

# A private TMPDIR for everything this benchmark starts (Ray workers inherit it): Spark's
# scratch folder (tempfile.gettempdir()/rayconnect-spark) is otherwise shared with every other
# run on the machine, and another run cleaning it kills our executor's block manager mid-job.
os.makedirs(PRIVATE_TMP / "tmp", exist_ok=True)
os.environ["TMPDIR"] = str(PRIVATE_TMP / "tmp")
tempfile.tempdir = None

# --------------------------------------------------------------------------------------
# producing
# --------------------------------------------------------------------------------------


def sized_value(size: int, i: int, key: str) -> bytes:
    """A JSON record of ``size`` bytes (the demo record's fields, padded): issue 28's 1 KiB
    and 16 KiB values."""
    from rayconnect.kafka.admin import demo_value

    base = demo_value(i, key)
    return base[:-2] + b"x" * max(0, size - len(base)) + base[-2:]


def _produce_part(
    bootstrap: str,
    topic: str,
    n: int,
    partitions: list[int],
    start: int,
    wide: bool = False,
    value_bytes: int = 0,
) -> dict:
    from rayconnect.kafka.admin import demo_value, demo_value_wide, produce_demo_records

    value = demo_value_wide if wide else demo_value
    if value_bytes:
        value = functools.partial(sized_value, value_bytes)
    return asyncio.run(
        produce_demo_records(bootstrap, topic, n, partitions, start_index=start, value=value)
    )


def produce_backlog(
    bootstrap: str,
    topic: str,
    n: int,
    partitions: int,
    procs: int = 2,
    wide: bool = False,
    value_bytes: int = 0,
) -> dict[int, int]:
    """Produce ``n`` demo records round-robin over ``partitions`` with ``procs`` processes
    (disjoint partition sets, disjoint keys; ``wide``: 10-field values; ``value_bytes``:
    values padded to that size). Returns {partition: records}."""
    from rayconnect.kafka.admin import create_topic

    asyncio.run(create_topic(bootstrap, topic, partitions))
    procs = max(1, min(procs, partitions))
    parts = [list(range(partitions))[i::procs] for i in range(procs)]
    shares = [n * len(p) // partitions for p in parts]
    shares[0] += n - sum(shares)
    starts = [sum(shares[:i]) for i in range(procs)]
    if procs == 1:
        return _produce_part(bootstrap, topic, n, parts[0], 0, wide, value_bytes)
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        results = pool.starmap(
            _produce_part,
            [
                (bootstrap, topic, shares[i], parts[i], starts[i], wide, value_bytes)
                for i in range(procs)
            ],
        )
    counts: dict[int, int] = {}
    for r in results:
        counts.update(r)
    return counts


# --------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _kind(p: psutil.Process) -> str:
    try:
        name = p.name()
        cmd = " ".join(p.cmdline()[:3])
    except psutil.Error:
        return "gone"
    if "java" in name:
        return "jvm"
    if (
        name in ("raylet", "gcs_server")
        or "dashboard" in cmd
        or "monitor.py" in cmd
        or "log_monitor" in cmd
        or "runtime_env" in cmd
    ):
        return "ray-system"
    if name.startswith("ray::") or "default_worker" in cmd or "python" in name:
        return "ray-worker"
    return "other"


class MemorySampler:
    """Samples, every ``period_s``, the processes under ``root`` (descendants, not ``root``
    itself) minus ``exclude`` pids: sum of RSS and of PSS (shared pages such as the object
    store counted once), by kind (ray-worker, jvm, ray-system). Keeps the peaks."""

    def __init__(
        self,
        root: int | None = None,
        exclude: Iterable[int] = (),
        period_s: float = 0.5,
        pids: Sequence[int] | None = None,
    ) -> None:
        self.root = root if root is not None else os.getpid()
        self.exclude = set(exclude)
        self.fixed = list(pids) if pids is not None else None
        self.period_s = period_s
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_by_kind: dict[str, int] = {}
        self.peak_processes = 0
        self.peak_top: list[tuple[int, str]] = []
        self.samples: list[tuple[float, int, int]] = []
        # Last CPU seconds (user + system) seen per process: a process's total is its last
        # sample, so a process that ended between samples loses at most one period.
        self.cpu: dict[int, tuple[str, float]] = {}
        self.cpu_at_mark: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _procs(self) -> list[psutil.Process]:
        if self.fixed is not None:
            out = []
            for pid in self.fixed:
                try:
                    p = psutil.Process(pid)
                    out.append(p)
                    out.extend(p.children(recursive=True))
                except psutil.Error:
                    pass
            return out
        try:
            kids = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return []
        skip = set(self.exclude)
        for pid in self.exclude:
            with contextlib.suppress(psutil.Error):
                skip.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        return [p for p in kids if p.pid not in skip]

    def sample(self) -> None:
        rss = pss = 0
        kinds: dict[str, int] = {}
        each: list[tuple[int, str]] = []
        procs = self._procs()
        for p in procs:
            try:
                r = p.memory_info().rss
                title = p.name()
                cpu = p.cpu_times()
            except psutil.Error:
                continue
            label = f"{_kind(p)}:{title}"
            if label.startswith("gone:") and p.pid in self.cpu:  # ending: keep its name
                label = self.cpu[p.pid][0]
            self.cpu[p.pid] = (label, cpu.user + cpu.system)
            s = _pss_kb(p.pid) * 1024
            rss += r
            pss += s
            k = _kind(p)
            kinds[k] = kinds.get(k, 0) + s
            each.append((s, f"{k}:{title}"))
        self.samples.append((time.monotonic(), rss, pss))
        if pss > self.peak_pss:
            self.peak_pss, self.peak_by_kind, self.peak_processes = pss, kinds, len(procs)
            self.peak_top = sorted(each, reverse=True)[:8]
        self.peak_rss = max(self.peak_rss, rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period_s)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict[str, Any]:
        mb = 1 / 1e6
        return {
            "peak_rss_mb": round(self.peak_rss * mb),
            "peak_pss_mb": round(self.peak_pss * mb),
            "peak_pss_by_kind_mb": {k: round(v * mb) for k, v in sorted(self.peak_by_kind.items())},
            "processes": self.peak_processes,
            "largest_at_peak_mb": [(name, round(b * mb)) for b, name in self.peak_top],
            "cpu_s": round(sum(self.cpu_by_process().values()), 1),
            "cpu_s_by_process": self.cpu_by_process(),
        }

    def mark(self) -> None:
        """CPU is counted from here on (e.g. once the pipeline is up: not its start-up)."""
        self.sample()
        self.cpu_at_mark = {pid: seconds for pid, (_, seconds) in self.cpu.items()}

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds since ``mark`` per kind:title, largest first (same titles summed)."""
        totals: dict[str, float] = {}
        for pid, (title, seconds) in self.cpu.items():
            seconds -= self.cpu_at_mark.get(pid, 0.0)
            totals[title] = totals.get(title, 0.0) + seconds
        return {t: round(s, 1) for t, s in sorted(totals.items(), key=lambda x: -x[1]) if s >= 0.1}


# --------------------------------------------------------------------------------------
# Ray sessions
# --------------------------------------------------------------------------------------


class RaySession:
    """``ray.init`` for one scenario, with its session under a private temp dir (other
    engineers' test fixtures remove every new folder under /tmp/ray when their module ends,
    which would delete a live session's sockets). On exit: ``ray.shutdown`` and remove what
    it left: the session folder, and the JVM native-library folders created meanwhile under
    /tmp/ray that no live process maps.

    RayDP's Java agent in the Spark driver JVM logs to ``/tmp/ray/session_latest/logs``
    (it gets no ``ray.logging.dir``): ``ensure_session_latest`` points that link at this
    session when it is missing or dangling, and exit points it back at the newest remaining
    /tmp/ray session (or removes it) - it is never left dangling."""

    def __enter__(self) -> RaySession:
        import ray

        from rayconnect import ray_internals

        self.before = set(os.listdir(RAY_TMP)) if RAY_TMP.exists() else set()
        PRIVATE_TMP.mkdir(exist_ok=True)
        ray.init(
            namespace="rayconnect",
            log_to_driver=False,
            include_dashboard=True,
            _temp_dir=str(PRIVATE_TMP),
        )
        self.session_dir = ray_internals.session_dir()
        ensure_session_latest(self.session_dir)
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        ray.shutdown()
        time.sleep(1.0)
        shutil.rmtree(self.session_dir, ignore_errors=True)
        shutil.rmtree(PRIVATE_TMP / "tmp" / "rayconnect-spark", ignore_errors=True)
        cleanup_ray_tmp(self.before, self.session_dir)


def cleanup_private_tmp() -> None:
    """At the end of a benchmark run: remove its private temp dir (this run's alone; the
    sessions in it were removed by ``RaySession`` already)."""
    if os.environ.get("RAYCONNECT_BENCH_TMP") == str(PRIVATE_TMP) and PRIVATE_TMP.name == (
        f"rcb{os.getpid()}"
    ):  # only the process that made it: the runs it started share it
        shutil.rmtree(PRIVATE_TMP, ignore_errors=True)


def ensure_session_latest(session_dir: str) -> None:
    """Make /tmp/ray/session_latest/logs exist, linking it to ``session_dir`` if needed."""
    link = RAY_TMP / "session_latest"
    if (link / "logs").is_dir():
        return
    RAY_TMP.mkdir(exist_ok=True)
    if link.is_symlink():
        link.unlink()
    if not link.exists():
        link.symlink_to(session_dir)


def _mapped_dirs() -> set[str]:
    """Top-level /tmp/ray folders some live process has a file mapped from."""
    used: set[str] = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    i = line.find("/tmp/ray/")
                    if i >= 0:
                        used.add(line[i + 9 :].split("/", 1)[0].strip())
        except OSError:
            continue
    return used


def cleanup_ray_tmp(before: set[str], session_dir: str = "") -> None:
    for sub in PRIVATE_TMP.glob("*") if PRIVATE_TMP.exists() else []:
        if re.fullmatch(r"\d+", sub.name) and sub.is_dir():
            shutil.rmtree(sub, ignore_errors=True)
    if not RAY_TMP.exists():
        return
    new = set(os.listdir(RAY_TMP)) - before
    used = _mapped_dirs()
    for name in new:
        path = RAY_TMP / name
        if re.fullmatch(r"\d+", name) and path.is_dir() and name not in used and not young(name):
            shutil.rmtree(path, ignore_errors=True)
    sessions = sorted(
        (p for p in RAY_TMP.glob("session_2*") if p.is_dir()), key=lambda p: p.stat().st_mtime
    )
    for link in ("session_latest", "prom_metrics_service_discovery.json"):
        path = RAY_TMP / link
        mine = bool(session_dir) and path.is_symlink() and os.readlink(path).startswith(session_dir)
        if path.is_symlink() and (mine or not path.exists()):
            path.unlink()
            if link == "session_latest" and sessions:
                path.symlink_to(sessions[-1])


def actor_pids(pipeline: str) -> dict[str, int]:
    """{actor name: pid} of a pipeline's live actors."""
    import ray
    from ray.util.state import list_actors

    out = {}
    address = ray.get_runtime_context().gcs_address  # several Rays run on this machine
    for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000):
        if (
            a.name
            and (a.name.startswith(pipeline + "/") or a.name.startswith(f"rayconnect-{pipeline}"))
            and a.pid
        ):
            out[a.name] = int(a.pid)
    return out


# --------------------------------------------------------------------------------------
# Delta log: when did each record become visible
# --------------------------------------------------------------------------------------


def delta_log(
    table: str, storage_options: dict[str, str] | None = None
) -> list[tuple[int, float, list[dict]]]:
    """[(version, file mtime in s, actions)] of every commit file in the table's log, on a
    local disk or an object store."""
    from pyarrow import fs

    from rayconnect.storage.location import TableLocation

    location = TableLocation.parse(table, storage_options)
    store = location.filesystem()
    infos = store.get_file_info(fs.FileSelector(location.path("_delta_log")))
    out = []
    for info in sorted(infos, key=lambda i: i.base_name):
        if not info.base_name.endswith(".json") or info.base_name.startswith("_"):
            continue
        with store.open_input_stream(info.path) as fh:
            text = fh.read().decode("utf-8")
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        out.append((int(info.base_name.split(".")[0]), info.mtime.timestamp(), actions))
    return out


def delta_visibility(
    table: str, after_version: int = -1, storage_options: dict[str, str] | None = None
) -> list[tuple[int, float, list[str]]]:
    """[(version, commit time in s since epoch, added data file paths)] from the log, with
    the commit time from ``DeltaTable.history()``."""
    from deltalake import DeltaTable

    dt = DeltaTable(table, storage_options=storage_options)
    when = {h["version"]: h["timestamp"] / 1000.0 for h in dt.history()}
    out = []
    for version, mtime, actions in delta_log(table, storage_options):
        if version <= after_version:
            continue
        adds = [a["add"]["path"] for a in actions if "add" in a]
        out.append((version, when.get(version, mtime), adds))
    return out


def delta_records_by_version(
    table: str, storage_options: dict[str, str] | None = None
) -> list[tuple[float, int]]:
    """[(commit time, records added)] for every version that added data, in order."""
    out = []
    for _, mtime, actions in delta_log(table, storage_options):
        records, committed = 0, None
        for action in actions:
            if "add" in action and action["add"].get("stats"):
                records += json.loads(action["add"]["stats"]).get("numRecords", 0)
            if "commitInfo" in action:
                committed = action["commitInfo"].get("timestamp")
        if records:
            out.append(((committed or mtime * 1000) / 1000.0, records))
    return out


def iceberg_commits(sink: Any) -> list[tuple[float, int]]:
    """[(commit time in s since epoch, records added)] for every snapshot of an Iceberg
    sink's table that added data and is not expired yet, in order."""
    from rayconnect.tables.factory import open_committer

    table = open_committer(sink, "bench").catalog().load_table(sink.table)
    out = []
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number):
        added = int(snapshot.summary.additional_properties.get("added-records", "0"))
        if added:
            out.append((snapshot.timestamp_ms / 1000.0, added))
    return out


def sustained_rate(
    table: str, t0: float, storage_options: dict[str, str] | None = None
) -> float | None:
    """Records/s up to the second-to-last data version: the steady rate, without the last
    round's (or flush's) wait for its timer, which depends on where the backlog ends."""
    versions = delta_records_by_version(table, storage_options)
    if len(versions) < 2:
        return None
    t_prev = versions[-2][0]
    return sum(r for _, r in versions[:-1]) / max(t_prev - t0, 1e-3)


def produce_to_visible_ms(table: str) -> list[float]:
    """For every record in the table: commit time of the version that added it minus its
    Kafka timestamp (produce time), in ms."""
    from urllib.parse import unquote

    import numpy as np
    import pyarrow.parquet as pq

    out: list[np.ndarray] = []
    for _, committed, adds in delta_visibility(table):
        for rel in adds:
            ts = pq.read_table(os.path.join(table, unquote(rel)), columns=["timestamp"])[
                "timestamp"
            ]
            us = ts.cast("int64").to_numpy()
            out.append(committed * 1000.0 - us / 1000.0)
    return np.concatenate(out).tolist() if out else []


def percentiles(values: Sequence[float], ps: Sequence[float] = (50, 99)) -> dict[str, float]:
    import numpy as np

    if not len(values):
        return {f"p{p:g}": float("nan") for p in ps}
    arr = np.asarray(values)
    return {f"p{p:g}": float(np.percentile(arr, p)) for p in ps} | {
        "max": float(arr.max()),
        "n": len(arr),
    }


# --------------------------------------------------------------------------------------
# helper scripts
# --------------------------------------------------------------------------------------


class Helper:
    """A bench script in a subprocess that prints ``READY`` when it is ready for data and
    one JSON line (its result) at the end; RSS/PSS of its process is sampled meanwhile."""

    def __init__(self, script: str, *args: Any) -> None:
        cmd = [PYTHON, str(BENCH / script), *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=BENCH.parent)
        self.memory = MemorySampler(pids=[self.proc.pid])
        self.memory.__enter__()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.proc.args} exited before READY")
            if line.strip() == "READY":
                return
        raise TimeoutError(f"{self.proc.args} not ready")

    def result(self, timeout_s: float = 1800.0) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.memory.__exit__()
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.proc.args} failed with {self.proc.returncode}")
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1])
        result["memory"] = self.memory.result()
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.memory.__exit__()


def run_helper(script: str, *args: Any, timeout_s: float = 1800.0) -> dict[str, Any]:
    h = Helper(script, *args)
    try:
        h.wait_ready()
        return h.result(timeout_s)
    finally:
        h.kill()


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
