"""Coordinator actor ``<pipeline>/coordinator``: runs the rounds of one sink pipeline.

A thin shell around ``protocol.coordinator.Coordinator``. At (re)start it claims a new epoch
in the table - from then on no older coordinator can commit (I3) - reads the committed
offsets (I2) and lets the machine send the first START. Table IO (commit, reload, vacuum) runs
in a worker thread so messages keep flowing while delta-rs or pyiceberg works; a commit that does not
return within ``write_timeout_s`` is reported as failed, and the machine reloads the table
rather than guess whether it landed. That read also says how the failed commit ended -
committed after all, refused as fenced, not committed - in one log line and in status
(``protocol.commit_outcome``); a timed-out commit's thread that returns later logs how it
ended too.

Outages outside Ray are waited out and shown in status (``outages``): the table's store
failing is seen here - a light probe (``storage.check``, one attempt) every 2 s, claim,
commit and reload errors, every round discarded (the machine's ``RoundDiscarded``) - and a
broker that cannot be reached is reported by the readers (``outage``). When to probe, which
upkeep job is due and when an outage has lasted ``give_up_after_s`` without a break are the
decisions of a second pure machine, ``protocol.housekeeping.Housekeeping``; this actor carries
out its chores. On ``StopRounds`` the coordinator stops its rounds (committing nothing more)
and its status says ``gave_up`` with the reason. A table another writer broke under the
pipeline (dropped, schema changed, offsets moved backwards: ``TableBrokenError``) stops the
rounds at once, the same way, with that reason.

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
import functools
import logging
import statistics
import time
from collections.abc import Iterable
from typing import Any

import ray

from rayconnect.actors import directory, names
from rayconnect.config.sink import SinkPipelineConfig
from rayconnect.errors import TableRecoveryError
from rayconnect.metrics import SinkMetrics
from rayconnect.protocol.commit_outcome import CommitOutcome, FailedCommit, judge, late_line
from rayconnect.protocol.coordinator import Coordinator
from rayconnect.protocol.effects import (
    Broadcast,
    CommitTable,
    Fenced,
    GiveUp,
    PartitionsRetired,
    Ready,
    ReloadTable,
    RoundDiscarded,
    RoundFinished,
    SendMessage,
    Stopped,
)
from rayconnect.protocol.host_rounds import HostAddresses
from rayconnect.protocol.housekeeping import (
    TABLE_STORE,
    Chore,
    Housekeeping,
    ProbeStore,
    RunUpkeep,
    StopRounds,
)
from rayconnect.protocol.messages import HostRound, Message
from rayconnect.protocol.offset_range import OffsetsOutOfRange
from rayconnect.protocol.status import PipelineStatus, RoundCounts
from rayconnect.protocol.upkeep import Job
from rayconnect.tables.base import (
    TableBrokenError,
    TableUpkeep,
)
from rayconnect.tables.round_committer import RoundCommitter, RoundLanded
from rayconnect.tables.sink_tables import open_round_committer
from rayconnect.write_modes.key_search import SearchOnWriter

log = logging.getLogger(__name__)

MAX_TICK_S = 0.25


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class CoordinatorActor:
    async def __init__(self, config: SinkPipelineConfig, partitions: list[str]) -> None:  # type: ignore[misc]  # Ray awaits an async actor's __init__
        from rayconnect.tables.factory import (
            open_upkeep,
            route_upkeep_schedule,
            upkeep_schedule,
        )

        self.config = config
        routed = config.sink.routes is not None
        #: one table, or the tables of the routes (each committed by its own committer):
        #: the same contract either way
        #: merge-on-read rounds search their keys in the writer (Spark's executors once up)
        self.key_search = SearchOnWriter(names.writer(config.name), names.NAMESPACE)
        self.committer: RoundCommitter = open_round_committer(config, self.key_search)
        self.upkeep = open_upkeep(config.sink, config.name, config.record_format())
        # one clock for probes, upkeep and outages: the wall clock readers report outages in
        self.housekeeping = Housekeeping(
            upkeep_schedule(config.sink, time.time()),
            config.give_up_after_s,
            time.time(),
            routes=route_upkeep_schedule(config.sink) if routed else None,
        )
        #: route table -> its upkeep, opened (and its table configured) at its first job
        self._route_upkeep: dict[str, TableUpkeep] = {}
        self.upkeep_log: collections.deque[dict[str, Any]] = collections.deque(maxlen=20)
        # one thread per job kind at most (the schedule runs one of each at a time)
        self._upkeep_pool = concurrent.futures.ThreadPoolExecutor(2, "table-upkeep")
        self.machine = Coordinator(
            config.name,
            partitions,
            config.commit,
            offsets_out_of_range=config.source.offsets_out_of_range,
        )
        self.hosts: dict[str, Any] = {}  # participant host name -> handle, looked up lazily
        self._host_names: dict[str, str] = {}  # partition key -> its host's name
        self._addresses = HostAddresses(self._host_name)
        self.started_at = time.time()
        self.table_version: int | None = None
        self.round_durations: collections.deque[float] = collections.deque(maxlen=1000)
        self.end_to_starts: collections.deque[float] = collections.deque(maxlen=1000)
        self.commit_latencies: collections.deque[float] = collections.deque(maxlen=1000)
        self.records_committed = 0
        #: partition -> bad records in the dead-letter table (read with the offsets)
        self.dead_letters: dict[str, int] = {}
        self.fenced: str | None = None
        #: the commit that failed or timed out, until the table read after it says how it ended
        self._failed_commit: FailedCommit | None = None
        #: the thread of a commit that timed out, while it runs on
        self._late_commit: asyncio.Future[RoundLanded] | None = None
        self.last_failed_commit: CommitOutcome | None = None
        self._metrics = SinkMetrics(config.name)  # dashboard metrics (rayconnect.metrics)
        self._recovered = asyncio.Event()
        self._recovery_failed = asyncio.Event()  # a claim failed (``_error`` says how)
        self._stopped = asyncio.Event()  # the machine's Stopped: a stop asked for is done
        self._error: str | None = None
        self.gave_up: str | None = None  # the housekeeping's StopRounds
        self._round_duration: float | None = None  # of the last RoundFinished
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        # Started here, not by a call: Ray re-runs __init__ when it restarts this actor.
        loop = asyncio.get_running_loop()
        self._main_task = loop.create_task(self._main())
        self._probe_pool = concurrent.futures.ThreadPoolExecutor(1, "table-store-probe")
        self._housekeeping_task = loop.create_task(self._housekeep())
        if routed:
            self._table_lag_task = loop.create_task(self._export_table_lag())

    # -- life cycle ------------------------------------------------------------------------

    async def _main(self) -> None:
        claimed = await self._claim_until_done()
        if claimed is None:  # gave up before the first round
            return
        epoch, offsets, cut = claimed
        await self._apply(lambda: self.machine.recover(epoch, offsets, time.monotonic(), cut))
        self._do(self.housekeeping.recovered(time.time()))  # before any round can finish
        self._recovered.set()
        while self.fenced is None:
            if self.gave_up is not None:
                log.error("coordinator %s: %s; no further round", self.config.name, self.gave_up)
                await self._apply(lambda: self.machine.stop(False, time.monotonic()))
                return
            deadline = self.machine.next_deadline()
            wait = MAX_TICK_S if deadline is None else deadline - time.monotonic()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, min(wait, MAX_TICK_S)))
            await self._apply(lambda: self.machine.tick(time.monotonic()))
            self._metrics.rounds(self.machine.status())  # dashboard metrics
            now = time.time()
            outages = self.housekeeping.outages
            self._metrics.outage(max((o.lasted(now) for o in outages), default=0.0))

    async def _claim_until_done(self) -> tuple[int, dict[str, int], int | None] | None:
        """Claim a new epoch and read the offsets (and the committed cut); a table that
        cannot be reached yet is retried, not fatal, so a restarted coordinator waits out a
        storage hiccup - until it gives up (None)."""
        while self.gave_up is None:
            try:
                epoch, offsets, self.table_version, cut = await asyncio.to_thread(self._claim)
                self._error = None
                self._store(None)
                return epoch, offsets, cut
            except Exception as e:
                self._error = f"recovery failed: {type(e).__name__}: {e}"
                self._recovery_failed.set()  # a start() waiting in ready(fail_fast) ends now
                self._store(self._error)
                log.warning("coordinator %s: %s", self.config.name, self._error)
                await asyncio.sleep(1.0)
        log.error("coordinator %s: %s; no round at all", self.config.name, self.gave_up)
        return None

    def _claim(self) -> tuple[int, dict[str, int], int, int | None]:
        self.committer.ensure_table()
        changed = self.upkeep.configure_table()
        if changed:
            log.info("coordinator %s: table properties set: %s", self.config.name, changed)
        epoch = self.committer.claim_epoch()
        # Every partition this pipeline ever committed: one that joins later (a topic added
        # back) must start from the table, not from the starting-offset policy.
        offsets = self.committer.committed_offsets(None)
        self._read_dead_letters()
        return epoch, offsets, self.committer.version(), self._committed_cut()

    def _committed_cut(self) -> int | None:
        """Consistent cuts: the newest cut in the table(s), which no later cut may be at or
        below (``Coordinator.recover``); not read at all without them."""
        return self.committer.committed_cut() if self.config.commit.consistent_cuts else None

    # -- housekeeping: probes, upkeep, give-up (the decisions are protocol.housekeeping's) --

    async def _housekeep(self) -> None:
        """Tick the housekeeping machine until it gives up; its chores run beside."""
        while self.gave_up is None:
            self._do(self.housekeeping.tick(time.time()))
            await asyncio.sleep(MAX_TICK_S)

    async def _export_table_lag(self) -> None:
        """Set each route table's lag gauge every ``TABLE_LAG_EVERY_S``. The high
        watermarks are the readers' (they fetch them); the offsets each table's own. Best
        effort: a reader that does not answer leaves its tables' last value."""
        from rayconnect.metrics import TABLE_LAG_EVERY_S
        from rayconnect.protocol.table_offsets import table_lag

        while self.fenced is None and self.gave_up is None:
            await asyncio.sleep(TABLE_LAG_EVERY_S)
            hws: dict[str, int | None] = {}
            try:
                readers = await asyncio.to_thread(  # GCS look-ups: blocking
                    directory.pipeline_actors, self.config.name, "reader"
                )
                for actor in readers:
                    report = await asyncio.wait_for(actor.status.remote(), TABLE_LAG_EVERY_S)
                    for key, p in report.partitions.items():
                        hws[key] = p.high_watermark
            except Exception as e:  # a reader restarting: try again next time
                log.debug("coordinator %s: table lag not known: %s", self.config.name, e)
                continue
            tables = self.committer.table_offsets()  # copies: a commit thread may update them
            self._metrics.table_lag({name: table_lag(o, hws) for name, o in tables.items()})

    def _do(self, chores: list[Chore]) -> None:
        """Carry out the housekeeping's chores. Never waits (it is called while an effect
        of the rounds is carried out): IO goes to tasks, and the rounds stop in ``_main``."""
        loop = asyncio.get_running_loop()
        for chore in chores:
            if isinstance(chore, ProbeStore):
                loop.create_task(self._probe_store(chore))
            elif isinstance(chore, RunUpkeep):
                loop.create_task(self._run_upkeep(chore.job, chore.table))
            elif isinstance(chore, StopRounds):
                self.gave_up = chore.reason
                self._wake.set()
            else:
                raise TypeError(f"coordinator cannot carry out {chore!r}")

    def _store(self, error: str | None) -> None:
        """The table's store failed (``error``) in a claim, commit or reload, or worked."""
        self._do(self.housekeeping.failing(TABLE_STORE, error, time.time()))

    async def _probe_store(self, probe: ProbeStore) -> None:
        """Does the table's store answer? (``storage.check``: one attempt.)"""
        from rayconnect.storage.check import check_table_store

        location = self.config.sink.location()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._probe_pool, check_table_store, location, probe.timeout_s
            )
            error = None
        except Exception as e:
            error = str(e) or type(e).__name__
        self._do(self.housekeeping.probe_finished(error, time.time()))

    async def offsets_out_of_range(self, report: OffsetsOutOfRange) -> None:
        """A reader's word: a partition's table offset lies outside its log."""
        await self._apply(lambda: self.machine.offsets_out_of_range(report, time.monotonic()))

    async def outage(self, what: str, reason: str | None, since: float | None = None) -> None:
        """A reader's word on its broker: unreachable since ``since`` (wall clock) for
        ``reason``, or reachable again (``reason`` None)."""
        self._do(self.housekeeping.failing(what, reason, time.time(), since))

    async def ready(self, timeout_s: float = 120.0, *, fail_fast: bool = False) -> bool:
        """Wait until the coordinator claimed its epoch and sent the first START.

        ``fail_fast`` (``start()``): a failed recovery raises ``TableRecoveryError`` with the
        table's error at once, instead of being retried until ``timeout_s`` (a restarted
        coordinator retries for ever: its store may be coming back; a starting pipeline's
        store was checked a moment ago, so its table's error is the answer)."""
        waits = [asyncio.ensure_future(self._recovered.wait())]
        if fail_fast:
            waits.append(asyncio.ensure_future(self._recovery_failed.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if self._recovered.is_set():
            return True
        if fail_fast and self._recovery_failed.is_set():
            why = (self._error or "").removeprefix("recovery failed: ")
            raise TableRecoveryError(
                f"pipeline {self.config.name!r} cannot start: recovering its table "
                f"{self.config.sink.path} failed: {why}"
            )
        raise RuntimeError(f"coordinator not ready in {timeout_s} s: {self._error}")

    # -- inputs ----------------------------------------------------------------------------

    async def deliver(self, *messages: Message) -> None:
        """HOST-WRITE-STATUS (or a lone WRITE-STATUS), REQUEST-COMMIT, DRAINED, ROUND-LOST or
        PARTICIPANT-STARTED from the participants of one host, in order: one step of the
        actor for all of them."""
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
            name = self._host_names[key] = names.host_of(self.config, key)
        return name

    def _host(self, name: str) -> Any:
        handle = self.hosts.get(name)
        if handle is None:
            handle = self.hosts[name] = ray.get_actor(name, namespace=names.NAMESPACE)
        return handle

    async def last_round(self, commit: bool = True, timeout_s: float = 60.0) -> PipelineStatus:
        """Stop: with ``commit``, the round in progress is ended now and finished first. The
        machine decides; this waits (at most ``timeout_s``) for its ``Stopped``."""
        await self._apply(lambda: self.machine.stop(commit, time.monotonic()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), timeout_s)
        self._main_task.cancel()
        return await self.status()

    async def close(self) -> None:
        self._main_task.cancel()
        self._housekeeping_task.cancel()
        self._probe_pool.shutdown(wait=False, cancel_futures=True)
        self._upkeep_pool.shutdown(wait=False, cancel_futures=True)

    # -- effects ---------------------------------------------------------------------------

    async def _apply(self, step) -> None:
        async with self._lock:
            await self._carry_out(step())

    async def _carry_out(self, ready: Ready) -> None:
        # Messages of one Ready go out as one call per participant host, one HOST-ROUND per
        # message naming the host's partitions (protocol.host_rounds): the ACK of a round
        # and the next round's START share a call (a round then costs each host three Ray
        # calls: START+ACK, END, and the HOST-WRITE-STATUS back). Nothing in a Ready waits
        # on them.
        outbox: dict[str, list[HostRound]] = {}
        retired: list[PartitionsRetired] = []  # after the messages: the ACK goes out first
        for effect in ready:
            if isinstance(effect, Broadcast):
                self._addresses.address(effect.message, effect.to, outbox)
            elif isinstance(effect, SendMessage):
                self._addresses.address(effect.message, (effect.to,), outbox)
            elif isinstance(effect, CommitTable):
                asyncio.get_running_loop().create_task(self._commit(effect))
            elif isinstance(effect, ReloadTable):
                asyncio.get_running_loop().create_task(self._reload())
            elif isinstance(effect, GiveUp):
                log.error("coordinator %s: %s", self.config.name, effect.reason)
                self.gave_up = effect.reason
                self._wake.set()
            elif isinstance(effect, Fenced):
                self.fenced = f"epoch {effect.epoch} fenced by epoch {effect.table_epoch}"
                log.warning("coordinator %s: %s; stopping", self.config.name, self.fenced)
                self._main_task.cancel()
            elif isinstance(effect, PartitionsRetired):
                retired.append(effect)
            elif isinstance(effect, Stopped):
                self._stopped.set()
                self._main_task.cancel()
            elif isinstance(effect, RoundFinished):
                self._round_finished(effect)
            elif isinstance(effect, RoundDiscarded):
                self._do(self.housekeeping.round_discarded(effect.reason, time.time()))
            else:
                raise TypeError(f"coordinator cannot carry out {effect!r}")
        for name, messages in outbox.items():
            try:
                self._host(name).deliver.remote(messages)
            except ValueError:  # not created yet, or retired: the round copes
                log.warning("coordinator %s: no participant host %s", self.config.name, name)
        for effect in retired:
            asyncio.get_running_loop().create_task(self._retire(effect))

    def _round_finished(self, effect: RoundFinished) -> None:
        """Rounds work (the outage watch hears it; committed files count for upkeep)."""
        self._do(self.housekeeping.round_finished(effect.files, time.time()))
        if effect.end_to_start_s is not None:
            self.end_to_starts.append(effect.end_to_start_s)
        if effect.version is not None:
            self._round_duration = effect.duration_s
            if effect.duration_s is not None:
                self.round_durations.append(effect.duration_s)

    async def _commit(self, commit: CommitTable) -> None:
        started = time.monotonic()
        timeout_s = self.config.commit.write_timeout_s
        # shielded: a commit that times out runs on in its thread, and says how it ended
        running = asyncio.get_running_loop().run_in_executor(
            None, self.committer.commit_round, commit
        )
        try:
            landed = await asyncio.wait_for(asyncio.shield(running), timeout_s)
        except Exception as e:
            # wait_for's own timeout, not a TimeoutError the commit raised (a socket's)
            raised = running.exception() if running.done() and not running.cancelled() else None
            timed_out = isinstance(e, TimeoutError) and e is not raised
            reason = f"{type(e).__name__}: " + (
                f"no answer within write_timeout_s={timeout_s:g} s" if timed_out else str(e)
            )
            if isinstance(e, TableBrokenError):
                await self._stop_broken(reason)
                return
            failed = FailedCommit(
                epoch=commit.epoch,
                txn_id=commit.txn_id,
                expected=dict(commit.expected),
                offsets=dict(commit.offsets),
                error=reason,
                timed_out=timed_out,
            )
            self._failed_commit = failed
            if timed_out:
                self._late_commit = running
                running.add_done_callback(functools.partial(self._late_return, failed, started))
            log.warning("coordinator %s: commit failed: %s", self.config.name, reason)
            self._store(f"commit failed: {reason}")
            await self._apply(lambda: self.machine.commit_failed(reason, time.monotonic()))
            return
        self.commit_latencies.append(time.monotonic() - started)
        self.table_version = version = landed.version
        dead = [f for f in commit.files if f.dead_letters]
        records = sum(f.records for f in commit.files) - sum(f.records for f in dead)
        self.records_committed += records
        for f in dead:
            for key, count in f.dead_letters.items():
                self.dead_letters[key] = self.dead_letters.get(key, 0) + count
                self._metrics.dead_letters(key, count)
        await self._apply(lambda: self.machine.commit_succeeded(version, time.monotonic()))
        self._metrics.committed(  # dashboard metrics
            commit.offsets,
            records,
            self.commit_latencies[-1],
            self._round_duration,
        )
        if landed.tables:
            committed = {name: (t.version, t.rows) for name, t in landed.tables.items()}
            self._metrics.tables_committed(committed, time.time())
            files = {name: t.files for name, t in landed.tables.items()}
            self._do(self.housekeeping.tables_committed(files, time.time()))

    def _late_return(
        self, failed: FailedCommit, started: float, running: asyncio.Future[RoundLanded]
    ) -> None:
        """A commit that timed out returned after all: say how it ended."""
        if self._late_commit is running:
            self._late_commit = None
        if running.cancelled():
            return
        error = running.exception()
        version = running.result().version if error is None else None
        seconds = time.monotonic() - started
        reason = None if error is None else f"{type(error).__name__}: {error}"
        log.warning(
            "coordinator %s: %s", self.config.name, late_line(failed, seconds, version, reason)
        )

    async def _reload(self) -> None:
        while self.gave_up is None:
            try:
                offsets, epoch, version, cut = await asyncio.to_thread(self._read_table)
                self.committer.check_reloaded(self.machine.offsets, offsets, self.machine.resetting)
                break
            except TableBrokenError as e:
                await self._stop_broken(f"{type(e).__name__}: {e}")
                return
            except Exception as e:
                self._error = f"reload failed: {type(e).__name__}: {e}"
                self._store(self._error)
                await asyncio.sleep(1.0)
        else:
            return  # gave up: no further round
        self._error = None
        self._store(None)
        self.table_version = version
        self._tell_failed_commit(offsets, epoch)
        await self._apply(
            lambda: self.machine.table_reloaded(
                offsets, time.monotonic(), table_epoch=epoch, committed_cut=cut
            )
        )

    def _tell_failed_commit(self, offsets: dict[str, int], epoch: int) -> None:
        """After a failed commit, the table read says how it ended: one line, and status."""
        failed, self._failed_commit = self._failed_commit, None
        if failed is None:  # a reload after a round that committed nothing
            return
        late = self._late_commit
        running = late is not None and not late.done()
        self.last_failed_commit = outcome = judge(failed, offsets, epoch, running)
        log.warning("coordinator %s: %s", self.config.name, outcome.line())

    def _read_dead_letters(self) -> None:
        """Totals of the dead-letter table (what earlier incarnations committed too), so the
        status's ``dead_letters`` counts the table, not this coordinator's commits ({} for
        a raw table)."""
        self.dead_letters = self.committer.dead_letter_counts()

    def _read_table(self) -> tuple[dict[str, int], int, int, int | None]:
        self._read_dead_letters()
        return (
            self.committer.committed_offsets(None),
            self.committer.epoch(),
            self.committer.version(),
            self._committed_cut(),
        )

    async def _stop_broken(self, reason: str) -> None:
        """Another writer broke the table's assumptions: no further round, for good."""
        if self.gave_up is None:
            self._do(self.housekeeping.table_broken(reason, time.time()))
            self._error = self.gave_up

    def _upkeep_of(self, table: str | None) -> TableUpkeep:
        """The upkeep of route table ``table`` (None: of the sink's own table). Blocking: a
        route table's is opened, and its table's properties set, at its first job."""
        if table is None:
            return self.upkeep
        upkeep = self._route_upkeep.get(table)
        if upkeep is None:
            from rayconnect.tables.factory import open_upkeep
            from rayconnect.tables.route_formats import sink_formats

            formats = sink_formats(self.config)
            upkeep = open_upkeep(
                self.config.sink.route_table(table), self.config.name, formats(table)
            )
            upkeep.configure_table()
            self._route_upkeep[table] = upkeep
        return upkeep

    def _run_job(self, job: Job, table: str | None) -> dict[str, Any]:
        upkeep = self._upkeep_of(table)
        if job is Job.TIDY:
            return upkeep.tidy()
        metrics = upkeep.compact()
        return {
            k: metrics.get(k) for k in ("numFilesAdded", "numFilesRemoved", "numBatches", "races")
        }

    async def _run_upkeep(self, job: Job, table: str | None = None) -> None:
        """One upkeep job (of route table ``table``) in the upkeep thread; its outcome goes
        back to the schedule."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        where = {} if table is None else {"table": table}
        try:
            result = await loop.run_in_executor(self._upkeep_pool, self._run_job, job, table)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            log.warning("coordinator %s: %s failed: %s", self.config.name, job.value, error)
            self._do(self.housekeeping.upkeep_finished(job, error, time.time(), table))
            self.upkeep_log.append({"job": job.value, **where, "ok": False, "error": error})
            return
        self._do(self.housekeeping.upkeep_finished(job, None, time.time(), table))
        result.update(job=job.value, **where, ok=True, s=round(time.monotonic() - started, 3))
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
            committed_cut=machine.committed_cut,
            last_error=machine.last_error,
            error=self._error,
            fenced=self.fenced,
            last_failed_commit=self.last_failed_commit,
            gave_up=self.gave_up,
            out_of_range=machine.out_of_range,
            give_up_after_s=self.config.give_up_after_s,
            outages=tuple(self.housekeeping.describe(time.time())),
            upkeep=self.housekeeping.upkeep_status(),
            upkeep_by_table=self.housekeeping.route_upkeep_status(),
            upkeep_recent=tuple(self.upkeep_log),
            tables=self.committer.table_status(),
            key_searches=self.key_search.counts,
        )


def _median(values: Iterable[float]) -> float | None:
    """The median of the recent values, or None before there is any."""
    recent = list(values)
    return statistics.median(recent) if recent else None
