"""``rayconnect demo --database``: a shop's Postgres database mirrored into Delta tables, live.

A throwaway Postgres (``rayconnect.demo.local_postgres``: as the ``postgres`` user, in a temp
folder, on a free port) with a few shop tables under a steady write load of inserts, updates
and deletes (``rayconnect.demo.mirror_database``); a source pipeline (the Postgres change source,
exactly once into the embedded broker, a topic per table); ONE sink pipeline whose
topic-pattern route upserts each topic into its own Delta table, made at its first record.
A table of lag per table (changes written, records in Kafka, in the lake, lag) is redrawn
every second on a terminal and printed every few seconds in a log. Midway the demo SIGKILLs
the source task and ``ray.kill``s the sink's coordinator (Ray restarts both). At the end it
stops the load, waits until the lake has caught up, and checks that every lake table equals
``SELECT *`` of its Postgres table: the exit status says whether that held.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rayconnect.demo.stage import DemoRun, DemoStage
from rayconnect.demo.view import LiveView
from rayconnect.protocol.source_status import SourcePipelineStatus
from rayconnect.protocol.status import PipelineStatus
from rayconnect.protocol.types import TopicPartition

MIRROR = "shop-mirror"
"""The mirror (``rc.Mirror``): its sink pipeline's name; the source is ``shop-mirror-source``."""
PREFIX = "shop"
SHOP_TABLES = (
    "customers", "products", "orders", "order_lines", "payments", "shipments", "reviews",
    "carts", "cart_items", "addresses", "coupons", "refunds", "suppliers", "stock",
    "warehouses", "categories", "wishlists", "returns", "invoices", "sessions",
)  # fmt: skip
CHAOS_AT = (0.3, 0.6)
"""When each kill happens, as a fraction of the load's run."""
BLOCK_EVERY_S = 5
"""Seconds between two lag tables when the output is not a terminal (a log)."""


@dataclass
class DatabaseDemoResult(DemoRun):
    tables: dict[str, tuple[int, int]]
    """Table -> (rows in Postgres, rows in the lake) at the end."""
    difference: str | None
    """None when every lake table equals ``SELECT *`` of its Postgres table."""
    changes: int

    @property
    def ok(self) -> bool:
        return self.difference is None and bool(self.tables)


@dataclass
class _Kill:
    label: str
    name: str
    how: str
    #: what tells the killed actor's successor apart (a task's pid, a coordinator's epoch)
    mark: Callable[[SourcePipelineStatus | None, PipelineStatus | None], Any]
    at: float = 0.0
    before: Any = None


class LagTable:
    """The live lag per table: one block of lines, redrawn in place on a terminal, printed
    every ``BLOCK_EVERY_S`` seconds otherwise (a CI log reads it as plain lines)."""

    def __init__(self, events: LiveView, tables: list[str]) -> None:
        self.events, self.out, self.tables = events, events.out, tables
        self.started = events.started
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self._drawn = 0
        self._ticks = 0

    def event(self, text: str) -> None:
        self._drawn = 0  # an event line goes below the block: draw a new block after it
        self.events.event(text)

    def show(
        self, head: str, rows: dict[str, tuple[int, int | None, int | None, int | None]]
    ) -> None:
        """``rows``: table -> (changes written by the load, the high watermarks of its topic's
        partitions - change events, snapshot rows and transaction markers -, the offsets
        committed in its lake table, lag = the difference)."""
        self._ticks += 1
        if not self.tty and self._ticks % BLOCK_EVERY_S != 1:
            return
        n = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
        lines = [
            f"  [{time.monotonic() - self.started:5.1f} s] {head}",
            f"    {'table':<14} {'changes':>9} {'kafka hw':>9} {'committed':>9} {'lag':>7}",
        ]
        for t in self.tables:
            changes, kafka, lake, lag = rows.get(t, (0, None, None, None))
            lines.append(f"    {t:<14} {changes:>9,} {n(kafka):>9} {n(lake):>9} {n(lag):>7}")
        if self.tty and self._drawn:
            print(f"\x1b[{self._drawn}F\x1b[J", end="", file=self.out)
        print("\n".join(lines), file=self.out, flush=True)
        self._drawn = len(lines) if self.tty else 0


def per_table(status: PipelineStatus | None, prefix: str) -> dict[str, tuple[int, int, int]]:
    """Table -> (high watermarks, committed offsets, lag) summed over its topic's partitions,
    from the sink's status (a topic not discovered yet is not there)."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    if status is None:
        return {}
    head = f"{prefix}.public."
    for key, p in status.partition_status.items():
        topic = TopicPartition.from_key(key).topic
        if topic.startswith(head):
            s = sums[topic[len(head) :]]
            s[0] += p.high_watermark or 0
            s[1] += p.committed_offset or 0
            s[2] += p.lag or 0
    return {t: (s[0], s[1], s[2]) for t, s in sums.items()}


def _source_line(status: SourcePipelineStatus | None) -> str:
    task = status.tasks.get(0) if status is not None else None
    if task is None or task.records_committed is None:
        return "source task unavailable (restarting)"
    lag = task.lag
    behind = "lag -"
    if lag is not None and lag.bytes is not None:
        behind = f"{lag.bytes:,} B / {lag.seconds or 0:.1f} s behind the WAL"
    return (
        f"source task {task.state}: {task.records_committed:,} changes committed since its "
        f"start, {behind}"
    )


def _sink_line(status: PipelineStatus | None) -> str:
    if status is None:
        return "sink unavailable (restarting)"
    r = status.rounds_since_start
    return f"sink epoch {status.epoch}: {r.committed} rounds committed since its start"


def run_database_demo(
    changes: int = 15_000,
    tables: int = 8,
    lake: str | None = None,
    *,
    rate: int = 500,
    interval_s: float = 2.0,
    chaos: bool = True,
    catch_up_timeout_s: float = 180.0,
    out: TextIO = sys.stdout,
) -> DatabaseDemoResult:
    from rayconnect.demo.local_postgres import postgres_server, require_installed
    from rayconnect.demo.mirror_database import MirrorDatabase
    from rayconnect.demo.sink import DemoError
    from rayconnect.spark_bridge.session import require_java

    require_installed()
    require_java()
    names = list(SHOP_TABLES[: max(1, min(tables, len(SHOP_TABLES)))])
    lake_path = Path(lake or tempfile.mkdtemp(prefix="rayconnect-demo-lake-")).resolve()
    if lake_path.exists() and any(lake_path.iterdir()):
        raise DemoError(
            f"{lake_path} is not empty; the demo's tables go in a new folder (--table, or none "
            "for a temp folder)"
        )
    run_s = changes / rate
    banner = (
        f"rayconnect demo --database: {len(names)} shop tables in a throwaway Postgres, "
        f"{changes:,} changes at {rate:,}/s ({run_s:.0f} s) -> source pipeline -> Kafka -> "
        f"one sink pipeline, a round every {interval_s:g} s, chaos {'on' if chaos else 'off'} "
        f"-> {lake_path}/<table>"
    )
    stage = DemoStage(banner, out, cluster_id="local", topic=None, partitions=2)
    view = LagTable(stage.view, names)
    t = time.monotonic()
    with postgres_server() as server:
        db = MirrorDatabase(server, names=names)
        db.create(rows_per_table=100)
        view.event(f"postgres {server.dsn} ({len(names)} tables of 100 rows)")
        stage.step("postgres", t)
        with stage:
            result = _mirror(stage, view, server, db, lake_path, changes, rate, interval_s, chaos,
                             catch_up_timeout_s)  # fmt: skip
    result.elapsed_s = stage.elapsed_s
    result.timings = stage.timings
    _summary(result, lake_path, out)
    stage.finish(result.ok)
    return result


def _mirror(
    stage: DemoStage,
    view: LagTable,
    server: Any,
    db: Any,
    lake: Path,
    changes: int,
    rate: int,
    interval_s: float,
    chaos: bool,
    catch_up_timeout_s: float,
) -> DatabaseDemoResult:
    import rayconnect as rc
    from rayconnect.actors import names as actor_names
    from rayconnect.demo.mirror_database import difference, lake_rows

    step = stage.step
    t = time.monotonic()
    view.event("mirror starting: the source task, then the sink's writer, coordinator...")
    mirror = rc.Mirror(
        MIRROR,
        server.url,
        to=str(lake),
        tables=list(db.names),
        kafka=stage.bootstrap,
        topic_prefix=PREFIX,
        password_file=server.password_file,
        commit=rc.CommitSettings(commit_interval_s=interval_s, write_timeout_s=10),
    ).start()
    source, sink = mirror.source, mirror.sink
    step("start", t)
    view.event(
        f"mirror {MIRROR!r} running: pipelines {source.name!r} and {sink.name!r} "
        f"({time.monotonic() - t:.1f} s to start)"
    )
    kills = [
        _Kill("source task", actor_names.task(source.name, 0), "sigkill", _task_pid),
        _Kill("sink coordinator", actor_names.coordinator(sink.name), "ray.kill", _sink_epoch),
    ]
    watch = _Watch(view, source, sink, db, kills if chaos else [])
    try:
        t = time.monotonic()
        db.start(changes_per_s=rate)
        view.event(f"load     {rate:,} changes/s: inserts, updates, deletes in transactions")
        run_s = changes / rate
        kill_at = [t + f * run_s for f in CHAOS_AT]
        watch.until(lambda: db.changes >= changes or db.error is not None, kill_at, run_s + 120)
        db.stop()
        step("load", t)
        view.event(f"load stopped at {db.changes:,} changes; waiting for the lake to catch up")
        t = time.monotonic()
        caught_up = watch.until(
            lambda: not watch.kills and difference(db, lake) is None,
            [time.monotonic()] * len(watch.kills),
            catch_up_timeout_s,
        )
        step("catch_up", t)
        view.event("caught up" if caught_up else f"NOT caught up after {catch_up_timeout_s:g} s")
        t = time.monotonic()
        # the slot goes too: the database is thrown away
        mirror.stop(drop_slot=True, drain_timeout_s=30, timeout_s=60)
        step("stop", t)
    finally:
        with contextlib.suppress(Exception):  # the error in flight matters more
            db.stop()
    t = time.monotonic()
    counts = {name: (len(db.rows_of(name)), len(lake_rows(lake, name))) for name in db.names}
    problem = difference(db, lake)
    step("verify", t)
    return DatabaseDemoResult(
        tables=counts,
        difference=problem,
        changes=db.changes,
        kills=watch.done,
        recoveries=watch.recoveries,
    )


def _task_pid(source: SourcePipelineStatus | None, _sink: PipelineStatus | None) -> Any:
    """The task's process, once it committed a transaction (None before)."""
    task = source.tasks.get(0) if source is not None else None
    return task.pid if task is not None and (task.transactions_committed or 0) > 0 else None


def _sink_epoch(_source: SourcePipelineStatus | None, sink: PipelineStatus | None) -> Any:
    """The coordinator's epoch, once it committed a round (None before)."""
    return sink.epoch if sink is not None and sink.rounds_since_start.committed > 0 else None


class _Watch:
    """The lag table every second; kills at their times, each once the one before it has
    recovered."""

    def __init__(self, view: LagTable, source: Any, sink: Any, db: Any, kills: list[_Kill]):
        self.view, self.source, self.sink, self.db, self.kills = view, source, sink, db, kills
        self.done: list[str] = []
        self.recoveries: dict[str, float] = {}
        self._pending: _Kill | None = None
        self._sink_status: PipelineStatus | None = None

    def _recovered(self, source_status: SourcePipelineStatus | None) -> None:
        k = self._pending
        if k is None or k.mark(source_status, self._sink_status) in (None, k.before):
            return
        self._pending = None
        self.recoveries[k.label] = time.monotonic() - k.at
        self.view.event(f"RECOVERED from the {k.label} kill: its successor committed, "
                        f"{self.recoveries[k.label]:.1f} s after it")  # fmt: skip

    def _kill(self, kill_at: list[float], source_status: SourcePipelineStatus | None) -> None:
        """The next kill, once the actor to kill has committed (its mark is known)."""
        from rayconnect.demo.chaos import kill_actor

        k = self.kills[0]
        k.before = k.mark(source_status, self._sink_status)
        if k.before is None:
            return
        kill_at.pop(0)
        self.kills.pop(0)
        pid = kill_actor(k.name, k.how)
        k.at = time.monotonic()
        how = f"SIGKILL {k.label} (pid {pid})" if pid else f"ray.kill {k.label}"
        self.view.event(f"CHAOS   {how}; Ray restarts it")
        self.done.append(f"{k.label} ({k.how})")
        self._pending = k

    def until(self, predicate: Callable[[], bool], kill_at: list[float], timeout_s: float) -> bool:
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            tick = time.monotonic()
            self._sink_status = None
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                self._sink_status = self.sink.status(timeout_s=3)
            source_status = None
            with contextlib.suppress(Exception):
                source_status = self.source.status(timeout_s=3)
            self._recovered(source_status)
            if self.kills and kill_at and tick >= kill_at[0] and self._pending is None:
                self._kill(kill_at, source_status)
            lag = per_table(self._sink_status, PREFIX)
            rows = {
                t: (self.db.changes_by_table[t], *lag.get(t, (None, None, None)))
                for t in self.view.tables
            }
            self.view.show(f"{_source_line(source_status)} | {_sink_line(self._sink_status)}", rows)
            if predicate() and self._pending is None:
                return True
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        return False


def _summary(r: DatabaseDemoResult, lake: Path, out: TextIO) -> None:
    from rayconnect.demo.sink import read_commands

    def line(label: str, text: str) -> None:
        print(f"  {label:<18} {text}", file=out)

    print("", file=out)
    line("changes", f"{r.changes:,} written by the load (after 100 rows per table)")
    for table, (pg, rows) in r.tables.items():
        line(f"  {table}", f"{pg:,} rows in Postgres, {rows:,} in {lake / table}")
    for label, text in r.summary_lines():
        line(label, text)
    if r.tables:
        table = str(lake / next(iter(r.tables)))
        for label, command in zip(("read it", ""), read_commands(table), strict=True):
            line(label, command)
    verdict = (
        f"OK: every lake table equals SELECT * of its Postgres table ({len(r.tables)} tables)"
        if r.ok
        else f"FAILED: {r.difference or 'no tables'}"
    )
    line("result", verdict)
