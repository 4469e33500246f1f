"""Participant host ``<pipeline>/participants/<cluster>/<topic>/<n>``: many participants in
one actor process.

One actor process per partition cost ~57 MB and a Ray worker start each (64 partitions:
7.5 GB, +30 s at start-up). A host keeps one ``protocol.participant.Participant`` machine per
partition - the protocol, its invariants and its simulation stay per partition - and is a
thin shell around all of them: Ray calls and one timer become machine inputs, and each
machine's effects are carried out in order, one Ready at a time (a lock per machine keeps two
Readies of one partition from interleaving at an ``await``; different partitions proceed
side by side). Which partitions share a host is a pure function of the key
(``names.participant_host``: ``partitions_per_host`` partitions of one topic), so nobody has to
remember it.

Peers talk to a host once per message for all its partitions: the coordinator's START/END/ACK
arrive as one ``deliver`` carrying one HOST-ROUND per message (its partitions, the offsets of
those only), the WRITE-STATUS of partitions that report together go back as one
HOST-WRITE-STATUS (``protocol.host_rounds``), in one call with the other messages its
machines emit meanwhile,
a reader hands one ``records`` call per fetch carrying all the host's batches, and the
flushes the machines emit within FLUSH_GATHER_S (a round's END-COMMIT flushes of every
partition) go to the writer as one ``write_parts`` call, each machine hearing of its own part.

Ray restarts a dead host. Its machines are fresh: paused, waiting for the coordinator's next
START, which carries the table's offsets (I2) - so nothing the dead incarnation buffered is
ever reported. The restarted host learns its partitions from the enumerator (partitions that
joined after it was created are not in its constructor's arguments), stops their readers and
tells the coordinator (PARTICIPANT-STARTED), which re-sends a running round's START. Readers
are found through the enumerator; when it is away too (a lost node took both), the machines'
seeks reach no reader. The host tells each machine so (``reader_lost``; a fresh machine
starts so, as a reader may have lived on), and the machine decides when to look for the
reader again and where to steer it once found (``protocol.reader_link``) - a reader that
lived on never asks by itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import ray

from rayconnect import ray_internals
from rayconnect.actors import names
from rayconnect.actors.pieces import FlushPart, PartWritten, Piece
from rayconnect.actors.reader_calls import ReaderCalls
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST, StartingOffsets
from rayconnect.metrics import SinkMetrics
from rayconnect.protocol.actor_status import HostPartitionStatus, HostStatus
from rayconnect.protocol.effects import (
    FindReader,
    Flush,
    Pause,
    Ready,
    Resume,
    Seek,
    SeekToPolicy,
    SendMessage,
    Steer,
)
from rayconnect.protocol.host_rounds import pack_statuses, unpack_rounds
from rayconnect.protocol.messages import HostRound, Message, ParticipantStarted
from rayconnect.protocol.participant import Participant
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import ClusterMetadata, TopicPartition
from rayconnect.storage.location import TableLocation

log = logging.getLogger(__name__)

TICK_S = 0.25
IDLE_TICK_S = 1.0
#: how long a host gathers starting-offset lookups before asking the broker for all of them
POLICY_GATHER_S = 0.05
#: how long a host gathers its machines' messages before sending them to the coordinator
SEND_GATHER_S = 0.005
#: how long a host gathers its machines' flushes before handing them to the writer in one
#: call (every partition flushes at END-COMMIT, within the same input)
FLUSH_GATHER_S = 0.005


class _Slot:
    """One partition in a host: its machine, its lock, its counters, its reader (a handle,
    once looked up) and the lookup its machine asked for (``FindReader``), if under way."""

    __slots__ = ("machine", "lock", "records_in", "flushes", "reader", "finding")

    def __init__(self, key: str, commit: CommitSettings) -> None:
        self.machine = Participant(key, commit)
        self.lock = asyncio.Lock()
        self.records_in = 0
        self.flushes = 0
        self.reader: Any = None
        self.finding: asyncio.Task[None] | None = None


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class ParticipantHostActor:
    async def __init__(  # type: ignore[misc]  # Ray awaits an async actor's __init__
        self,
        pipeline: str,
        name: str,
        keys: list[str],
        table: TableLocation,
        commit: CommitSettings,
        clusters: dict[str, ClusterMetadata],
        starting_offsets: StartingOffsets | dict[str, int] = "earliest",
        partitions_per_host: int = DEFAULT_PARTITIONS_PER_HOST,
        topic_groups: int | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.name = name
        self.table = table
        self.commit = commit
        self.clusters = dict(clusters)
        self.starting_offsets = starting_offsets
        self.partitions_per_host = partitions_per_host
        self.topic_groups = topic_groups
        self.slots: dict[str, _Slot] = {}
        self._reader_calls: dict[str, ReaderCalls] = {}
        self._retired: set[str] = set()
        self._outbox: list[Message] = []  # to the coordinator, sent once per input
        self._send_scheduled = False
        self._flushes: list[tuple[_Slot, Flush]] = []  # to the writer, in one call
        self._flush_scheduled = False
        self._delivering = 0  # coordinator messages being stepped: their flushes wait
        self._policy_batch: dict[str, asyncio.Future[int]] | None = None
        self.writer = ray.get_actor(names.writer(pipeline), namespace=names.NAMESPACE)
        self._coordinator: Any = None
        self._metrics = SinkMetrics(pipeline)  # dashboard metrics (rayconnect.metrics)
        self._idle_exported: dict[str, int] = {}  # partition -> idle rounds last exported
        self.started_at = time.time()
        loop = asyncio.get_running_loop()
        self._ticker = loop.create_task(self._tick_forever())
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        loop.create_task(self._join(keys, learn=restarted))

    # -- membership ------------------------------------------------------------------------

    def _owns(self, key: str) -> bool:
        host = names.participant_host(
            self.pipeline, key, self.partitions_per_host, self.topic_groups
        )
        return host == self.name

    def _slot(self, key: str) -> _Slot | None:
        """The partition's slot. A key this host holds by name but has not heard of - a
        partition that joined while the host restarted - gets a fresh, paused machine, and
        the coordinator hears PARTICIPANT-STARTED for it (before anything the machine says).
        None for a key that is not ours or that retired."""
        slot = self.slots.get(key)
        if slot is None and self._may_hold(key):
            slot = self._create(key)
            self._outbox.append(ParticipantStarted(key))
        return slot

    def _may_hold(self, key: str) -> bool:
        return key not in self._retired and self._owns(key)

    def _create(self, key: str) -> _Slot:
        """A fresh machine, paused, that does not know where its reader is (one that lived
        on reads on): its first tick asks to find it."""
        slot = self.slots[key] = _Slot(key, self.commit)
        slot.machine.reader_lost(time.monotonic())
        return slot

    async def add(self, keys: list[str], clusters: dict[str, ClusterMetadata]) -> int:
        """Partitions join this host (the enumerator found them, or the pipeline starts).
        Idempotent. Returns how many partitions the host holds."""
        self.clusters.update(clusters)
        self._retired.difference_update(keys)
        await self._join(keys)
        return len(self.slots)

    async def retire(self, keys: list[str]) -> int:
        """The coordinator let these partitions go. Returns how many the host still holds
        (none: the caller ends the host)."""
        for key in keys:
            self._retired.add(key)
            self.slots.pop(key, None)
        return len(self.slots)

    async def _join(self, keys: Iterable[str], learn: bool = False) -> None:
        """Fresh machines are paused until START, and do not know their readers: each finds
        its reader and pauses it (a reader that lived on would push batches it drops), then
        the coordinator hears PARTICIPANT-STARTED, and sends a running round's START again
        or stops waiting for an ended one. ``learn``: a restarted host also asks the
        enumerator which partitions it holds now."""
        new = [
            self._create(k).machine.key for k in keys if k not in self.slots and self._may_hold(k)
        ]
        if learn:
            learned = await self._learn_keys()
            new += [
                self._create(k).machine.key
                for k in learned
                if k not in self.slots and self._may_hold(k)
            ]
        if not new:
            return
        slots = [self.slots[k] for k in new]
        for slot in slots:  # the first tick asks for FindReader
            await self._tick(slot)
        await asyncio.gather(*(s.finding for s in slots if s.finding is not None))
        self._outbox.extend(ParticipantStarted(k) for k in new)
        self._send()

    async def _learn_keys(self) -> list[str]:
        try:
            enumerator = ray.get_actor(names.enumerator(self.pipeline), namespace=names.NAMESPACE)
            keys, clusters = await enumerator.partitions_of_host.remote(self.name)
        except (ValueError, ray.exceptions.RayError) as e:
            log.warning("participant host %s: no enumerator to ask: %s", self.name, e)
            return []
        self.clusters.update(clusters)
        return list(keys)

    # -- inputs ----------------------------------------------------------------------------

    async def deliver(self, rounds: list[HostRound]) -> None:
        """Coordinator messages, in order: START-COMMIT, END-COMMIT, ACK-COMMIT, each for
        some of this host's partitions (``HostRound``); every partition's machine steps
        its own, in order. The flushes they emit (every partition's at END-COMMIT) go to
        the writer once all have stepped, in one call, even when some waited for their
        machine's lock."""
        async def one(slot: _Slot, batch: list[Message]) -> None:
            for message in batch:
                await self._step(slot, message)

        self._delivering += 1
        try:
            await self._for_each(unpack_rounds(rounds).items(), one)
        finally:
            self._delivering -= 1
            self._hand_flushes()

    async def records(self, pieces: list[Piece]) -> list[str]:
        """A reader's fetch: the batches of this host's partitions, in offset order per
        partition. Returns the keys whose batches were not taken (the reader reads them
        again)."""
        by_key: dict[str, list[Piece]] = {}
        for piece in pieces:
            by_key.setdefault(piece.key, []).append(piece)
        failed: list[str] = []

        async def one(slot: _Slot, batch: list[Piece]) -> None:
            for p in batch:
                slot.records_in += p.records
                try:
                    await self._take(slot, p)
                except Exception:
                    log.exception("participant host %s: batch of %s not taken", self.name, p.key)
                    failed.append(p.key)
                    return

        await self._for_each(by_key.items(), one)
        return failed

    async def reader_attached(self, reader: Any, keys: list[str]) -> None:
        """A reader (new, or restarted by Ray) serves ``keys``: each machine says where it
        must read from and whether to read, and that steering goes to the reader through the
        same ordered calls as all other steering, before this returns. Were the reader to
        apply an answer itself after this returned, a seek the machine made meanwhile (a
        START after a lost flush) could land first and be undone by the older answer: the
        reader past records the participant waits for, a silent stall."""
        slots = []
        for key in keys:
            slot = self._slot(key)
            if slot is not None:
                slot.reader = reader
                slots.append(slot)
        await asyncio.gather(*(self._attached(s) for s in slots))
        self._send()

    async def status(self) -> HostStatus:
        """Every partition's machine status, its counters and this host's name."""
        return HostStatus(
            host=self.name,
            pid=os.getpid(),
            started_at=self.started_at,
            partitions={
                key: HostPartitionStatus(
                    **msgspec.structs.asdict(slot.machine.status()),
                    records_in=slot.records_in,
                    flushes=slot.flushes,
                    host=self.name,
                )
                for key, slot in sorted(self.slots.items())
            },
        )

    async def close(self) -> None:
        self._ticker.cancel()

    # -- effects ---------------------------------------------------------------------------

    async def _for_each(self, items: Iterable[tuple[str, Any]], one: Callable) -> None:
        """Run ``one(slot, batch)`` for every partition side by side, then send what the
        machines said to the coordinator, in one call."""
        work = []
        for key, batch in items:
            slot = self._slot(key)
            if slot is not None:
                work.append(one(slot, batch))
        try:
            await asyncio.gather(*work)
        finally:
            self._send()

    async def _tick_forever(self) -> None:
        """One timer for every machine: tick those whose deadline (flush by age) passed, at
        most every TICK_S; every machine at least every IDLE_TICK_S. Idle partitions cost
        a comparison per tick, not a process waking up."""
        longest = min(IDLE_TICK_S, self.commit.flush_max_age_s)
        last_sweep = time.monotonic()
        while True:
            now = time.monotonic()
            deadlines = [d for s in self.slots.values() if (d := s.machine.next_deadline())]
            wait = min(deadlines, default=now + longest) - now
            await asyncio.sleep(min(max(wait, TICK_S), longest))
            now = time.monotonic()
            sweep = now - last_sweep >= longest
            if sweep:
                last_sweep = now
            due = [
                slot
                for slot in list(self.slots.values())
                if sweep or ((d := slot.machine.next_deadline()) is not None and d <= now)
            ]
            try:
                await asyncio.gather(
                    *(self._tick(s) for s in due)
                )
            except Exception:
                log.exception("participant host %s: tick failed", self.name)
            self._send()
            if sweep:
                self._export_idle_rounds()

    def _export_idle_rounds(self) -> None:
        """The liveness gauge of each partition whose value changed since last exported."""
        for key, slot in self.slots.items():
            idle = slot.machine.idle_rounds_behind
            if self._idle_exported.get(key, 0) != idle:
                self._idle_exported[key] = idle
                self._metrics.idle_rounds(key, idle)

    async def _find_reader(self, slot: _Slot) -> None:
        """``FindReader``: look the reader up (outside the machine's lock: the lookup may wait
        for a restarting enumerator) and tell the machine what was found; it steers the
        reader to what it wants by then."""
        machine = slot.machine
        try:
            reader = await self._reader(machine.key)
            if self.slots.get(machine.key) is not slot:
                return  # retired meanwhile
            if reader is None:
                await self._apply(slot, lambda: machine.reader_not_found(time.monotonic()))
            else:
                await self._apply(slot, lambda: machine.reader_found(time.monotonic()))
                log.info("participant host %s: reader of %s found", self.name, machine.key)
        except Exception:
            log.exception("participant host %s: finding %s's reader failed", self.name, machine.key)
            await self._apply(slot, lambda: machine.reader_not_found(time.monotonic()))
        finally:
            slot.finding = None
            self._send()

    async def _apply(self, slot: _Slot, step: Callable[[], Ready]) -> None:
        async with slot.lock:
            await self._carry_out(slot, step())

    async def _attached(self, slot: _Slot) -> None:
        await self._apply(slot, lambda: slot.machine.reader_attached(time.monotonic()))

    async def _tick(self, slot: _Slot) -> None:
        await self._apply(slot, lambda: slot.machine.tick(time.monotonic()))

    async def _step(self, slot: _Slot, message: Message) -> None:
        await self._apply(slot, lambda: slot.machine.step(message, time.monotonic()))

    async def _take(self, slot: _Slot, p: Piece) -> None:
        await self._apply(
            slot,
            lambda: slot.machine.records(
                p.first,
                p.next_offset,
                p.records,
                p.nbytes,
                p.batch,
                time.monotonic(),
                caught_up=p.caught_up,
                high_watermark=p.high_watermark,
                cut_lsn=p.cut_lsn,
            ),
        )

    async def _carry_out(self, slot: _Slot, ready: Ready) -> None:
        """Carry out one Ready in order. Once a steering effect misses the reader the rest
        of this Ready's steering is skipped (a Resume after a lost Seek would read from the
        wrong place) and the machine hears ``reader_lost``."""
        machine = slot.machine
        missed = False
        for effect in ready:
            if isinstance(effect, SendMessage):
                # out within SEND_GATHER_S, not after the host's reader calls of this input
                self._outbox.append(effect.message)
                self._send()
            elif isinstance(effect, Flush):
                slot.flushes += 1
                self._flush(slot, effect)
            elif isinstance(effect, Seek | Pause | Resume):
                missed = missed or not await self._steer(slot, effect)
            elif isinstance(effect, SeekToPolicy):
                offset = await self._policy_offset(machine.key)
                missed = missed or not await self._steer(slot, Seek(offset))
                await self._carry_out(slot, machine.position_resolved(offset, time.monotonic()))
            elif isinstance(effect, FindReader):
                if slot.finding is None:
                    slot.finding = asyncio.get_running_loop().create_task(self._find_reader(slot))
            else:
                raise TypeError(f"participant cannot carry out {effect!r}")
        if missed:
            await self._carry_out(slot, machine.reader_lost(time.monotonic()))

    def _send(self) -> None:
        """Send what the machines said to the coordinator, in order, as one call - a moment
        later (SEND_GATHER_S), so that the WRITE-STATUS of flushes the writer returns
        together (one Spark job writes every partition's END flush) share the call too."""
        if self._outbox and not self._send_scheduled:
            self._send_scheduled = True
            asyncio.get_running_loop().call_later(SEND_GATHER_S, self._send_now)

    def _send_now(self) -> None:
        self._send_scheduled = False
        if not self._outbox:
            return
        # the statuses of one round as one HOST-WRITE-STATUS (protocol.host_rounds)
        messages, self._outbox = pack_statuses(self._outbox), []
        try:
            self._coordinator_handle().deliver.remote(*messages)
        except ValueError:  # no coordinator (restarting): it re-sends START when it is back
            log.warning(
                "participant host %s: no coordinator for %d messages", self.name, len(messages)
            )

    async def _steer(self, slot: _Slot, action: Steer) -> bool:
        """Send one steering effect to the partition's reader; False if it did not get
        there (no reader known, or the call failed: the handle is looked up again later)."""
        key = slot.machine.key
        reader = await self._reader(key)
        if reader is None:
            return False
        try:
            await self._calls_to(reader).steer(key, action)
        except Exception as e:
            log.warning("participant host %s: steering %s failed: %r", self.name, key, e)
            slot.reader = None
            return False
        return True

    def _calls_to(self, reader: Any) -> ReaderCalls:
        """One steering queue per reader actor (its partitions' calls share Ray calls)."""
        actor_id = ray_internals.actor_id(reader)
        calls = self._reader_calls.get(actor_id)
        if calls is None:
            calls = self._reader_calls[actor_id] = ReaderCalls(reader)
        return calls

    async def _reader(self, key: str) -> Any:
        slot = self.slots.get(key)
        if slot is None:
            return None
        if slot.reader is None:
            try:
                enumerator = ray.get_actor(
                    names.enumerator(self.pipeline), namespace=names.NAMESPACE
                )
                name = await enumerator.reader_of.remote(key)
                if name is not None:
                    slot.reader = ray.get_actor(name, namespace=names.NAMESPACE)
            except (ValueError, ray.exceptions.RayError):
                return None  # no reader yet: it will attach itself when it starts
        return slot.reader

    def _flush(self, slot: _Slot, flush: Flush) -> None:
        """Hand a machine's flush to the writer a moment later (FLUSH_GATHER_S, or once the
        coordinator message being stepped is done), in one call with the other flushes of
        this host meanwhile: a round's END-COMMIT flushes of all its partitions go as one
        writer call, not one each."""
        self._flushes.append((slot, flush))
        self._hand_flushes()

    def _hand_flushes(self) -> None:
        if self._flushes and not self._flush_scheduled and not self._delivering:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(FLUSH_GATHER_S, self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        if self._delivering:
            return  # handed once the coordinator's message is stepped
        flushes, self._flushes = self._flushes, []
        if flushes:
            asyncio.get_running_loop().create_task(self._write(flushes))

    async def _write(self, flushes: list[tuple[_Slot, Flush]]) -> None:
        """One writer call for ``flushes``; each machine hears of its own part (one bad
        partition does not fail the others)."""
        parts = [
            FlushPart(slot.machine.key, list(flush.batches), flush.records)
            for slot, flush in flushes
        ]
        try:
            # Partitions of this host may share files: one file per host per round, not
            # one per partition (a host's partitions live and die together).
            written = await self.writer.write_parts.remote(self.table, parts, self.name)
        except Exception as e:
            written = [PartWritten(error=f"{type(e).__name__}: {e}")] * len(parts)
        try:
            outcomes = await asyncio.gather(
                *(
                    self._written(slot, flush, result)
                    for (slot, flush), result in zip(flushes, written, strict=True)
                ),
                return_exceptions=True,
            )
        finally:
            self._send()
        for (slot, _), outcome in zip(flushes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.error("participant %s: flush result not taken: %r", slot.machine.key, outcome)

    async def _written(self, slot: _Slot, flush: Flush, result: PartWritten) -> None:
        machine = slot.machine
        if self.slots.get(machine.key) is not slot:
            return  # retired meanwhile
        if result.error is not None:
            reason = result.error
            log.warning("participant %s: flush %d failed: %s", machine.key, flush.flush_id, reason)
            step = lambda: machine.flush_failed(flush.flush_id, reason, time.monotonic())  # noqa: E731
        else:
            files = result.files
            step = lambda: machine.flushed(flush.flush_id, files, time.monotonic())  # noqa: E731
        await self._apply(slot, step)

    def _coordinator_handle(self) -> Any:
        if self._coordinator is None:
            self._coordinator = ray.get_actor(
                names.coordinator(self.pipeline), namespace=names.NAMESPACE
            )
        return self._coordinator

    async def _policy_offset(self, key: str) -> int:
        """Where a partition the table never committed starts: explicit, earliest or latest.
        The lookups of one moment go to the broker together (``_resolve_policies``): a fresh
        pipeline's first START asks for every partition at once."""
        policy = self.starting_offsets
        if isinstance(policy, dict) and key in policy:
            return policy[key]
        loop = asyncio.get_running_loop()
        if self._policy_batch is None:
            self._policy_batch = {}
            loop.create_task(self._resolve_policies())
        future = self._policy_batch.get(key)
        if future is None:
            future = self._policy_batch[key] = loop.create_future()
        return await future

    async def _resolve_policies(self) -> None:
        """One broker lookup per cluster for every key asked for within POLICY_GATHER_S."""
        from rayconnect.kafka.discovery import beginning_offsets, high_watermarks

        await asyncio.sleep(POLICY_GATHER_S)
        batch, self._policy_batch = self._policy_batch or {}, None
        by_cluster: dict[str, list[TopicPartition]] = {}
        for key in batch:
            tp = TopicPartition.from_key(key)
            by_cluster.setdefault(tp.cluster, []).append(tp)
        lookup = high_watermarks if self.starting_offsets == "latest" else beginning_offsets
        for cluster_id, tps in by_cluster.items():
            try:
                found = await lookup(self.clusters[cluster_id], tps)
            except Exception as e:
                found, error = {}, e
            else:
                error = KeyError("no offset")
            for tp in tps:
                future = batch[tp.key]
                if tp.key in found:
                    future.set_result(found[tp.key])
                else:
                    future.set_exception(error)


def hosts_of(
    pipeline: str, keys: Iterable[str], partitions_per_host: int, topic_groups: int | None = None
) -> dict[str, list[str]]:
    """Host name -> its partitions among ``keys`` (in the order given)."""
    hosts: dict[str, list[str]] = {}
    for key in keys:
        name = names.participant_host(pipeline, key, partitions_per_host, topic_groups)
        hosts.setdefault(name, []).append(key)
    return hosts


def start_participants(
    config: Any, keys: Iterable[str], clusters: dict[str, ClusterMetadata]
) -> list[Any]:
    """Create (or find) the named, detached participant hosts of ``keys`` for the sink
    pipeline ``config`` (a SinkPipelineConfig) and add the partitions to them; ``clusters``
    is the current metadata per cluster id. Returns one object ref per host, ready once the
    host holds its partitions; callers wait for them as suits them."""
    pph = config.partitions_per_host
    refs = []
    for name, host_keys in hosts_of(config.name, keys, pph, config.topic_groups).items():
        wanted = {TopicPartition.from_key(k).cluster for k in host_keys}
        host_clusters = {cid: clusters[cid] for cid in wanted}
        handle = ray_internals.actor_class(ParticipantHostActor).options(
            name=name,
            namespace=names.NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            **config.placement.actor_options("participant"),
        ).remote(
            config.name,
            name,
            host_keys,
            config.sink.location(),
            config.commit,
            host_clusters,
            config.source.starting_offsets,
            pph,
            config.topic_groups,
        )
        refs.append(handle.add.remote(host_keys, host_clusters))
    return refs
