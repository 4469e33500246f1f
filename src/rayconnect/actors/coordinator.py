"""Coordinator actor ``<pipeline>/coordinator``: runs the rounds of one sink pipeline.

A thin shell around ``protocol.coordinator.Coordinator``. At (re)start it claims a new epoch
in the table - from then on no older coordinator can commit (I3) - reads the committed
offsets (I2) and lets the machine send the first START. Table IO (commit, reload, vacuum) runs
in a worker thread so messages keep flowing while delta-rs or pyiceberg works; a commit that does not
return within ``write_timeout_s`` is reported as failed, and the machine reloads the table
rather than guess whether it landed.

Outages outside Ray are waited out and shown in status (``outages``): the table's store
failing is seen here - a light probe every 2 s (``storage.check``, one attempt, 5 s timeout:
writes that hang on a store that is gone say nothing by themselves), claim, commit and reload
errors, every round discarded - and a broker that cannot be reached is reported by the
readers (``outage``). ``protocol.outages.OutageWatch``
decides when one has lasted ``give_up_after_s`` without a break; then the coordinator stops
its rounds (committing nothing more) and its status says ``gave_up`` with the reason. A table
another writer broke under the pipeline (dropped, schema changed, offsets moved backwards:
``TableBrokenError``) stops the rounds at once, the same way, with that reason.

Table upkeep (compaction, checkpoints, log cleanup, vacuum; ``protocol.upkeep`` says when) runs
here, in a thread of its own beside the rounds, not in an actor of its own: the coordinator
is where rounds commit, so it knows how many files arrived and when without asking anyone;
a compaction needs no fence (it changes no data, and delta-rs lets it and a round pass each
other in both orders: ``tables.delta_upkeep``), so nothing is gained by placing, restarting
and fencing one more actor; and a coordinator restart re-creates it with the rounds. The
thread holds its own table objects; a slow compaction never delays a commit.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import statistics
import time
from collections.abc import Iterable
from typing import Any

import ray

from rayconnect.actors import names
from rayconnect.formats.settings import dead_letter_partition, is_dead_letter_file
from rayconnect.metrics import SinkMetrics
from rayconnect.pipelines.sink_config import SinkPipelineConfig
from rayconnect.protocol.coordinator import Coordinator, CoordinatorStatus
from rayconnect.protocol.effects import (
    Broadcast,
    CommitTable,
    Fenced,
    PartitionsRetired,
    Ready,
    ReloadTable,
    SendMessage,
    Stopped,
)
from rayconnect.protocol.messages import Message
from rayconnect.protocol.outages import OutageWatch
from rayconnect.protocol.status import PipelineStatus, RoundCounts
from rayconnect.protocol.upkeep import Job
from rayconnect.tables.base import TableBrokenError, check_not_behind

log = logging.getLogger(__name__)

MAX_TICK_S = 0.25
#: what the outage watch calls the coordinator's own troubles
TABLE_STORE = "table store"
ROUNDS = "rounds (every one discarded)"
STORE_PROBE_PERIOD_S = 2.0
STORE_PROBE_TIMEOUT_S = 5.0


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class CoordinatorActor:
    async def __init__(self, config: SinkPipelineConfig, partitions: list[str]) -> None:
        from rayconnect.tables.factory import open_committer, open_upkeep, upkeep_schedule

        self.config = config
        self.committer = open_committer(config.sink, config.name, config.record_format())
        self.upkeep = open_upkeep(config.sink, config.name, config.record_format())
        self.schedule = upkeep_schedule(config.sink, time.monotonic())
        self.upkeep_log: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)
        # one thread per job kind at most (the schedule runs one of each at a time)
        self._upkeep_pool = concurrent.futures.ThreadPoolExecutor(2, "table-upkeep")
        self.machine = Coordinator(
            config.name,
            partitions,
            config.commit,
        )
        self.hosts: dict[str, Any] = {}  # participant host name -> handle, looked up lazily
        self._host_names: dict[str, str] = {}  # partition key -> its host's name
        self.started_at = time.time()
        self.table_version: int | None = None
        self.round_durations: collections.deque[float] = collections.deque(maxlen=1000)
        self.end_to_starts: collections.deque[float] = collections.deque(maxlen=1000)
        self.commit_latencies: collections.deque[float] = collections.deque(maxlen=1000)
        self.records_committed = 0
        #: partition -> bad records in the dead-letter table (read with the offsets)
        self.dead_letters: dict[str, int] = {}
        self.fenced: str | None = None
        self._metrics = SinkMetrics(config.name)  # dashboard metrics (rayconnect.metrics)
        self._recovered = asyncio.Event()
        self._stopped = asyncio.Event()  # the machine's Stopped: a stop asked for is done
        self._error: str | None = None
        self.outages = OutageWatch(config.give_up_after_s)
        self.gave_up: str | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # Started here, not by a call: Ray re-runs __init__ when it restarts this actor.
        self._main_task = asyncio.get_running_loop().create_task(self._main())
        self._probe_pool = concurrent.futures.ThreadPoolExecutor(1, "table-store-probe")
        self._probe_task = asyncio.get_running_loop().create_task(self._probe_store())

    # -- life cycle ------------------------------------------------------------------------

    async def _main(self) -> None:
        claimed = await self._claim_until_done()
        if claimed is None:  # gave up before the first round
            return
        epoch, offsets = claimed
        await self._apply(lambda: self.machine.recover(epoch, offsets, time.monotonic()))
        self._recovered.set()
        while self.fenced is None:
            if await self._gave_up():
                return
            deadline = self.machine.next_deadline()
            wait = MAX_TICK_S if deadline is None else deadline - time.monotonic()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, min(wait, MAX_TICK_S)))
            await self._apply(lambda: self.machine.tick(time.monotonic()))
            self._metrics.rounds(self.machine.status())  # dashboard metrics
            now = time.time()
            self._metrics.outage(max((o.lasted(now) for o in self.outages.outages), default=0.0))

    async def _claim_until_done(self) -> tuple[int, dict[str, int]] | None:
        """Claim a new epoch and read the offsets; a table that cannot be reached yet is
        retried, not fatal, so a restarted coordinator waits out a storage hiccup - until
        it gives up (None)."""
        while True:
            try:
                epoch, offsets, self.table_version = await asyncio.to_thread(self._claim)
                self._error = None
                self.outages.fine(TABLE_STORE)
                return epoch, offsets
            except Exception as e:
                self._error = f"recovery failed: {type(e).__name__}: {e}"
                self.outages.failing(TABLE_STORE, self._error, time.time())
                log.warning("coordinator %s: %s", self.config.name, self._error)
                if await self._gave_up():
                    return None
                await asyncio.sleep(1.0)

    def _claim(self) -> tuple[int, dict[str, int], int]:
        self.committer.ensure_table()
        if self.upkeep is not None:
            changed = self.upkeep.configure_table()
            if changed:
                log.info("coordinator %s: table properties set: %s", self.config.name, changed)
        epoch = self.committer.claim_epoch()
        # Every partition this pipeline ever committed: one that joins later (a topic added
        # back) must start from the table, not from the starting-offset policy.
        offsets = self.committer.committed_offsets(None)
        self._read_dead_letters()
        return epoch, offsets, self.committer.version()

    async def _probe_store(self) -> None:
        """Every ``STORE_PROBE_PERIOD_S``: does the table's store answer? (One probe at a
        time: one that hangs counts as failing until it returns.)"""
        from rayconnect.storage.check import check_table_store

        location = self.config.sink.location()
        loop = asyncio.get_running_loop()
        probe: asyncio.Future[None] | None = None
        while self.gave_up is None:
            if probe is None or probe.done():
                probe = loop.run_in_executor(
                    self._probe_pool, check_table_store, location, STORE_PROBE_TIMEOUT_S
                )
            try:
                await asyncio.wait_for(asyncio.shield(probe), STORE_PROBE_TIMEOUT_S + 1)
                self.outages.fine(TABLE_STORE)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                reason = "no answer" if isinstance(e, TimeoutError) else str(e)
                self.outages.failing(TABLE_STORE, reason, time.time())
            if self._recovered.is_set():
                self._start_due_upkeep()
            await asyncio.sleep(STORE_PROBE_PERIOD_S)

    async def _gave_up(self) -> bool:
        """Has an outage lasted ``give_up_after_s``? Then stop the rounds, for good."""
        if self.gave_up is not None:
            return True
        decision = self.outages.decide(time.time())
        if decision is None:
            return False
        self.gave_up = decision.reason
        log.error("coordinator %s: %s; no further round", self.config.name, self.gave_up)
        if self._recovered.is_set():
            await self._apply(lambda: self.machine.stop(False, time.monotonic()))
        return True

    async def outage(self, what: str, reason: str | None, since: float | None = None) -> None:
        """A reader's word on its broker: unreachable since ``since`` (wall clock) for
        ``reason``, or reachable again (``reason`` None)."""
        if reason is None:
            self.outages.fine(what)
        else:
            self.outages.failing(what, reason, time.time(), since)

    async def ready(self, timeout_s: float = 120.0) -> bool:
        """Wait until the coordinator claimed its epoch and sent the first START."""
        try:
            await asyncio.wait_for(self._recovered.wait(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"coordinator not ready in {timeout_s} s: {self._error}") from None
        return True

    # -- inputs ----------------------------------------------------------------------------

    async def deliver(self, *messages: Message) -> None:
        """WRITE-STATUS, REQUEST-COMMIT, DRAINED, ROUND-LOST or PARTICIPANT-STARTED from the
        participants of one host, in order: one step of the actor for all of them."""
        await self._recovered.wait()
        await self._apply(lambda: self._step_all(messages))

    def _step_all(self, messages: Iterable[Message]) -> Ready:
        """Each message stepped in order; one the machine rejects is logged, and does not
        cost the others their effects."""
        ready: Ready = []
        for message in messages:
            try:
                ready += self.machine.step(message, time.monotonic())
            except Exception:
                log.exception("coordinator %s: %r rejected", self.config.name, message)
        return ready

    async def add_partitions(self, keys: list[str]) -> None:
        """Partitions join (their participants exist): they are in the next START."""
        await self._recovered.wait()
        await self._apply(lambda: self.machine.add_partitions(keys, time.monotonic()))

    async def retire_partitions(self, keys: list[str]) -> None:
        """Partitions leave once a round whose END goes out after now has finished (the
        machine says when, with ``PartitionsRetired``)."""
        await self._recovered.wait()
        await self._apply(lambda: self.machine.retire_partitions(keys, time.monotonic()))

    async def _retire(self, effect: PartitionsRetired) -> None:
        """The machine let these partitions go: their hosts drop them, and a host left with
        none ends."""
        by_host: dict[str, list[str]] = {}
        for key in effect.keys:
            by_host.setdefault(self._host_name(key), []).append(key)
        for name, keys in by_host.items():
            with contextlib.suppress(Exception):
                handle = self._host(name)
                if await handle.retire.remote(keys) == 0:
                    self.hosts.pop(name, None)
                    ray.kill(handle, no_restart=True)
        log.info("coordinator %s: retired %s", self.config.name, list(effect.keys))

    def _host_name(self, key: str) -> str:
        name = self._host_names.get(key)
        if name is None:
            pph = self.config.partitions_per_host
            name = self._host_names[key] = names.participant_host(self.config.name, key, pph)
        return name

    def _host(self, name: str) -> Any:
        handle = self.hosts.get(name)
        if handle is None:
            handle = self.hosts[name] = ray.get_actor(name, namespace=names.NAMESPACE)
        return handle

    async def last_round(self, commit: bool = True, timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop: with ``commit``, the round in progress is ended now and finished first. The
        machine decides; this waits (at most ``timeout_s``) for its ``Stopped``."""
        await self._apply(lambda: self.machine.stop(commit, time.monotonic()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), timeout_s)
        self._main_task.cancel()
        return await self.status()

    async def close(self) -> None:
        self._main_task.cancel()
        self._probe_task.cancel()
        self._probe_pool.shutdown(wait=False, cancel_futures=True)
        self._upkeep_pool.shutdown(wait=False, cancel_futures=True)

    # -- effects ---------------------------------------------------------------------------

    async def _apply(self, step) -> None:
        async with self._lock:
            before = self.machine.status()
            await self._carry_out(step())
            after = self.machine.status()  # one status each side: it copies every partition
            if _rounds_finished(after) > _rounds_finished(before):  # committed or empty
                self.outages.fine(ROUNDS)
                if after.last_end_to_start_s is not None:
                    self.end_to_starts.append(after.last_end_to_start_s)
            elif after.rounds_discarded > before.rounds_discarded:
                self.outages.failing(ROUNDS, after.last_error or "discarded", time.time())

    async def _carry_out(self, ready: Ready) -> None:
        # Messages of one Ready go out as one call per participant host, carrying every
        # partition's messages in order: the ACK of a round and the next round's START share
        # a call (a round then costs each host three Ray calls: START+ACK, END, and the
        # WRITE-STATUS back). Nothing in a Ready waits on them.
        outbox: dict[str, dict[str, list[Message]]] = {}
        retired: list[PartitionsRetired] = []  # after the messages: the ACK goes out first
        for effect in ready:
            if isinstance(effect, Broadcast | SendMessage):
                for key in effect.to if isinstance(effect, Broadcast) else (effect.to,):
                    host = outbox.setdefault(self._host_name(key), {})
                    host.setdefault(key, []).append(effect.message)
            elif isinstance(effect, CommitTable):
                asyncio.get_running_loop().create_task(self._commit(effect))
            elif isinstance(effect, ReloadTable):
                asyncio.get_running_loop().create_task(self._reload())
            elif isinstance(effect, Fenced):
                self.fenced = f"epoch {effect.epoch} fenced by epoch {effect.table_epoch}"
                log.warning("coordinator %s: %s; stopping", self.config.name, self.fenced)
                self._main_task.cancel()
            elif isinstance(effect, PartitionsRetired):
                retired.append(effect)
            elif isinstance(effect, Stopped):
                self._stopped.set()
                self._main_task.cancel()
            else:
                raise TypeError(f"coordinator cannot carry out {effect!r}")
        for name, messages in outbox.items():
            try:
                self._host(name).deliver.remote(messages)
            except ValueError:  # not created yet, or retired: the round copes
                log.warning("coordinator %s: no participant host %s", self.config.name, name)
        for effect in retired:
            asyncio.get_running_loop().create_task(self._retire(effect))

    async def _commit(self, commit: CommitTable) -> None:
        started = time.monotonic()
        try:
            version = await asyncio.wait_for(
                asyncio.to_thread(
                    self.committer.commit,
                    list(commit.files),
                    commit.offsets,
                    commit.expected,
                    commit.metadata,
                    commit.epoch,
                ),
                self.config.commit.write_timeout_s,
            )
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            if isinstance(e, TableBrokenError):
                await self._stop_broken(reason)
                return
            log.warning("coordinator %s: commit failed: %s", self.config.name, reason)
            self.outages.failing(TABLE_STORE, f"commit failed: {reason}", time.time())
            await self._apply(lambda: self.machine.commit_failed(reason, time.monotonic()))
            return
        self.commit_latencies.append(time.monotonic() - started)
        self.table_version = version
        dead = [f for f in commit.files if is_dead_letter_file(f)]
        records = sum(f.records for f in commit.files) - sum(f.records for f in dead)
        self.records_committed += records
        for f in dead:
            key = dead_letter_partition(f)
            self.dead_letters[key] = self.dead_letters.get(key, 0) + f.records
            self._metrics.dead_letters(key, f.records)
        await self._apply(lambda: self.machine.commit_succeeded(version, time.monotonic()))
        duration = self.machine.status().last_round_duration_s
        if duration is not None:
            self.round_durations.append(duration)
        self._metrics.committed(  # dashboard metrics
            commit.offsets,
            records,
            self.commit_latencies[-1],
            duration,
        )
        self.schedule.committed(len(commit.files), time.monotonic())
        self._start_due_upkeep()

    def _start_due_upkeep(self) -> None:
        """Start the upkeep jobs that are due (after a commit, and every store probe: an
        idle pipeline's table still gets tidied, and another writer's OPTIMIZE racing
        the last compaction is still found)."""
        for job in self.schedule.due(time.monotonic()):
            asyncio.get_running_loop().create_task(self._run_upkeep(job))

    async def _reload(self) -> None:
        while self.gave_up is None:
            try:
                offsets, epoch, version = await asyncio.to_thread(self._read_table)
                check_not_behind(self.machine.offsets, offsets)
                break
            except TableBrokenError as e:
                await self._stop_broken(f"{type(e).__name__}: {e}")
                return
            except Exception as e:
                self._error = f"reload failed: {type(e).__name__}: {e}"
                self.outages.failing(TABLE_STORE, self._error, time.time())
                await asyncio.sleep(1.0)
        else:
            return  # gave up: no further round
        self._error = None
        self.table_version = version
        await self._apply(
            lambda: self.machine.table_reloaded(offsets, time.monotonic(), table_epoch=epoch)
        )

    def _read_dead_letters(self) -> None:
        """Totals of the dead-letter table (what earlier incarnations committed too), so the
        status's ``dead_letters`` counts the table, not this coordinator's commits."""
        counts = getattr(self.committer, "dead_letter_counts", None)
        if counts is not None:
            self.dead_letters = counts()

    def _read_table(self) -> tuple[dict[str, int], int, int]:
        self._read_dead_letters()
        return (
            self.committer.committed_offsets(None),
            self.committer.epoch(),
            self.committer.version(),
        )

    async def _stop_broken(self, reason: str) -> None:
        """Another writer broke the table's assumptions: no further round, for good."""
        if self.gave_up is not None:
            return
        self.gave_up = f"table broken: {reason}"
        self._error = self.gave_up
        log.error("coordinator %s: %s; no further round", self.config.name, self.gave_up)
        await self._apply(lambda: self.machine.stop(False, time.monotonic()))

    async def _run_upkeep(self, job: Job) -> None:
        """One upkeep job in the upkeep thread; its outcome goes back to the schedule."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            if job is Job.COMPACT and self.upkeep is not None:
                metrics = await loop.run_in_executor(self._upkeep_pool, self.upkeep.compact)
                result = {
                    k: metrics.get(k)
                    for k in ("numFilesAdded", "numFilesRemoved", "numBatches", "races")
                }
            elif job is Job.TIDY and self.upkeep is not None:
                result = await loop.run_in_executor(self._upkeep_pool, self.upkeep.tidy)
            else:  # Iceberg: its committer expires snapshots itself; vacuum here
                hours = self.config.sink.vacuum_retention_hours
                removed = await loop.run_in_executor(
                    self._upkeep_pool, self.committer.vacuum, hours
                )
                result = {"files_vacuumed": len(removed)}
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            log.warning("coordinator %s: %s failed: %s", self.config.name, job.value, error)
            self.schedule.finished(job, False, time.monotonic(), error)
            self.upkeep_log.append({"job": job.value, "ok": False, "error": error})
            return
        self.schedule.finished(job, True, time.monotonic())
        result.update(job=job.value, ok=True, s=round(time.monotonic() - started, 3))
        self.upkeep_log.append(result)
        log.info("coordinator %s: upkeep %s", self.config.name, result)

    # -- status ----------------------------------------------------------------------------

    async def status(self) -> PipelineStatus:
        """The coordinator's part of the pipeline's status (the handle adds the others')."""
        machine = self.machine.status()
        durations = list(self.round_durations)
        return PipelineStatus(
            pipeline=machine.pipeline,
            state=machine.state,
            epoch=machine.epoch,
            txn_id=machine.txn_id,
            started_at=self.started_at,
            table=self.committer.table_path,
            table_version=self.table_version,
            partitions=machine.partitions,
            waiting_for=machine.waiting_for,
            retiring=machine.retiring,
            offsets=machine.offsets,
            dead_letters=dict(sorted(self.dead_letters.items())),
            # which participant host (actor) holds each partition
            participant_hosts={key: self._host_name(key) for key in machine.partitions},
            rounds_since_start=RoundCounts(
                committed=machine.rounds_committed,
                partial=machine.rounds_partial,
                discarded=machine.rounds_discarded,
                empty=machine.rounds_empty,
                requested=machine.rounds_requested,
                drained=machine.rounds_drained,
            ),
            records_committed_since_start=self.records_committed,
            statuses_rejected_since_start=machine.statuses_rejected,
            messages_ignored_since_start=machine.messages_ignored,
            last_round_duration_s=machine.last_round_duration_s,
            last_end_to_start_s=machine.last_end_to_start_s,
            round_s_median=_median(durations),
            round_s_max=max(durations) if durations else None,
            end_to_start_s_median=_median(self.end_to_starts),
            commit_s_median=_median(self.commit_latencies),
            last_error=machine.last_error,
            error=self._error,
            fenced=self.fenced,
            gave_up=self.gave_up,
            give_up_after_s=self.config.give_up_after_s,
            outages=tuple(self.outages.describe(time.time())),
            upkeep=self.schedule.status(),
            upkeep_recent=tuple(self.upkeep_log),
        )


def _rounds_finished(status: CoordinatorStatus) -> int:
    """Rounds committed (partially or fully) or found empty."""
    return status.rounds_committed + status.rounds_empty


def _median(values: Iterable[float]) -> float | None:
    """The median of the recent values, or None before there is any."""
    recent = list(values)
    return statistics.median(recent) if recent else None
