"""Reader actor ``<pipeline>/reader/<cluster>/<i>``: one aiokafka consumer over its splits.

Its positions are a pure model (``protocol.reader_positions``): where the consumer stands on
each split, what a fetched batch means, what to put back; this actor carries out its Seeks
and Hands. Its splits come from the enumerator (FLIP-246): at start-up it asks
``GetMetadataUpdateEvent`` and reads nothing until the answer, a ``MetadataUpdateEvent`` with
its complete split set, arrives; later events add splits and drop those the metadata no longer
has. Participants steer each split (``seek``, ``pause``, ``resume``): a partition is paused
until its participant, which knows the round's offsets, resumes it.

Each poll becomes one Arrow object per participant host in the object store - the pieces of
all the host's partitions concatenated, each named by a ``Rows(ref, start, count)`` handle
(``spark_bridge.blocks``: why one object per host, and why its lifetime is bounded) - handed
in one call per host per poll carrying all its partitions' pieces (``participant_host``). The reader owns those objects (Ray 2.56 removed
``ray.put(_owner=...)``): when it dies, the refs its participants buffered die too, their
flushes fail and those partitions' open round is not reported - the next START re-reads them
from the table's offsets, so nothing is lost or doubled. A (re)started reader asks each
participant host to steer its splits (``reader_attached``).

A split asked to read at an offset outside its log (past the high watermark the broker
reports, confirmed a check later; or refused by the broker with OFFSET_OUT_OF_RANGE) is
reported to the coordinator, which gives up or starts the partition over
(``protocol.offset_range``): never read on in silence.

While its cluster cannot be reached (``kafka.reachability``) the reader says so in its status
and tells the coordinator after every probe (``outage``), which gives the pipeline up after
``give_up_after_s``; once the broker answers again it says that too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import ray
from aiokafka.errors import OffsetOutOfRangeError

from rayconnect.actors import names
from rayconnect.actors.pieces import Piece
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST
from rayconnect.kafka.cut_markers import marker_rows
from rayconnect.kafka.discovery import client_properties
from rayconnect.kafka.reachability import Reachability, watch
from rayconnect.metrics import SinkMetrics
from rayconnect.protocol import effects
from rayconnect.protocol.actor_status import ReaderPartitionStatus, ReaderStatus
from rayconnect.protocol.messages import GetMetadataUpdateEvent, MetadataUpdateEvent
from rayconnect.protocol.offset_range import OffsetsOutOfRange
from rayconnect.protocol.range_watch import RangeWatch
from rayconnect.protocol.reader_positions import Hand, PollToken, ReaderPositions, Seek
from rayconnect.protocol.types import ClusterMetadata, TopicPartition
from rayconnect.spark_bridge.blocks import Rows, put_together

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Cut:
    """One partition's piece of a wave, before it is put: its rows of the fetched batch."""

    key: str
    first: int
    next_offset: int
    rows: pa.RecordBatch
    whole: bool  # the whole fetched batch (not a slice of it)
    high_watermark: int | None
    cut_lsn: int | None = None  # the piece ends with a cut marker (left out of ``rows``)


FETCH_MIN_BYTES = 512 * 1024


FETCH_MAX_WAIT_MS = 100
#: how often the reader looks for splits sought past their log's end
RANGE_CHECK_S = 1.0


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class ReaderActor:
    async def __init__(  # type: ignore[misc]  # Ray awaits an async actor's __init__
        self,
        pipeline: str,
        cluster_id: str,
        cluster: ClusterMetadata,
        reader_id: str,
        max_poll_records: int = 50_000,
        partitions_per_host: int = DEFAULT_PARTITIONS_PER_HOST,
        topic_groups: int | None = None,
        cut_markers: bool = False,
    ) -> None:
        self.pipeline = pipeline
        #: consistent cuts: pieces end at cut markers, which they name instead of holding
        self.cut_markers = cut_markers
        self.cluster_id = cluster_id
        self.cluster = cluster
        self.reader_id = reader_id
        self.max_poll_records = max_poll_records
        self.partitions_per_host = partitions_per_host
        self.topic_groups = topic_groups
        self.started_at = time.time()
        self.records_read = 0
        self.bytes_read = 0
        self.metadata_updates = 0
        self.last_update_at: float | None = None
        self._metrics = SinkMetrics(pipeline)  # dashboard metrics (rayconnect.metrics)
        self._consumer: Any = None
        self._tps: dict[str, Any] = {}
        self._host_of: dict[str, str] = {}  # split key -> its participant host's name
        self._hosts: dict[str, Any] = {}  # participant host name -> handle
        # Each split's position, pause flag and seeks: the rules are in the pure model.
        self._positions = ReaderPositions()
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()
        self._error: str | None = None
        self._reach = Reachability()  # "broker unreachable since ..." in status
        self._watch: asyncio.Task[None] | None = None
        self._told_fine = True  # the coordinator knows the broker answers (or never heard)
        self._ranges = RangeWatch()  # splits outside their log (the rules are its own)
        #: splits the broker refused (OFFSET_OUT_OF_RANGE): paused in the consumer until
        #: their participant seeks them elsewhere
        self._parked: set[str] = set()
        self._next_range_check = 0.0
        # Started here, not by a call: Ray re-runs __init__ when it restarts this actor.
        self._task = asyncio.get_running_loop().create_task(self._main())

    async def _main(self) -> None:
        while self._consumer is None:
            try:
                await self._connect()
            except Exception as e:  # broker down: retry, and say so in status
                self._error = f"connect failed: {type(e).__name__}: {e}"
                log.warning("reader %s/%s: %s", self.pipeline, self.reader_id, self._error)
                self._reach.observe(e, time.time())
                await self._tell_coordinator(self._reach)
                await asyncio.sleep(1.0)
        self._watch = asyncio.get_running_loop().create_task(
            watch(self._consumer, self._reach, report=self._tell_coordinator)
        )
        while not self._ready.is_set():
            try:  # the answer arrives as a metadata_update call
                enumerator = ray.get_actor(
                    names.enumerator(self.pipeline), namespace=names.NAMESPACE
                )
                await enumerator.get_metadata_update.remote(
                    GetMetadataUpdateEvent(reader_id=self.reader_id)
                )
                await asyncio.wait_for(self._ready.wait(), 10.0)
            except Exception as e:
                self._error = f"waiting for metadata: {type(e).__name__}: {e}"
                await asyncio.sleep(1.0)
        self._error = None
        await self._run()

    @property
    def _outage_name(self) -> str:
        return f"broker {self.cluster_id} (reader {self.reader_id})"

    async def _tell_coordinator(self, reach: Reachability) -> None:
        """The coordinator hears of an outage after every probe (a restarted one learns it
        again) and of its end until it has heard it once. Best effort: it may be restarting."""
        if reach.unreachable_since is not None:
            self._told_fine = False
        elif self._told_fine:
            return
        told = await self._to_coordinator(
            lambda c: c.outage.remote(self._outage_name, reach.reason, reach.unreachable_since),
            5.0,
        )
        if told:
            self._told_fine = reach.unreachable_since is None

    async def _to_coordinator(self, call: Callable[[Any], Any], timeout_s: float) -> bool:
        """``call(coordinator)`` and wait for it; False if it did not get there (best effort:
        the coordinator may be restarting)."""
        try:
            coordinator = ray.get_actor(names.coordinator(self.pipeline), namespace=names.NAMESPACE)
            await asyncio.wait_for(call(coordinator), timeout_s)
            return True
        except Exception as e:
            log.warning("reader %s/%s: coordinator not told: %s", self.pipeline, self.reader_id, e)
            return False

    async def _connect(self) -> None:
        from aiokafka import AIOKafkaConsumer

        from rayconnect.kafka import arrow_fetch, compat

        arrow_fetch.install()  # with the compat fixes
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.cluster.bootstrap_servers,
            enable_auto_commit=False,
            isolation_level="read_committed",
            # Never move on its own: a reset racing a participant's seek once put the
            # consumer at the high watermark while we believed it elsewhere (a stall). Only
            # seeks move it; a position it cannot use raises, and we seek back.
            auto_offset_reset="none",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            # Under a steady trickle, let the broker gather a fetch for up to 100 ms rather
            # than answer each new record at once: every poll costs a ray.put and a Ray call
            # per participant host (a backlog fills fetch_min_bytes at once and is not slowed).
            fetch_min_bytes=FETCH_MIN_BYTES,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            # Each fetched partition decoded at once into columns, not a ConsumerRecord per
            # record (kafka/arrow_fetch.py): the reader's largest cost.
            key_deserializer=arrow_fetch.arrow_columns,
            **client_properties(self.cluster.properties),
        )
        compat.own(consumer)
        await consumer.start()
        self._consumer = consumer

    async def metadata_update(self, event: MetadataUpdateEvent) -> None:
        """The enumerator's answer: ``event.splits`` is this reader's complete split set."""
        from aiokafka import TopicPartition as KafkaTP

        async with self._lock:
            while self._consumer is None:
                await asyncio.sleep(0.1)
            wanted = {s.partition.key for s in event.splits}
            host_of = {
                key: names.participant_host(
                    self.pipeline, key, self.partitions_per_host, self.topic_groups
                )
                for key in wanted - set(self._tps)
            }
            hosts = {  # first: a lookup that fails leaves everything as it was
                name: self._hosts.get(name) or ray.get_actor(name, namespace=names.NAMESPACE)
                for name in set(host_of.values())
            }
            plan = self._positions.assign(wanted)
            for key in plan.dropped:  # the metadata no longer has it
                del self._tps[key], self._host_of[key]
            for key in plan.added:
                tp = TopicPartition.from_key(key)
                self._tps[key] = KafkaTP(tp.topic, tp.partition)
                self._host_of[key] = host_of[key]
            self._hosts.update(hosts)
            # assign() forgets the positions and pause flags of the splits it keeps: the
            # plan restores them (new splits get a placeholder position).
            self._consumer.assign([self._tps[key] for key in plan.splits])
            for key in plan.pause:
                self._consumer.pause(self._tps[key])
            self._apply(*plan.seek)
            me = ray.get_runtime_context().current_actor
            by_host: dict[str, list[str]] = {}
            for key in plan.added:  # one call per host, for all its new splits
                by_host.setdefault(self._host_of[key], []).append(key)
            # each host steers its new splits (where to start, whether to read) through its
            # ordered steering calls before it answers: nothing here may apply an older wish
            await asyncio.gather(
                *(self._hosts[h].reader_attached.remote(me, keys) for h, keys in by_host.items())
            )
            self.metadata_updates += 1
            self.last_update_at = time.time()
            self._ready.set()

    async def ready(self, timeout_s: float = 60.0) -> bool:
        """Wait until the reader holds its splits from fresh metadata."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"reader not ready after {timeout_s} s: {self._error}") from None
        return True

    async def seek(self, key: str, offset: int) -> None:
        self._apply(self._positions.seek(key, offset))
        if key in self._parked:  # sought elsewhere: read again if the split is resumed
            self._parked.discard(key)
            if key in self._positions.resumed:
                self._consumer.resume(self._tps[key])

    async def pause(self, key: str) -> None:
        if self._positions.pause(key):
            self._consumer.pause(self._tps[key])

    async def resume(self, key: str) -> None:
        if self._positions.resume(key):
            self._consumer.resume(self._tps[key])

    async def steer(self, ops: list[effects.ReaderSteer]) -> None:
        """Several partitions' seek / pause / resume in one call, in order (a participant
        host sends what its partitions asked while its last call was out)."""
        for op in ops:
            await self._steer_one(op.key, op.action)

    async def _steer_one(self, key: str, action: effects.Steer) -> None:
        if isinstance(action, effects.Seek):
            await self.seek(key, action.offset)
        elif isinstance(action, effects.Pause):
            await self.pause(key)
        elif isinstance(action, effects.Resume):
            await self.resume(key)
        else:
            raise TypeError(f"a reader cannot carry out {action!r}")

    def _apply(self, *seeks: Seek | None) -> None:
        """Move the consumer where the model says (None: nowhere)."""
        for seek in seeks:
            if seek is not None:
                self._consumer.seek(self._tps[seek.key], seek.offset)

    async def _run(self) -> None:
        from rayconnect.kafka.to_arrow import fetched_to_batch

        while True:
            try:
                if not self._positions.any_resumed:
                    await asyncio.sleep(0.05)
                    continue
                token = self._positions.poll()
                # Each partition's fetch comes as one item (kafka/arrow_fetch.py), so
                # max_records would count partitions: pieces are cut in _hand instead.
                fetched = await self._consumer.getmany(timeout_ms=200)
                fetches: list[tuple[str, Any, pa.RecordBatch, int]] = []
                for tp, items in fetched.items():
                    key = TopicPartition(self.cluster_id, tp.topic, tp.partition).key
                    if not items or not self._positions.owns(key):
                        continue
                    batch = fetched_to_batch(self.cluster_id, tp.topic, tp.partition, items)
                    first = self._positions.fetched(token, key, batch.column("offset")[0].as_py())
                    if isinstance(first, int):
                        fetches.append((key, tp, batch, first))
                    else:
                        self._apply(first)
                await self._hand(token, fetches)
                await self._hand_skipped(token, fetched)
                await self._check_ranges()
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRangeError as e:  # the broker refused some splits' positions
                await self._refused(e)
            except Exception as e:  # keep reading; the participant/coordinator recover
                self._error = f"{type(e).__name__}: {e}"
                log.exception("reader %s/%s poll failed", self.pipeline, self.reader_id)
                self._apply(*self._positions.poll_failed())
                await asyncio.sleep(0.5)

    async def _hand(
        self, token: PollToken, fetches: list[tuple[str, Any, pa.RecordBatch, int]]
    ) -> None:
        """Hand one poll's fetches to the participant hosts: one Ray call per host carrying
        all its partitions' pieces, and ONE object per host (``blocks.put_together``: the
        pieces concatenated, each named by a ``Rows`` handle). A partition's fetch goes in
        pieces of at most ``max_poll_records`` records, in offset order: a fetch longer
        than that takes several waves of calls, each piece decided by the model just before
        its wave goes (until the participant pauses or moves the split). A piece that did
        not arrive is read again, and its partition's later pieces are not sent."""
        size = self.max_poll_records
        # key -> [tp, batch, first offset of the next piece, first row of the next piece, hw]
        pending = {
            key: [tp, batch, first, 0, self._consumer.highwater(tp)]
            for key, tp, batch, first in fetches
        }
        # consistent cuts: each partition's marker rows, in order (a piece ends at one)
        markers = {
            key: marker_rows(batch) if self.cut_markers else [] for key, _, batch, _ in fetches
        }
        fetched_to = {key: self._consumer_position(tp) for key, tp, _, _ in fetches}
        while pending:
            cuts: dict[str, list[_Cut]] = {}  # host -> this wave's pieces for it
            for key, entry in list(pending.items()):
                tp, batch, first, start, high_watermark = entry
                end = min(start + size, batch.num_rows)
                marks, cut_lsn = markers[key], None
                while marks and marks[0][0] < start:
                    marks.pop(0)
                if marks and marks[0][0] < end:
                    end, cut_lsn = marks[0][0] + 1, marks[0][1]
                stop = batch.column("offset")[end - 1].as_py() + 1
                if end == batch.num_rows:
                    # the fetch's last piece ends where the consumer stands: past the commit
                    # markers (and aborted records) after its last record - they are not
                    # records, and a partition whose log ends in a marker is caught up
                    stop = max(stop, fetched_to[key] or 0)
                decision = self._positions.piece(token, key, first, stop)
                if not isinstance(decision, Hand):
                    self._apply(decision)  # paused: put back; moved or dropped: nothing
                    del pending[key]
                    continue
                whole = end - start == batch.num_rows and cut_lsn is None
                kept = end - start - (cut_lsn is not None)  # a marker is no row
                rows = batch if whole else batch.slice(start, kept)
                cuts.setdefault(self._host_of[key], []).append(
                    _Cut(key, first, decision.stop, rows, whole, high_watermark, cut_lsn)
                )
                if end < batch.num_rows:
                    entry[2], entry[3] = decision.stop, end
                else:
                    del pending[key]
            waves: dict[str, list[Piece]] = {}
            for host, host_cuts in cuts.items():
                try:
                    handles = put_together([c.rows for c in host_cuts], host_cuts[0].whole)
                except Exception as e:
                    for c in host_cuts:
                        pending.pop(c.key, None)
                        self._not_handed(token, c.key, c.first, e)
                    continue
                waves[host] = [self._piece(c, h) for c, h in zip(host_cuts, handles, strict=True)]
            await self._send(token, waves, pending)

    async def _hand_skipped(self, token: PollToken, fetched: dict[Any, Any]) -> None:
        """The resumed splits this poll moved past batches without a record for us (commit
        markers, an aborted transaction) and handed nothing: each host gets an empty piece
        up to where the consumer stands (``ReaderPositions.skipped``), so the table's
        offsets pass them - a log that ends in markers is caught up (lag 0), not behind."""
        seen = {TopicPartition(self.cluster_id, tp.topic, tp.partition).key for tp in fetched}
        waves: dict[str, list[Piece]] = {}
        for key in self._positions.resumed:
            if key in seen:
                continue
            tp = self._tps[key]
            moved = self._positions.skipped(token, key, self._consumer_position(tp))
            if not isinstance(moved, Hand):
                self._apply(moved)
                continue
            hw = self._consumer.highwater(tp)
            self._metrics.read(key, 0, 0, high_watermark=hw, next_offset=moved.stop)
            caught_up = hw is not None and moved.stop >= hw
            piece = Piece(key, moved.first, moved.stop, 0, 0, None, caught_up, hw)
            waves.setdefault(self._host_of[key], []).append(piece)
        if waves:
            await self._send(token, waves)

    async def _send(
        self,
        token: PollToken,
        waves: dict[str, list[Piece]],
        pending: dict[str, Any] | None = None,
    ) -> None:
        """One ``records`` call per host; a piece that did not arrive is read again (and
        its partition's ``pending`` pieces are not sent)."""
        results = await asyncio.gather(
            *(self._hosts[h].records.remote(pieces) for h, pieces in waves.items()),
            return_exceptions=True,
        )
        for pieces, result in zip(waves.values(), results, strict=True):
            first_of = {p.key: p.first for p in pieces}
            if isinstance(result, BaseException):  # the host is restarting
                failed = {p.key: result for p in pieces}
            else:
                failed = {key: RuntimeError("batch not taken") for key in result}
            for key, cause in failed.items():
                if pending is not None:
                    pending.pop(key, None)
                self._not_handed(token, key, first_of[key], cause)

    async def _check_ranges(self) -> None:
        """Report the resumed splits whose position lies past their log's end
        (``protocol.range_watch`` decides which), at most every RANGE_CHECK_S."""
        now = time.monotonic()
        if now < self._next_range_check:
            return
        self._next_range_check = now + RANGE_CHECK_S
        positions = self._positions
        due = self._ranges.check(
            (key, positions.position(key), self._consumer.highwater(self._tps[key]))
            for key in positions.resumed
        )
        for past in due:
            log_start = await self._log_start(self._tps[past.key])
            report = OffsetsOutOfRange(past.key, past.position, past.high_watermark, log_start)
            if await self._tell_out_of_range(report):
                self._ranges.told(past.key, past.position)

    async def _refused(self, error: OffsetOutOfRangeError) -> None:
        """The broker refused the positions of some splits: park them (the others read on)
        and report each with its log's range."""
        refused = error.args[0] if error.args and isinstance(error.args[0], dict) else {}
        for tp, offset in refused.items():
            key = TopicPartition(self.cluster_id, tp.topic, tp.partition).key
            if not self._positions.owns(key):
                continue
            self._consumer.pause(tp)
            self._parked.add(key)
            if not self._ranges.refused(key, offset):
                continue
            log_end = self._consumer.highwater(tp)
            report = OffsetsOutOfRange(key, offset, log_end or 0, await self._log_start(tp))
            if await self._tell_out_of_range(report):
                self._ranges.told(key, offset)

    async def _log_start(self, tp: Any) -> int | None:
        try:
            return (await self._consumer.beginning_offsets([tp]))[tp]
        except Exception:
            return None

    async def _tell_out_of_range(self, report: OffsetsOutOfRange) -> bool:
        """Tell the coordinator (it judges and acts); False if it could not be told."""
        self._error = report.describe()
        log.error("reader %s/%s: %s", self.pipeline, self.reader_id, self._error)
        return await self._to_coordinator(lambda c: c.offsets_out_of_range.remote(report), 10.0)

    def _piece(self, cut: _Cut, rows: Rows) -> Piece:
        """What the host is handed for ``cut``; counted as read."""
        n, nbytes = cut.rows.num_rows, cut.rows.nbytes
        self.records_read += n
        self.bytes_read += nbytes
        self._metrics.read(  # dashboard metrics
            cut.key, n, nbytes, high_watermark=cut.high_watermark, next_offset=cut.next_offset
        )
        hw = cut.high_watermark
        caught_up = hw is not None and cut.next_offset >= hw
        return Piece(
            cut.key, cut.first, cut.next_offset, n, nbytes, rows, caught_up, hw, cut.cut_lsn
        )

    def _not_handed(self, token: PollToken, key: str, first: int, e: BaseException) -> None:
        """The piece of ``key`` starting at ``first`` did not reach its host: read it again."""
        if self._positions.owns(key):
            cause = e.__cause__ or e
            self._error = f"{key}: {type(cause).__name__}: {cause}"
            self._apply(self._positions.not_handed(token, key, first))

    async def status(self) -> ReaderStatus:
        return ReaderStatus(
            reader_id=self.reader_id,
            cluster=self.cluster_id,
            bootstrap_servers=self.cluster.bootstrap_servers,
            splits=tuple(sorted(self._tps)),
            resumed=tuple(self._positions.resumed),
            records_read=self.records_read,
            bytes_read=self.bytes_read,
            metadata_updates=self.metadata_updates,
            last_update_at=self.last_update_at,
            started_at=self.started_at,
            error=self._error,
            broker=self._reach.describe(),
            broker_unreachable_since=self._reach.unreachable_since,
            broker_outages=self._reach.outages,
            partitions={
                key: ReaderPartitionStatus(
                    position=self._positions.position(key),
                    consumer_position=self._consumer_position(tp),
                    high_watermark=self._consumer.highwater(tp) if self._consumer else None,
                )
                for key, tp in self._tps.items()
            },
        )

    def _consumer_position(self, tp: Any) -> int | None:
        """Where aiokafka will fetch next (None while it has no position)."""
        try:
            state = self._consumer._subscription.subscription.assignment.state_value(tp)
            return state.position if state is not None and state.has_valid_position else None
        except AttributeError:  # aiokafka internals moved: the check is diagnostic only
            return None

    async def close(self) -> None:
        """Stop reading for good: nothing is delivered after this returns."""
        self._task.cancel()
        if self._watch is not None:
            self._watch.cancel()
        if self._reach.unreachable_since is not None:  # a removed cluster's outage is over
            self._reach.observe(None, time.time())
            await self._tell_coordinator(self._reach)
        for key in self._positions.splits:
            self._positions.pause(key)
        if self._consumer:
            await self._consumer.stop()
