"""``<pipeline>/writer``: the actor that owns a SparkSession and writes staged Arrow data.

A thin shell around ``spark_bridge.spark_write.write_groups``. What it adds:

- **Gathering.** A Spark job costs ~0.5 s however small. Participants flush at about the same
  time (all of them at END-COMMIT), so requests are queued and one drain loop writes
  everything pending in ONE job, then resolves each request with its own files. Jobs per
  round therefore do not grow with the number of partitions, and neither do calls: a
  participant host hands all its partitions' flushes of a moment in one ``write_parts``
  call (a request per part, an answer per part: a bad part fails alone).
- **Warm start.** Starting RayDP takes ~15 s and the first write ~11 s more (JIT, class
  loading). Both happen before Spark takes its first round, not inside it.
- **Spark when needed.** With ``spark.start: when_needed`` (the default) Spark is not
  started until writes made in this process keep it busy (``start_policy.BusyWindow``); a
  transform's pipeline starts it at once (Spark SQL runs the transform).
- **Writes before Spark is up, and small writes, without Spark.** Until Spark has started
  (20-30 s after it is asked to), every write is made in this process with Arrow's Parquet
  writer (``write_here.write_groups_here``: the files a Spark task would write), so the
  pipeline reads and commits while Spark starts; a transform's writes wait for Spark. Once
  Spark is up, a write of at most ``SparkSettings.write_here_max_rows`` rows is made so too:
  milliseconds instead of a 0.3-0.7 s Spark job (the ``latency`` profile).
- All Spark calls run on ONE dedicated thread: the event loop stays free to accept (and
  gather) new requests during a job, and PySpark's pinned-thread mode keeps per-thread
  properties (the job group used to count jobs) on the same JVM thread.
- **A Spark that cannot recover ends the actor.** When the node of RayDP's app master is
  lost, Spark waits for executors forever; when an executor's node is lost, RayDP usually
  restarts it elsewhere, but not always (``spark_bridge/executor_watch.py``). A watchdog
  sees either and exits the process; Ray restarts the writer with a fresh Spark session,
  and the rounds whose writes failed are read again (the protocol's job).
- **A bounded wait for CPUs.** A (re)started writer waits at most ``executor_wait_s`` for
  the CPUs of all its executors, then starts with as many as fit (reported as degraded in
  ``status()``); while not even one fits, writes are refused with that reason instead of
  hanging (``spark_bridge/executor_group.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa
import ray

from rayconnect import ray_internals
from rayconnect.actors import names
from rayconnect.actors.pieces import FlushPart, PartWritten
from rayconnect.config.placement import Placement
from rayconnect.config.spark import SparkSettings
from rayconnect.formats.settings import RecordFormat
from rayconnect.protocol.status import WriterStatus
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.blocks import Block
from rayconnect.spark_bridge.executor_group import (
    Reservation,
    no_room,
    release,
    reserve_executors,
)
from rayconnect.spark_bridge.executor_watch import ExecutorWatch
from rayconnect.spark_bridge.key_search import search_on_spark
from rayconnect.spark_bridge.session import registered_executors, start_spark, stop_spark
from rayconnect.spark_bridge.spark_write import write_groups
from rayconnect.spark_bridge.start_policy import BusyWindow
from rayconnect.spark_bridge.task_writes import RoutedWrite
from rayconnect.spark_bridge.write_here import write_groups_here
from rayconnect.spark_bridge.write_result import WriteResult
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables.route_formats import PublishedFormats
from rayconnect.write_modes.row_delta import SearchJob, search_here

if TYPE_CHECKING:
    from rayconnect.tables.table_set import RouteSchemas

log = logging.getLogger(__name__)

WARM_UP_WRITES = 4
WARM_UP_ROWS = 2_500  # a block; 8 groups of it: about one second of a 10k records/s stream
SPARK_CHECK_S = 2.0
#: how long ``close`` waits for a Spark that is still starting (``PipelineHandle.stop``
#: gives ``close`` 30 s)
CLOSE_WAITS_FOR_START_S = 25.0


@dataclass
class _Request:
    table: TableLocation
    refs: list[Block]
    future: asyncio.Future[list[DataFile]]
    key: str | None = None  # the partition whose rows these are
    share: str | None = None  # requests with the same token may share files
    rows: int | None = None  # how many rows the refs hold, if the caller knows


def _first_and_last(error: BaseException, limit: int = 300) -> str:
    """An error's first and last lines: a Spark task's error is a header, a Python
    traceback, then the cause (seen: "PythonException: An exception was thrown from the
    Python worker..." with the store's refusal ~40 lines below)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return "".join(lines)[:limit]
    return f"{lines[0][: limit // 2]} ... {lines[-1][: limit // 2]}"


def _causes(error: BaseException, limit: int = 400) -> str:
    """The exception lines of an error that crossed Ray and py4j (``X: message``, Java's
    included), else its first and last lines: a failed RayDP start is a 60-line Java trace
    whose one useful line ("java.lang.IllegalArgumentException: Actor of name
    RAY_APP_MASTER exists") sits in the middle, and ``status`` shows this text."""
    causes: list[str] = []
    for line in str(error).splitlines():
        line = line.strip().lstrip(": ")
        if re.match(r"^(Caused by: )?[\w.$]+(Exception|Error): ", line) and line not in causes:
            causes.append(line)
    return "; ".join(causes)[:limit] if causes else _first_and_last(error, limit)


def _warm_up_record() -> pa.Table:
    """One row of the raw schema: enough to load every class a real write needs."""
    return pa.Table.from_pylist(
        [
            {
                "cluster": "warm-up",
                "topic": "warm-up",
                "partition": 0,
                "offset": 0,
                "timestamp": 0,
                "key": b"k",
                "value": b"v",
                "headers": [{"key": "h", "value": b"v"}],
            }
        ],
        schema=RAW_RECORD_SCHEMA,
    )


@ray.remote(num_cpus=0)
class WriterActor:
    """Owns one SparkSession; writes groups of Arrow refs as Parquet, gathering calls."""

    def __init__(
        self,
        name: str = "writer",
        spark: SparkSettings | None = None,
        warm_up: bool = True,
        gather_window_s: float = 0.05,
        gather_max_s: float = 0.5,
        warm_up_table: TableLocation | None = None,
        placement_group_strategy: str = "SPREAD",
        record_format: RecordFormat | None = None,
        table_schema: Callable[[], pa.Schema] | None = None,
        routing: RoutedWrite | None = None,
        route_schemas: RouteSchemas | None = None,
    ) -> None:
        # A fresh Spark app name per actor *incarnation*: RayDP names an actor
        # "<app>_SPARK_MASTER", and a restarted writer must not collide with its predecessor.
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        self._app_name = f"rayconnect-{safe}-{uuid.uuid4().hex[:8]}"
        self._format = record_format if record_format is not None and record_format.typed else None
        if self._format is not None and table_schema is None and routing is None:
            raise ValueError("a typed record_format needs table_schema (the table's reader)")
        self._table_schema = table_schema
        #: with routes: where each table is, and the tables' schemas now (typed formats)
        self._routing = routing
        self._route_schemas = route_schemas
        spark = spark or SparkSettings()
        self._executors, self._cores = spark.executors, spark.executor_cores
        self._memory = spark.executor_memory
        self._group_strategy = placement_group_strategy
        self._executor_wait_s = spark.executor_wait_s
        self._executor_lost_s = spark.executor_lost_s
        self._here_max_rows = spark.write_here_max_rows
        #: Spark starts with the pipeline, or once writes made here keep this process busy
        self._busy: BusyWindow | None = None
        if spark.start == "when_needed" and not self._needs_spark_sql():
            self._busy = BusyWindow(spark.busy_window_s, spark.start_when_busy)
        # writes made here run beside the Spark thread (which may still be starting Spark)
        self._here_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="write")
        self._reservation: Reservation | None = None
        self._watch: ExecutorWatch | None = None
        self._problem: str | None = None  # why Spark is degraded or not there; for status()
        self._warm_up = warm_up
        self._warm_up_table = warm_up_table
        self._gather_window_s = gather_window_s
        self._gather_max_s = gather_max_s
        self._spark: Any = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark")
        self._start_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._stopped = False
        self._stats: dict[str, Any] = {
            "app_name": self._app_name,
            "executors_wanted": spark.executors,
            "executors_started_with": None,
            "executors": None,
            "problem": None,
            "spark_start": spark.start,
            "spark_started_because": None,  # when_needed: why Spark was started
            "spark_start_s": None,
            "warm_up_s": None,
            "warm_up_failed": None,  # why the warm-up writes failed (the start goes on)
            "calls": 0,
            "spark_writes": 0,
            "spark_jobs": 0,
            "writes_here": 0,  # writes made without Spark (before it was up, or small ones)
            "spark_searches": 0,  # merge-on-read key searches run on Spark's executors
            "searches_here": 0,  # ... and in this process (before Spark was up)
            "last_job_ids": [],
            "last_groups": 0,
            "last_write_s": None,
        }

    # -- start-up -------------------------------------------------------------------------

    async def _run_in_spark_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _start_blocking(self) -> None:
        t0 = time.perf_counter()
        self._reservation = self._reserve()
        self._spark = start_spark(
            self._app_name,
            executors=self._reservation.count,
            cores=self._cores,
            memory=self._memory,
            placement_group=self._reservation.group,
        )
        self._watch = ExecutorWatch(self._executors, self._reservation.count, self._executor_lost_s)
        self._set_problem(self._watch.observe(time.monotonic(), self._reservation.count).problem)
        self._stats["executors_started_with"] = self._stats["executors"] = self._reservation.count
        self._stats["spark_start_s"] = round(time.perf_counter() - t0, 3)
        if self._warm_up:
            t0 = time.perf_counter()
            try:
                self._warm_up_writes()
            except Exception as e:
                # Spark is up; only the warm-up's store is away (an object store restarting
                # while a restarted writer warms up): failing the start here would make the
                # writer refuse every write for good.
                self._stats["warm_up_failed"] = f"{type(e).__name__}: {_first_and_last(e)}"
                log.warning("writer %s: warm-up failed, going on: %s", self._app_name, e)
            self._stats["warm_up_s"] = round(time.perf_counter() - t0, 3)
        log.info("writer %s ready: %s", self._app_name, self._stats)

    def _reserve(self) -> Reservation:
        """The executors' CPUs: all of them within ``executor_wait_s``, else as many as fit;
        while none fit, say why (writes are refused with it) and keep trying."""
        while True:
            reservation = reserve_executors(
                self._executors,
                self._cores,
                self._memory,
                self._group_strategy,
                self._executor_wait_s,
            )
            if reservation is not None:
                return reservation
            self._set_problem(
                no_room(self._cores, self._memory, self._executor_wait_s, self._spark_optional)
            )
            log.warning("writer %s: %s", self._app_name, self._problem)

    def _set_problem(self, problem: str | None) -> None:
        self._problem = self._stats["problem"] = problem

    def _warm_up_writes(self) -> None:
        """Several round-sized writes, not one: the JVM compiles the write path only after it
        ran hot for a while, and until then the first rounds of a pipeline took 1.5-2x as long
        (probe_rounds.py: the first ~10 s of a steady load).

        A restarted writer (after a crash or a node loss) makes one: rounds are waiting for
        it, and a few slower first writes cost them less than three more warm-up writes.

        Into the pipeline's own table when known (its staging folder, removed right after):
        executors on other nodes can reach it, which a local scratch folder of this node is
        not, and the store's client warms up too. Else into a local scratch folder."""
        block = ray.put(_warm_up_record().take([0] * WARM_UP_ROWS))
        scratch = None
        table = self._warm_up_table
        if table is None:
            scratch = tempfile.mkdtemp(prefix="rayconnect-warm-up-")
            table = TableLocation.parse(scratch)
        try:
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
            for _ in range(1 if restarted else WARM_UP_WRITES):
                result = write_groups(self._spark, table, [[block]] * 8)
                if result.staging_dir is not None:
                    table.remove_tree(result.staging_dir)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    @property
    def _spark_optional(self) -> bool:
        """``when_needed``: writes go on in this process without Spark (before it is needed,
        and if it cannot start); else Spark starts with the pipeline and writes need it."""
        return self._busy is not None

    def _needs_spark_sql(self) -> bool:
        """A transform's writes run Spark SQL: nothing writes them without Spark."""
        return self._format is not None and self._format.transform_schema is not None

    def _ensure_draining(self) -> None:
        if self._drain_task is None:
            self._wakeup = asyncio.Event()
            self._drain_task = asyncio.ensure_future(self._drain_loop())
        if not self._spark_optional:  # Spark starts with the pipeline
            self._ensure_spark()

    def _ensure_spark(self) -> asyncio.Task[None]:
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(
                self._run_in_spark_thread(self._start_blocking)
            )
            self._start_task.add_done_callback(self._spark_started)
        return self._start_task

    async def ready(self) -> WriterStatus:
        """Start Spark and warm it up (first call only); return once writes are fast - at
        once with ``spark.start: when_needed``, whose Spark starts when writes need it."""
        self._ensure_draining()
        if not self._spark_optional:
            await self._ensure_spark()
        return await self.stats()

    async def stats(self) -> WriterStatus:
        """Counters: calls, Spark writes and jobs (jobs == writes proves one job per write);
        executors wanted / started with / registered now, and ``problem``: why Spark is
        degraded or missing (None when it has every executor)."""
        return msgspec.convert(self._stats, WriterStatus)

    # -- writes ---------------------------------------------------------------------------

    async def write(
        self,
        table: str | TableLocation,
        refs: Sequence[Block],
        key: str | None = None,
        share: str | None = None,
        rows: int | None = None,
    ) -> list[DataFile]:
        """Write ``refs`` (Arrow tables in the raw schema: object refs, or ``blocks.Rows``
        handles of rows inside one) as Parquet files under the table (a local path, or a
        ``TableLocation`` on an object store).

        Returns the files holding these rows (paths relative to the table root),
        uncommitted. Calls that arrive together share one Spark job. Pass the refs inside a
        list so Ray hands the refs, not the data, to this actor. Calls of partitions
        (``key``) with the same ``share`` token may also share files (``DataFile.shared_by``
        names who is in one); without both, the files hold exactly these rows. ``rows``:
        how many rows the refs hold (a write of unknown size goes to Spark once it is up).
        """
        self._stats["calls"] += 1
        return await self._enqueue(as_location(table), list(refs), key, share, rows)

    async def write_parts(
        self, table: str | TableLocation, parts: Sequence[FlushPart], share: str | None = None
    ) -> list[PartWritten]:
        """``write`` for several partitions' flushes in one call (a participant host's
        flushes of one moment, ``share`` its name): each part is its own request - gathered
        with everyone else's into one write, retried alone if that write fails - and gets
        its own files or its own failure, in order."""
        self._stats["calls"] += 1
        location = as_location(table)
        futures = [self._enqueue(location, list(p.refs), p.key, share, p.rows) for p in parts]
        done = await asyncio.gather(*futures, return_exceptions=True)
        return [
            PartWritten(error=f"{type(r).__name__}: {r}")
            if isinstance(r, BaseException)
            else PartWritten(files=r)
            for r in done
        ]

    def _enqueue(
        self,
        table: TableLocation,
        refs: list[Block],
        key: str | None,
        share: str | None,
        rows: int | None,
    ) -> asyncio.Future[list[DataFile]]:
        """Queue one request for the drain loop; its future gets the request's files."""
        if self._stopped:
            raise RuntimeError(f"writer {self._app_name} was stopped")
        if self._spark is None and self._problem is not None and not self._spark_optional:
            raise RuntimeError(f"writer {self._app_name}: {self._problem}")
        self._ensure_draining()
        future: asyncio.Future[list[DataFile]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(table, refs, future, key, share, rows))
        assert self._wakeup is not None
        self._wakeup.set()
        return future

    async def write_many(
        self, table: str | TableLocation, groups: Sequence[Sequence[Block]]
    ) -> list[list[DataFile]]:
        """``write`` for several groups at once (one Spark job); files per group, in order."""
        return list(await asyncio.gather(*(self.write(table, refs) for refs in groups)))

    # -- merge-on-read key searches ---------------------------------------------------------

    async def find_rows(self, job: SearchJob) -> list[np.ndarray]:
        """A merge-on-read round's key search (``write_modes.key_search``): on Spark's
        executors once Spark is up (the writes' rule: the load started it), else in this
        process, off the event loop either way."""
        if self._spark is not None and self._start_failure() is None and self._start_task_done():
            self._stats["spark_searches"] += 1
            return list(await self._run_in_spark_thread(search_on_spark, self._spark, job))
        self._stats["searches_here"] += 1
        return await asyncio.to_thread(search_here, job)

    def _start_task_done(self) -> bool:
        return self._start_task is not None and self._start_task.done()

    async def _drain_loop(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            # Let the other flushes of the same END-COMMIT arrive: ms here vs ~0.5 s a job.
            await self._gather()
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            by_table: dict[TableLocation, list[_Request]] = {}
            for request in batch:
                by_table.setdefault(request.table, []).append(request)
            for table, requests in by_table.items():
                try:
                    here = self._writes_here(requests)
                    if not here:
                        await self._ensure_spark()  # raises if Spark did not start
                    await self._write_requests(table, requests, here)
                except Exception as exc:  # never let the loop die: callers would hang
                    if exc is not self._start_failure():  # that one was logged
                        log.exception("writer %s: unexpected error", self._app_name)
                    self._fail(requests, exc)

    def _spark_started(self, task: asyncio.Future[None]) -> None:
        """Spark is up: watch it from now on. A start that failed fails the writes from
        now on (``when_needed``: they go on here), and ``problem`` says why (status)."""
        if task.cancelled() or self._stopped:
            return
        if (failure := task.exception()) is not None:
            problem = f"Spark did not start: {type(failure).__name__}: {_causes(failure)}"
            if self._spark_optional:
                problem += " (writes go on in the writer's process)"
            self._set_problem(problem)
            log.error("writer %s: %s", self._app_name, self._problem)
            log.debug("writer %s: Spark's start failed", self._app_name, exc_info=failure)
        else:
            self._watch_task = asyncio.ensure_future(self._watch_spark())

    def _start_failure(self) -> BaseException | None:
        task = self._start_task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    def _writes_here(self, requests: list[_Request]) -> bool:
        """Whether these requests are written in this process: not a transform's (Spark
        SQL runs it); every write until Spark is up (or started: ``when_needed``), after
        that one of at most ``write_here_max_rows`` rows."""
        if self._needs_spark_sql():
            return False
        if self._start_task is None or not self._start_task.done():
            return True
        if self._start_failure() is not None:
            # with_pipeline: a writer whose Spark failed refuses writes (start() fails);
            # when_needed: it was writing without Spark, and goes on (status: ``problem``)
            return self._spark_optional
        rows = [r.rows for r in requests]
        return all(n is not None for n in rows) and sum(n or 0 for n in rows) <= self._here_max_rows

    async def _watch_spark(self) -> None:
        """Exit the process (Ray restarts the actor with a new Spark) once Spark cannot run a
        job any more (RayDP's master lost) or has stayed an executor short of what it started
        with for ``executor_lost_s`` (``ExecutorWatch``); keep ``problem`` current."""
        loop = asyncio.get_running_loop()
        while not self._stopped:
            await asyncio.sleep(SPARK_CHECK_S)
            if self._stopped or self._spark is None or self._watch is None:
                return
            registered = await loop.run_in_executor(
                None, registered_executors, self._spark, self._app_name
            )
            self._stats["executors"] = registered
            verdict = self._watch.observe(time.monotonic(), registered)
            if verdict.problem != self._problem:
                log.warning("writer %s: %s", self._app_name, verdict.problem or "recovered")
            self._set_problem(verdict.problem)
            if verdict.restart and not self._stopped:
                log.error("writer %s: %s; restarting with a new Spark", self._app_name, verdict)
                os._exit(1)  # not exit_actor(): that is a clean exit, which Ray never restarts

    async def _gather(self) -> None:
        """Wait while flushes keep arriving: the participants' END-COMMIT flushes reach us
        spread over tens of ms (more with more partitions), and each Spark job costs
        ~0.5 s, so one job per round needs a debounce, not a fixed window. Capped at
        ``gather_max_s`` so a steady stream of flushes is still written."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        seen = -1
        while len(self._pending) != seen and loop.time() - started < self._gather_max_s:
            seen = len(self._pending)
            await asyncio.sleep(self._gather_window_s)

    async def _write_requests(
        self, table: TableLocation, requests: list[_Request], here: bool = False
    ) -> None:
        try:
            result = await self._spark_write(
                table,
                [r.refs for r in requests],
                [r.key for r in requests],
                [r.share for r in requests],
                here,
            )
        except Exception as exc:
            if len(requests) == 1:
                self._fail(requests, exc)
                return
            # One bad request must not fail the others: retry them one by one.
            log.warning(
                "gathered write of %d requests failed (%s); retrying singly", len(requests), exc
            )
            for request in requests:
                await self._write_requests(table, [request], here)
            return
        for request, files in zip(requests, result.files, strict=True):
            if not request.future.done():
                request.future.set_result(files)

    async def _spark_write(
        self,
        table: TableLocation,
        groups: list[list[Block]],
        keys: list[str | None] | None = None,
        shares: list[str | None] | None = None,
        here: bool = False,
    ) -> WriteResult:
        loop = asyncio.get_running_loop()
        table_schema = None
        if self._table_schema is not None:
            table_schema = await loop.run_in_executor(None, self._table_schema)
        routing = self._routing
        if routing is not None and isinstance(routing.formats, PublishedFormats):
            # Spark's tasks get plain formats, with the keys published so far
            formats = await loop.run_in_executor(None, routing.formats.refresh)
            routing = dataclasses.replace(routing, formats=formats)
        if routing is not None and self._route_schemas is not None:
            schemas = await loop.run_in_executor(self._here_thread, self._route_schemas)
            routing = dataclasses.replace(routing, schemas=schemas)
            self._stats["route_schema_reads"] = self._route_schemas.reads
        args = (table, groups, RAW_RECORD_SCHEMA, self._format, table_schema, keys, shares)
        if here:  # the same write as Spark's, in this process
            started = time.monotonic()
            done = await loop.run_in_executor(
                self._here_thread, functools.partial(write_groups_here, *args, routing=routing)
            )
            if self._route_schemas is not None:
                self._route_schemas.changed(done.schema_changes)
            self._stats["writes_here"] += 1
            self._stats["last_write_here_s"] = round(done.seconds, 3)
            self._start_spark_if_busy(started, time.monotonic())
            return done
        result: WriteResult = await self._run_in_spark_thread(
            functools.partial(write_groups, self._spark, *args, routing=routing)
        )
        if self._route_schemas is not None:
            self._route_schemas.changed(result.schema_changes)
        self._stats["spark_writes"] += 1
        self._stats["spark_jobs"] += len(result.job_ids)
        self._stats["last_job_ids"] = result.job_ids
        self._stats["last_groups"] = len(groups)
        self._stats["last_write_s"] = round(result.seconds, 3)
        self._stats["last_prepare_s"] = round(result.prepare_seconds, 3)
        self._stats["last_spark_s"] = round(result.spark_seconds, 3)
        return result

    def _start_spark_if_busy(self, started: float, ended: float) -> None:
        """``when_needed``: count a write made here; start Spark once they keep us busy."""
        if self._busy is None or self._start_task is not None:
            return
        self._busy.wrote(started, ended)
        verdict = self._busy.verdict(ended)
        if verdict.start and not self._stopped:
            self._stats["spark_started_because"] = verdict.reason
            log.info("writer %s: starting Spark: %s", self._app_name, verdict.reason)
            self._ensure_spark()

    @staticmethod
    def _fail(requests: list[_Request], exc: BaseException) -> None:
        for request in requests:
            if not request.future.done():
                request.future.set_exception(exc)

    async def close(self) -> None:
        """Stop Spark (its master and executor actors); the actor itself stays up until it
        is killed. ``PipelineHandle.stop`` calls it first, so the JVMs shut down cleanly
        instead of outliving the writer. Pending writes fail; later ones are refused."""
        self._stopped = True
        if self._drain_task is not None:
            self._drain_task.cancel()
        self._fail(self._pending, RuntimeError(f"writer {self._app_name} was stopped"))
        self._pending = []
        start = self._start_task
        if start is not None and not start.done():
            # stopped while Spark starts (writes were made here meanwhile): let it come up,
            # briefly, so that its JVMs are stopped rather than left behind
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(start), CLOSE_WAITS_FOR_START_S)
        if self._spark is not None:
            await self._run_in_spark_thread(stop_spark)
            self._spark = None
        release(self._reservation)
        self._reservation = None


def start_writer(
    name: str,
    namespace: str = names.NAMESPACE,
    *,
    spark: SparkSettings | None = None,
    warm_up: bool = True,
    wait: bool = True,
    timeout_s: float = 180.0,
    warm_up_table: TableLocation | None = None,
    placement: Placement | None = None,
    record_format: RecordFormat | None = None,
    table_schema: Callable[[], pa.Schema] | None = None,
    routing: RoutedWrite | None = None,
    route_schemas: RouteSchemas | None = None,
) -> ray.actor.ActorHandle:
    """Get or create the named, detached, always-restarted writer actor.

    ``name`` is ``names.writer(pipeline)``. With ``wait`` (default) this blocks until Spark is
    started and warmed up (~20-30 s on 2 cores), so the first round pays no start-up cost.
    ``placement`` places the writer and its executors (default: spread over the nodes).
    ``spark``: its executors and their waits (``rc.SparkSettings``; default one executor).
    ``record_format``: how the source's values are decoded (on the executors, in each
    write's one job); None or raw: rows are written as read. ``table_schema``: reads the
    table's schema now (``TableCommitter.current_schema``), which a typed write decodes
    against; required with a typed ``record_format``. ``routing``: a sink with routes
    (``RoutedWrite``), whose tables' schemas ``route_schemas`` reads instead.
    """
    placement = placement or Placement()
    handle = (
        ray_internals.actor_class(WriterActor)
        .options(
            name=name,
            namespace=namespace,
            lifetime="detached",
            max_restarts=-1,
            get_if_exists=True,
            **placement.actor_options("writer"),
        )
        .remote(
            name,
            spark,
            warm_up,
            placement_group_strategy=placement.spark_group_strategy,
            warm_up_table=warm_up_table,
            record_format=record_format,
            table_schema=table_schema,
            routing=routing,
            route_schemas=route_schemas,
        )
    )
    if wait:
        ray.get(handle.ready.remote(), timeout=timeout_s)
    return handle
