"""Source task actor ``<pipeline>/task/<i>``: one SourceTask, one transactional producer.

``TaskRunner`` carries out the effects of ``protocol.source_task.SourceTaskMachine`` (the
lifecycle of seed 000) with aiokafka; the actor only hosts it. A runner never retries in
place: any failure aborts what is open, stops the producer and raises; the actor then ends
its process so that Ray restarts it (``max_restarts=-1``), and the fresh incarnation's
initTransactions fences the dead one and resumes from the offsets that committed.

The runner is a plain class so that a test (or a benchmark) can run a task without Ray -
which is also how the zombie test keeps an old incarnation running after a new one starts.

Restarts ride out an outage of the target (every incarnation fails to reach it, Ray starts
the next). Since when the task has failed without a break - no incarnation in between got
as far as fencing its zombies and reading its offsets - is kept in Ray's key-value store;
once that lasts ``give_up_after_s`` (``protocol.outages``) the task gives up: it stays up,
failed, and its status says ``gave_up`` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import msgspec
import ray
from aiokafka.errors import MessageSizeTooLargeError

from rayconnect import ray_internals
from rayconnect.actors import names
from rayconnect.config.source import SourceSettings
from rayconnect.errors import OffsetsOutOfRangeError
from rayconnect.kafka import compat
from rayconnect.kafka.batched_send import Outgoing, check_size, send_batched
from rayconnect.kafka.discovery import client_properties
from rayconnect.kafka.offsets_store import combined_offsets, offset_key, offset_value
from rayconnect.kafka.topics import ensure_topics
from rayconnect.kafka.transactions import (
    confirm_stored,
    fence,
    init_transactions,
    producer,
    stop_quietly,
)
from rayconnect.metrics import SourceMetrics
from rayconnect.protocol.outages import OutageWatch
from rayconnect.protocol.source_status import (
    PastError,
    SourceTaskReport,
    current_error,
    with_error,
)
from rayconnect.protocol.source_task import (
    AbortTransaction,
    Acknowledge,
    BeginTransaction,
    Close,
    CommitTransaction,
    Discard,
    Effect,
    End,
    Fail,
    Failure,
    InitTransactions,
    Poll,
    PollResult,
    ProduceSegment,
    Ready,
    Report,
    SendOffsets,
    SendToDeadLetter,
    SourceTaskConfig,
    SourceTaskMachine,
)
from rayconnect.source_tasks.base import (
    BadRecord,
    RecordMetadata,
    SourceRecord,
    SourceTask,
    SourceTaskContext,
    TransactionContext,
    dead_letter,
    encode_partition,
    encode_record,
)

log = logging.getLogger(__name__)

#: feeds the result of a reported effect back to the machine
Feed = Callable[[], Ready]

#: which effect's result each Report names
_REPORTED: dict[Report, type[Effect]] = {
    Report.INIT: InitTransactions,
    Report.POLL: Poll,
    Report.COMMIT: CommitTransaction,
    Report.ABORT: AbortTransaction,
}


class TaskFailed(RuntimeError):
    """The task failed (its open transaction aborted); restart it to resume."""


class _SendFailed(Exception):
    """Record ``index`` of poll ``poll_id`` could not be sent: the machine decides."""

    def __init__(self, poll_id: int, index: int, kind: Failure, reason: str) -> None:
        super().__init__(reason)
        self.poll_id, self.index, self.kind, self.reason = poll_id, index, kind, reason


def _kind(e: BaseException) -> Failure:
    """The failure kind of an error, as far as the machine cares."""
    return Failure.FENCED if isinstance(e, compat.FENCED_ERRORS) else Failure.ERROR


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class TaskRunner:
    """Runs one source task: ``await run()`` until stopped (returns) or failed (raises)."""

    def __init__(
        self,
        settings: SourceSettings,
        index: int,
        task: SourceTask,
        *,
        transactional: bool = True,
        warning: str | None = None,
    ) -> None:
        self.settings = settings
        self.index = index
        self.task = task
        self.transactional = transactional
        self.warning = warning
        self.machine = SourceTaskMachine(
            SourceTaskConfig(
                settings.transaction_boundary,
                settings.transaction_boundary_interval_s,
                dead_letter=settings.dead_letter_topic is not None,
            )
        )
        self.txn_context = (
            TransactionContext() if settings.transaction_boundary == "connector" else None
        )
        self.client = client_properties(settings.target.properties)
        self.producer: Any = None
        self.started = asyncio.Event()
        #: why the task refused to start for good (its offsets are outside its source):
        #: a restart would only fail again
        self.refused: str | None = None
        #: each poll's records until all of them are acknowledged or discarded
        self._polls: dict[int, list[SourceRecord]] = {}
        self._unsettled: dict[int, int] = {}
        #: the open transaction's records, by the batch (its future) they went in
        self._sent: list[tuple[asyncio.Future[Any], list[SourceRecord]]] = []
        self._offset_futures: list[asyncio.Future[Any]] = []
        self._wants_record_commits = type(task).commit_record is not SourceTask.commit_record
        #: how many topics ``task.topics()`` named when they were last made
        self._topics_made = 0

    @property
    def transactional_id(self) -> str:
        return self.settings.transactional_id(self.index)

    @property
    def bad_record(self) -> str | None:
        """Why a record could not be written and had nowhere to go: the task stopped."""
        return self.machine.bad_record

    def status(self) -> SourceTaskReport:
        source = lag = None
        with contextlib.suppress(Exception):  # a task's own numbers never break status
            source = self.task.metrics() or None
        with contextlib.suppress(Exception):
            lag = self.task.lag()
        machine = self.machine.status()
        with contextlib.suppress(Exception):
            helpers = self.task.helper_records_committed()
            machine = msgspec.structs.replace(
                machine, records_committed=machine.records_committed + helpers
            )
        return SourceTaskReport(
            task=self.index,
            **msgspec.structs.asdict(machine),
            transactional_id=self.transactional_id if self.transactional else None,
            exactly_once=self.transactional,
            warning=self.warning,
            source=source,
            lag=lag,
        )

    def stop(self) -> None:
        """Ask to stop: the open transaction is committed (aborted for ``connector``)."""
        self.machine.stop(time.monotonic())

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Carry out a Ready, feed back the result its ``report`` names, repeat."""
        ready = self.machine.start(time.monotonic())
        while True:
            feed: Feed | None = None
            reported = _REPORTED.get(ready.report)
            try:
                for effect in ready.effects:
                    result = await self._carry_out(effect)
                    if reported is not None and isinstance(effect, reported):
                        feed = result
            except TaskFailed:
                raise
            except _SendFailed as e:
                log.warning("task %s/%d: %s", self.settings.name, self.index, e.reason)
                ready = self.machine.send_failed(
                    e.poll_id, e.index, e.kind, e.reason, time.monotonic()
                )
                continue
            except Exception as e:
                log.warning("task %s/%d: %s", self.settings.name, self.index, _reason(e))
                ready = self.machine.failed(_reason(e), time.monotonic(), _kind(e))
                continue
            if ready.report is Report.NONE:
                return
            if feed is None:
                raise AssertionError(f"source task: no result for {ready.report} in {ready}")
            ready = feed()

    async def _carry_out(self, effect: Effect) -> Feed | None:
        now = time.monotonic
        if isinstance(effect, InitTransactions):
            return await self._init()
        if isinstance(effect, Poll):
            result = await self._poll(effect.poll_id)
            return lambda: self.machine.polled(result, now())
        if isinstance(effect, BeginTransaction):
            if self.transactional:
                await self.producer.begin_transaction()
        elif isinstance(effect, ProduceSegment):
            await self._produce_segment(effect)
        elif isinstance(effect, SendToDeadLetter):
            record = self._polls[effect.poll_id][effect.index]
            self._sent.append((await self._dead_letter(record, effect.reason), [record]))
        elif isinstance(effect, SendOffsets):
            topic = self.settings.own_offsets_topic
            for pkey, offset in effect.offsets.items():
                fut = await self.producer.send(
                    topic, offset_value(offset), key=offset_key(self.settings.name, pkey)
                )
                self._offset_futures.append(fut)
        elif isinstance(effect, CommitTransaction):
            try:
                await self._commit()
            except Exception as e:
                reason, kind = _reason(e), _kind(e)
                return lambda: self.machine.commit_failed(reason, now(), kind)
            return lambda: self.machine.committed(now())
        elif isinstance(effect, AbortTransaction):
            await self._abort(best_effort=effect.best_effort)
            return lambda: self.machine.aborted(now())
        elif isinstance(effect, Acknowledge):
            await self._acknowledge(effect.ranges)
        elif isinstance(effect, Discard):
            self._forget(effect.ranges)
        elif isinstance(effect, Close):
            with contextlib.suppress(Exception):
                await self.task.stop()
            await self._stop_producer()
        elif isinstance(effect, Fail):
            await self._stop_producer()
            with contextlib.suppress(Exception):
                await self.task.stop()
            raise TaskFailed(effect.reason)
        else:
            raise TypeError(f"source task cannot carry out {effect!r}")
        return None

    # -- effects ---------------------------------------------------------------------------

    async def _init(self) -> Feed:
        """initTransactions (fences our zombies, aborts what they left open), THEN read the
        committed offsets, then start the task: in this order the offsets are final."""
        s = self.settings
        try:
            self.producer = producer(
                s.target.bootstrap_servers,
                self.transactional_id if self.transactional else None,
                request_timeout_ms=int(s.commit_timeout_s * 1000),
                **client_properties(s.producer_properties),
                **self.client,
            )
            await init_transactions(self.producer, s.commit_timeout_s)
            helpers = self.task.helper_transactional_ids(self.transactional_id)
            if helpers and self.transactional:
                await fence(s.target.bootstrap_servers, helpers, s.commit_timeout_s, **self.client)
            offsets, _ = await combined_offsets(
                s.target.bootstrap_servers,
                s.own_offsets_topic,
                s.global_offsets_topic,
                s.name,
                **self.client,
            )
            context = SourceTaskContext(
                s.name, self.index, s.tasks, offsets, self.txn_context, s, self.transactional
            )
            await self.task.start(context)
            # its topics exist before its first record (kafka.topics: not the broker's pick)
            specs = self.task.topics()
            await ensure_topics(s.target.bootstrap_servers, specs, **self.client)
            self._topics_made = len(specs)
        except Exception as e:
            reason = f"start failed: {_reason(e)}"
            if isinstance(e, OffsetsOutOfRangeError):  # no restart can help: a person must
                self.refused = reason
            return lambda: self.machine.failed(reason, time.monotonic())
        self.started.set()
        return lambda: self.machine.initialized(
            {k: v for k, v in offsets.items()}, time.monotonic()
        )

    async def _poll(self, poll_id: int) -> PollResult:
        """Poll the task; keep its records for the Sends, tell the machine their source
        offsets and where the task asked to end a transaction (the machine cuts)."""
        records = list(await self.task.poll() or ())
        await self._new_topics()
        requests = self.txn_context.take() if self.txn_context is not None else []
        ends: list[tuple[End, int]] = []
        start = 0
        for kind, record in requests:
            start = len(records) if record is None else _index_of(records, record, start) + 1
            ends.append((End.COMMIT if kind == "commit" else End.ABORT, start))
        if records:
            self._polls[poll_id] = records
            self._unsettled[poll_id] = len(records)
        return PollResult(_source_offsets(records), ends)

    async def _new_topics(self) -> None:
        """Topics the task added while running (a table added to a publication) are made
        before the records of the poll that added them are sent."""
        specs = self.task.topics()
        if len(specs) > self._topics_made:
            s = self.settings
            await ensure_topics(s.target.bootstrap_servers, specs, **self.client)
        self._topics_made = len(specs)

    async def _produce_segment(self, effect: ProduceSegment) -> None:
        """Send the segment's records in whole record batches (kafka/batched_send: a
        ``send`` per record costs more than most tasks spend making the record). Each
        record is checked first; a bad one interrupts the segment after the records
        before it went out, so the machine's dead letter keeps their order."""
        records = self._polls[effect.poll_id]
        ready: list[Outgoing] = []
        failure: _SendFailed | None = None
        for index in range(effect.start, effect.stop):
            record = records[index]
            try:
                value, key, headers = encode_record(record)
                check_size(self.producer, key, value, headers)
            except (BadRecord, MessageSizeTooLargeError) as e:
                reason = str(e) or type(e).__name__
                failure = _SendFailed(effect.poll_id, index, Failure.BAD_RECORD, reason)
                break
            ready.append(
                Outgoing(
                    record.topic, record.partition, key, value, headers, record.every_partition
                )
            )
        try:
            batches = await send_batched(self.producer, ready)
        except Exception as e:
            raise _SendFailed(effect.poll_id, effect.start, _kind(e), _reason(e)) from e
        start = effect.start
        self._sent += [(b.future, [records[start + i] for i in b.members]) for b in batches]
        if failure is not None:
            raise failure

    async def _dead_letter(self, record: Any, reason: str) -> asyncio.Future[Any]:
        """Route a record that cannot be written to the dead-letter topic, in the open
        transaction (so it is there exactly once, with its source offset)."""
        topic = self.settings.dead_letter_topic
        assert topic is not None  # the machine sends dead letters only if there is one
        log.warning("task %s/%d: dead letter: %s", self.settings.name, self.index, reason)
        value, key, headers = dead_letter(record, reason)
        return await self.producer.send(topic, value, key=key, headers=headers)

    async def _commit(self) -> None:
        timeout = self.settings.commit_timeout_s
        futures = [future for future, _ in self._sent] + self._offset_futures
        if futures:
            confirm_stored(await asyncio.wait_for(asyncio.gather(*futures), timeout))
        if self.transactional:
            await asyncio.wait_for(self.producer.commit_transaction(), timeout)
        self._offset_futures = []

    async def _abort(self, *, best_effort: bool) -> None:
        """A requested abort must work; on the way to a failure it is brief and best effort
        (the machine leaves it out for a fenced producer: tansu never answers a zombie)."""
        self._offset_futures = []
        if not self.transactional:
            if not best_effort:  # nothing to undo: what was sent is in Kafka
                log.warning(
                    "task %s/%d: abort without transactions", self.settings.name, self.index
                )
            return
        timeout = (
            min(5.0, self.settings.commit_timeout_s)
            if best_effort
            else self.settings.commit_timeout_s
        )
        try:
            await asyncio.wait_for(self.producer.abort_transaction(), timeout)
        except Exception:
            if not best_effort:
                raise
            log.warning("task %s/%d: abort failed", self.settings.name, self.index, exc_info=True)

    async def _acknowledge(self, ranges: tuple[tuple[int, int, int], ...]) -> None:
        sent, self._sent = self._sent, []
        if self._wants_record_commits:
            for future, batch in sent:  # batch by batch (partition order is kept)
                md = future.result()  # the batch's: its offset is its first record's
                for i, record in enumerate(batch):
                    await self.task.commit_record(
                        record, RecordMetadata(md.topic, md.partition, md.offset + i, md.timestamp)
                    )
        self._forget(ranges)
        await self.task.commit()

    def _forget(self, ranges: tuple[tuple[int, int, int], ...]) -> None:
        """These records are settled (committed or aborted): drop a poll once all are."""
        self._sent = [] if ranges else self._sent
        for poll_id, start, stop in ranges:
            left = self._unsettled[poll_id] - (stop - start)
            if left > 0:
                self._unsettled[poll_id] = left
            else:
                del self._unsettled[poll_id], self._polls[poll_id]

    async def _stop_producer(self) -> None:
        if self.producer is not None:
            await stop_quietly(self.producer)


def _index_of(records: list[SourceRecord], record: SourceRecord, start: int) -> int:
    for i in range(start, len(records)):
        if records[i] is record:
            return i
    raise ValueError("TransactionContext: the record is not among those this poll returned")


def _source_offsets(records: list[SourceRecord]) -> list[tuple[str, Any] | None]:
    """Each record's (encoded source partition, source offset), None without a partition.
    A task usually gives all its records one partition object: it is encoded once."""
    out: list[tuple[str, Any] | None] = []
    last: Any = None
    encoded = ""
    for r in records:
        partition = r.source_partition
        if partition is None:
            out.append(None)
            continue
        if partition is not last:
            last, encoded = partition, encode_partition(partition)
        out.append((encoded, r.source_offset))
    return out


# -- the actor ------------------------------------------------------------------------------

_KV_NS = "rayconnect"
#: how often a task actor records its source's lag as metrics
LAG_REPORT_S = 2.0
#: how long status waits for the source to say its lag while the task is not streaming
LAG_AT_REST_TIMEOUT_S = 5.0


def _kv_key(pipeline: str, index: int, what: str) -> bytes:
    return f"{names.task(pipeline, index)}/{what}".encode()


def _kv_get(key: bytes) -> bytes | None:
    """Ray's GCS key-value store keeps what an incarnation must tell the next one (the
    error that killed it, how many restarts): the process that knew it is gone."""
    try:
        return ray_internals.kv_get(key, namespace=_KV_NS)
    except Exception:
        return None


def _kv_put(key: bytes, value: bytes) -> None:
    with contextlib.suppress(Exception):
        ray_internals.kv_put(key, value, namespace=_KV_NS)


def freeze_start_up() -> None:
    """For a process that is one task's alone: what importing and Ray made lives as long as
    the process, and a task's stream of short-lived records makes the collector run its full
    collections often - each would walk all of that again. Moved out of its way."""
    gc.collect()
    gc.freeze()


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class SourceTaskActor:
    async def __init__(  # type: ignore[misc]  # Ray awaits an async actor's __init__
        self,
        settings: SourceSettings,
        index: int,
        task: SourceTask,
        transactional: bool,
        warning: str | None,
    ) -> None:
        freeze_start_up()
        self.settings = settings
        self.index = index
        self.runner = TaskRunner(
            settings, index, task, transactional=transactional, warning=warning
        )
        restarts_key = _kv_key(settings.name, index, "restarts")
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self.restarts = int(_kv_get(restarts_key) or b"0") + 1
        else:  # a new start: no restart, no outage or error of an earlier run counts
            self.restarts = 0
            _kv_put(_kv_key(settings.name, index, "failing_since"), b"")
            _kv_put(self._errors_key, b"[]")
        _kv_put(restarts_key, str(self.restarts).encode())
        self._failed: str | None = None
        self.gave_up: str | None = None
        # Started here, not by a call: Ray re-runs __init__ when it restarts this actor.
        self._main = asyncio.get_running_loop().create_task(self._run())
        self._lag = asyncio.get_running_loop().create_task(self._report_lag())

    async def _report_lag(self) -> None:
        """The task's lag as metrics every LAG_REPORT_S (a gauge per pipeline and task)."""
        metrics = SourceMetrics(self.settings.name, self.index)
        while not self._main.done():
            with contextlib.suppress(Exception):  # a task's own numbers never stop it
                if (lag := self.runner.task.lag()) is not None:
                    metrics.lag(lag.bytes, lag.seconds)
            await asyncio.sleep(LAG_REPORT_S)

    async def _run(self) -> None:
        try:
            await self.runner.run()
        except Exception as e:
            self._failed = str(e)
            errors = with_error(self._past_errors(), PastError(error=str(e), at=time.time()))
            _kv_put(self._errors_key, msgspec.json.encode(errors))
            if self.runner.bad_record is not None:
                log.error(
                    "task %s: failed for good, its transaction aborted: %s",
                    names.task(self.settings.name, self.index),
                    self.runner.bad_record,
                )
                return  # stays up, failed, so status shows why; a restart would loop
            if self.runner.refused is not None:
                self.gave_up = self.runner.refused
                log.error("task %s: %s", names.task(self.settings.name, self.index), e)
                return  # stays up, failed, so status shows why; a restart would loop
            self.gave_up = self._give_up(str(e))
            if self.gave_up is not None:
                log.error("task %s: %s", names.task(self.settings.name, self.index), self.gave_up)
                return  # stays up, failed, so status shows why
            log.error(
                "task %s: failed (%s); exiting so Ray restarts it",
                names.task(self.settings.name, self.index),
                e,
            )
            await asyncio.sleep(0.05)  # let the log line out
            os._exit(1)

    def _give_up(self, reason: str) -> str | None:
        """This incarnation failed: has the task now failed for ``give_up_after_s`` without
        a break? An incarnation that started (reached the target) is a break."""
        key = _kv_key(self.settings.name, self.index, "failing_since")
        now = time.time()
        kept = _kv_get(key)
        since = now if self.runner.started.is_set() or not kept else float(kept)
        _kv_put(key, repr(since).encode())
        watch = OutageWatch(self.settings.give_up_after_s)
        target = self.settings.target.bootstrap_servers
        watch.failing(f"task {self.index} (target {target})", reason, now, since)
        decision = watch.decide(now)
        return None if decision is None else decision.reason

    async def ready(self, timeout_s: float = 120.0) -> bool:
        """Wait until the task has fenced its zombies, read its offsets and started."""
        waiter = asyncio.ensure_future(self.runner.started.wait())
        done, _ = await asyncio.wait(
            {waiter, self._main}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        waiter.cancel()
        if self.runner.started.is_set():
            return True
        raise RuntimeError(f"task {self.index} not started: {self._failed or 'timeout'}")

    @property
    def _errors_key(self) -> bytes:
        return _kv_key(self.settings.name, self.index, "errors")

    def _past_errors(self) -> tuple[PastError, ...]:
        """The errors that ended this task's incarnations (the KV store keeps them: the
        processes that knew them are gone)."""
        kept = _kv_get(self._errors_key)
        with contextlib.suppress(Exception):
            return msgspec.json.decode(kept or b"[]", type=tuple[PastError, ...])
        return ()

    async def status(self) -> SourceTaskReport:
        s = self.runner.status()
        errors = self._past_errors()
        started = self.runner.started.is_set()
        lag = s.lag
        # not running at all (failed, starting): ask the source itself - a connection to
        # it per call, so not while the task runs (a snapshot: no lag to tell yet)
        if lag is None and (self._main.done() or not started):
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                at_rest = asyncio.to_thread(self.runner.task.lag_at_rest)
                lag = await asyncio.wait_for(at_rest, LAG_AT_REST_TIMEOUT_S)
        return msgspec.structs.replace(
            s,
            lag=lag,
            restarts=self.restarts,
            last_error=current_error(
                s.last_error or self._failed or self._problem(), errors, started
            ),
            errors=errors,
            gave_up=self.gave_up,
            pid=os.getpid(),
        )

    def _problem(self) -> str | None:
        """What the source says is wrong while it runs on (the Postgres source: tables it
        does not capture, and why)."""
        problem = getattr(self.runner.task, "problem", None)
        with contextlib.suppress(Exception):
            return problem() if problem is not None else None
        return None

    async def close(self, timeout_s: float = 60.0) -> SourceTaskReport:
        """Stop: commit (or, for connector boundaries, abort) the open transaction, then
        stop the task and the producer."""
        self.runner.stop()
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._main), timeout_s)
        self._main.cancel()
        return await self.status()

    async def release(self, timeout_s: float = 60.0) -> None:
        """Stop (as ``close``: an incarnation Ray started since must not hold the source),
        then free what the source keeps for the pipeline (SourceTask.release)."""
        await self.close(timeout_s)
        await self.runner.task.release()
