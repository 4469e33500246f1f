"""aiokafka 0.14 fixes needed to run transactions against brokers like tansu - for
rayconnect's own clients only.

Which clients get them: those passed to :func:`own` - every ``AIOKafkaProducer`` and
``AIOKafkaConsumer`` rayconnect builds (readers, transactional producers, discovery, offsets
and read-back consumers, the admin helpers' clients) and those of
:mod:`rayconnect.kafka.clients`. Any other aiokafka client in the same process (a user's
consumer in a test, a notebook, a checker) runs aiokafka's own code: the hooks below are
installed for the process (by :func:`apply`, at the import of ``rayconnect.kafka``), but each
asks first whose code is running and, for a client not marked by :func:`own`, hands over to
aiokafka's original unchanged. Why: a fix that changes what a read_committed consumer
returns (c: an undecided transaction is held back) made a user's plain consumer stall on
"transaction at offset 0 has no COMMIT/ABORT marker". Admin clients need none of the fixes.

How "whose code" is known: :func:`own` flags the client's ``AIOKafkaClient`` (shared by the
producer's ``Sender`` and the consumer's ``Fetcher``). Two scope hooks put the answer in a
context variable for the code they run: ``Sender.start`` (a producer's wait for its
producer id, then the background task it starts, which inherits the variable: every request
and response handler of the producer runs there) and ``Fetcher._proc_fetch_request`` (one
fetch response, where aiokafka builds the records of each partition). The fixes read that
variable; so does ``kafka.arrow_fetch``.

Four fixes, installed by :func:`apply` (idempotent) and removed by :func:`remove` /
:func:`disabled` (used by the tests to prove each one is needed). Each one speaks the Kafka
protocol, not tansu: against a broker that already does the job (Apache Kafka) it changes
nothing observable. Each is installed through :mod:`rayconnect.kafka.aiokafka_hooks`, the one
module that assigns into aiokafka.

a. **InitProducerId v3** -- aiokafka only knows InitProducerId v0, which has no
   ``producer_id``/``producer_epoch`` fields. tansu accepts only an explicit -1/-1, i.e. v3+.
   We teach aiokafka's request builder v3 (flexible encoding, producer_id=-1, epoch=-1) and
   let the normal ApiVersions negotiation pick it: brokers that do not advertise v3 still
   get v0. For Kafka, v3 with -1/-1 is exactly the "initialise a fresh producer" call v0 is.
   Hook: the ``InitProducerIdRequest`` name looked up by ``aiokafka.producer.sender``, which
   builds :class:`InitProducerIdRequestCompat` for rayconnect's producers, aiokafka's class
   for the others.

b. **PRODUCER_FENCED (error code 90)** -- KIP-588 brokers answer a fenced producer with
   code 90; aiokafka has no class for it and raises ``UnknownError``, which the sender
   does not treat as fatal and callers cannot catch as "fenced". For rayconnect's producers
   code 90 is :class:`ProducerFencedError` (a subclass of aiokafka's ``ProducerFenced``
   *and* ``BrokerResponseError``), so the sender's existing ``except ProducerFenced`` path
   and the callers' ``except ProducerFenced`` both work. Hook: ``aiokafka.errors.for_code``
   (what the sender's handlers call); aiokafka's error table is not touched, and if aiokafka
   ever maps 90 itself, its class is kept.

c. **read_committed without aborted_transactions** -- a fetch response tells a
   read_committed consumer which transactions in range were aborted; tansu always sends an
   empty list, so aborted records leaked to read_committed consumers. tansu does write the
   COMMIT/ABORT control batches, so when the list is empty we rebuild it from the fetched
   data: a transaction of producer P starts at P's first transactional batch after its
   previous marker and ends at P's next marker; those ending in ABORT become the
   ``(producer_id, first_offset)`` entries Kafka would have sent, and aiokafka's own
   filtering does the rest. A transaction whose marker is not in the fetched data yet is
   undecided, so the records handed out stop before its first batch; the next fetch starts
   there. Against Kafka this is a no-op when it sends a non-empty list (we do not touch
   it), and when it sends an empty one there is no ABORT marker closing an in-range
   transaction, so the rebuilt list is empty too; the only difference is that a
   transaction cut by the fetch size limit is delivered one fetch later.
   Hook: ``aiokafka.consumer.fetcher.PartitionRecords`` (built per partition per fetch
   response): :class:`MarkerAwarePartitionRecords`, a subclass that pre-scans the batch
   headers, for rayconnect's consumers; aiokafka's class for the others.
   Limitation: a single transaction bigger (on one partition) than
   ``max_partition_fetch_bytes`` can never be decided within one fetch and stalls that
   partition; raise ``max_partition_fetch_bytes`` above the largest transaction. This is
   logged as a warning.

d. **Fetch pacing** -- tansu answers a fetch with what it read from its store within the
   fetch's ``max_wait``; right after a restart (S3 engine, nothing cached) a short wait can
   end before the first transaction's marker, or before any batch at all, and every fetch
   from that offset comes back the same, for ever. So a fetch that left a partition where it
   was although there is more below its last stable offset (nothing returned, or only an
   undecided transaction - fix c) doubles that consumer's ``fetch_max_wait_ms``, up to
   ``STALL_WAIT_MAX_MS`` = 1 s; once no partition is held it halves back to what the
   consumer was created with. Against Kafka a fetch below the last stable offset always
   returns data, so the wait never changes. Hook: ``Fetcher._proc_fetch_request`` (the
   scope hook above), which paces rayconnect's consumers only.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import aiokafka.consumer.fetcher as _fetcher
import aiokafka.errors as _errors
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import InitProducerIdRequest_v0
from aiokafka.protocol.types import CompactString, Int16, Int32, Int64, Schema, TaggedFields
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord

from rayconnect.kafka import aiokafka_hooks
from rayconnect.kafka.aiokafka_hooks import Hook

__all__ = [
    "own",
    "owns",
    "in_rayconnect_fetch",
    "ProducerFencedError",
    "FENCED_ERRORS",
    "apply",
    "remove",
    "disabled",
    "is_applied",
    "applied_fixes",
    "FIXES",
]

log = logging.getLogger(__name__)

PRODUCER_FENCED = 90

# --------------------------------------------------------------------------------------
# Which clients get the fixes
# --------------------------------------------------------------------------------------

#: Set on the ``AIOKafkaClient`` of a client rayconnect built (:func:`own`).
_OWNED_ATTR = "_rayconnect_fixes"
#: True in the work of a rayconnect producer's ``Sender`` (its start, the background task and
#: the tasks it starts): where the InitProducerId request is built and error codes mapped.
_sending: ContextVar[bool] = ContextVar("rayconnect_sending", default=False)
#: The rayconnect consumer's ``Fetcher`` whose fetch response is being turned into
#: ``PartitionRecords`` (None: no fetch, or a fetch of a client rayconnect did not build).
_fetching: ContextVar[Any] = ContextVar("rayconnect_fetching", default=None)

_Client = TypeVar("_Client")


def _kafka_client(client: Any) -> Any:
    """The ``AIOKafkaClient`` under a producer or a sender (``.client``), a consumer or a
    fetcher (``._client``), or the client itself."""
    if isinstance(client, AIOKafkaClient):
        return client
    inner = getattr(client, "_client", None) or getattr(client, "client", None)
    if not isinstance(inner, AIOKafkaClient):
        raise TypeError(f"not an aiokafka producer or consumer: {client!r}")
    return inner


def own(client: _Client) -> _Client:
    """Mark ``client`` (an ``AIOKafkaProducer`` or ``AIOKafkaConsumer``, before it starts) as
    rayconnect's: the fixes apply to it. Returns it. Every client rayconnect builds goes
    through here; any other aiokafka client runs aiokafka's code unchanged."""
    setattr(_kafka_client(client), _OWNED_ATTR, True)
    return client


def owns(client: Any) -> bool:
    """True if the fixes apply to ``client``: a producer or consumer passed to :func:`own`,
    its ``Sender``, ``Fetcher`` or ``AIOKafkaClient``."""
    return getattr(_kafka_client(client), _OWNED_ATTR, False) is True


def in_rayconnect_fetch() -> bool:
    """True while a rayconnect consumer's fetch response is being processed (the records
    built now are for a client :func:`own` marked)."""
    return _fetching.get() is not None


async def _sender_start(self: Any) -> Any:
    """Scope hook of a producer: ``Sender.start`` - the wait for a producer id, then the
    background task created in it (a task copies the context) - flagged if rayconnect built
    the producer."""
    if not owns(self):
        return await aiokafka_hooks.ORIGINAL_SENDER_START(self)
    token = _sending.set(True)
    try:
        return await aiokafka_hooks.ORIGINAL_SENDER_START(self)
    finally:
        _sending.reset(token)


async def _proc_fetch_request(self: Any, assignment: Any, node_id: Any, request: Any) -> Any:
    """Scope hook of a consumer: one fetch response, flagged (and paced, fix d) if rayconnect
    built the consumer."""
    if not owns(self):
        return await aiokafka_hooks.ORIGINAL_PROC_FETCH_REQUEST(self, assignment, node_id, request)
    token = _fetching.set(self)
    try:
        return await aiokafka_hooks.ORIGINAL_PROC_FETCH_REQUEST(self, assignment, node_id, request)
    finally:
        _fetching.reset(token)
        if "fetch_pacing" in _active:
            _pace_empty(self, assignment, request)


# --------------------------------------------------------------------------------------
# a. InitProducerId v3
# --------------------------------------------------------------------------------------


class InitProducerIdResponse_v3(Response):
    API_KEY = 22
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class InitProducerIdRequest_v3(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 22
    API_VERSION = 3
    RESPONSE_TYPE = InitProducerIdResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),  # nullable: None encodes as 0
        ("transaction_timeout_ms", Int32),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


_InitPidStruct: TypeAlias = InitProducerIdRequest_v0 | InitProducerIdRequest_v3


class InitProducerIdRequestCompat(Request[_InitPidStruct]):
    """Drop-in for aiokafka's ``InitProducerIdRequest`` that also knows v3.

    ``Request.prepare`` picks the highest version both sides support, so v3 is used only
    when the broker advertises it in ApiVersions.
    """

    API_KEY = 22

    def __init__(self, transactional_id: str | None, transaction_timeout_ms: int) -> None:
        self._transactional_id = transactional_id
        self._transaction_timeout_ms = transaction_timeout_ms

    def build(self, request_struct_class: type[_InitPidStruct]) -> _InitPidStruct:
        if request_struct_class.API_VERSION >= 3:
            # -1/-1: "no existing producer id", i.e. what v0 means implicitly.
            return InitProducerIdRequest_v3(
                self._transactional_id, self._transaction_timeout_ms, -1, -1, {}
            )
        return InitProducerIdRequest_v0(self._transactional_id, self._transaction_timeout_ms)


def _init_producer_id_request(*args: Any, **kwargs: Any) -> Any:
    """What aiokafka's sender builds as ``InitProducerIdRequest(...)``: ours for a rayconnect
    producer, aiokafka's for any other."""
    if _sending.get():
        return InitProducerIdRequestCompat(*args, **kwargs)
    return aiokafka_hooks.ORIGINAL_INIT_PRODUCER_ID_REQUEST(*args, **kwargs)


# --------------------------------------------------------------------------------------
# b. PRODUCER_FENCED
# --------------------------------------------------------------------------------------


class ProducerFencedError(_errors.ProducerFenced, _errors.BrokerResponseError):
    """Error code 90 (KIP-588): a newer producer with the same transactional.id exists.

    Subclasses aiokafka's ``ProducerFenced`` so that aiokafka's sender treats it as fatal
    and callers can ``except ProducerFenced`` for both the old (47) and new (90) codes.
    """

    errno = PRODUCER_FENCED
    message = "PRODUCER_FENCED"
    description = (
        "There is a newer producer with the same transactionalId which fences the current one."
    )


def _for_code(error_code: int) -> Any:
    """aiokafka's ``errors.for_code``, with code 90 as :class:`ProducerFencedError` for a
    rayconnect producer (unless aiokafka maps 90 itself)."""
    if (
        error_code == PRODUCER_FENCED
        and _sending.get()
        and "producer_fenced" in _active  # a name bound before remove() still answers right
        and error_code not in _errors.kafka_errors
    ):
        return ProducerFencedError
    return aiokafka_hooks.ORIGINAL_FOR_CODE(error_code)


#: What a caller should catch for "this producer is a zombie": aiokafka raises
#: ``ProducerFenced`` (also our code-90 class) and sometimes the raw epoch error.
FENCED_ERRORS: tuple[type[BaseException], ...] = (
    _errors.ProducerFenced,
    _errors.InvalidProducerEpoch,
)


# --------------------------------------------------------------------------------------
# c. read_committed from control markers
# --------------------------------------------------------------------------------------


class _BatchReplay:
    """The two methods of ``MemoryRecords`` that ``PartitionRecords`` uses, over a list."""

    def __init__(self, batches: list[Any]) -> None:
        self._batches = batches
        self._i = 0

    def has_next(self) -> bool:
        return self._i < len(self._batches)

    def next_batch(self) -> Any:
        if self._i >= len(self._batches):
            return None
        batch = self._batches[self._i]
        self._i += 1
        return batch


@dataclass(frozen=True)
class _Scan:
    """What the marker scan of one fetched partition found."""

    batches: list[Any]  # batches to hand to aiokafka (cut before the first undecided txn)
    aborted: list[tuple[int, int]]  # (producer_id, first_offset), like Kafka's list
    abort_marker_at: dict[int, bool]  # control batch base_offset -> is ABORT
    held_from: int | None  # first offset held back (undecided transaction), if any


def _scan_markers(records: Any) -> _Scan:
    """Rebuild the aborted-transactions list from the COMMIT/ABORT markers in the data."""
    batches: list[Any] = []
    while records.has_next():
        batch = records.next_batch()
        if batch is None:
            break
        batches.append(batch)

    open_txn: dict[int, int] = {}  # producer_id -> first offset of its open transaction
    aborted: list[tuple[int, int]] = []
    abort_marker_at: dict[int, bool] = {}
    for batch in batches:
        pid = getattr(batch, "producer_id", None)
        if pid is None or pid < 0:  # legacy (v0/v1) or non-idempotent batch
            continue
        if batch.is_control_batch:
            # Reading the marker consumes the batch's record iterator; remember the answer
            # for PartitionRecords._contains_abort_marker, which would read it again.
            try:
                marker = next(batch)
            except StopIteration:
                continue
            is_abort = ControlRecord.parse(marker.key) == ABORT_MARKER
            abort_marker_at[batch.base_offset] = is_abort
            first = open_txn.pop(pid, None)
            if is_abort and first is not None:
                aborted.append((pid, first))
        elif batch.is_transactional:
            open_txn.setdefault(pid, batch.base_offset)

    held_from = min(open_txn.values()) if open_txn else None
    if held_from is not None:
        batches = [b for b in batches if b.base_offset < held_from]
    return _Scan(batches, aborted, abort_marker_at, held_from)


_stall_warned: set[Any] = set()

#: The longest a held-back partition makes its consumer's fetches wait.
STALL_WAIT_MAX_MS = 1000


def _pace_empty(fetcher: Any, assignment: Any, request: Any) -> None:
    """Pace the partitions of ``request`` that got nothing at all (those that got batches
    were paced as their ``PartitionRecords`` were built)."""
    for topic, partitions in request.topics:
        for partition, offset, _ in partitions:
            tp = _fetcher.TopicPartition(topic, partition)
            if tp in fetcher._records:
                continue
            try:
                state = assignment.state_value(tp)
            except (KeyError, AttributeError):  # unassigned meanwhile
                continue
            end = state.lso if state.lso is not None and state.lso >= 0 else state.highwater
            _pace(fetcher, tp, held=end is not None and offset < end)


def _pace(fetcher: Any, tp: Any, held: bool) -> None:
    """Widen the fetcher's wait after a fetch that left ``tp`` where it was, narrow it once
    no partition is held any more (never below what the consumer was created with)."""
    if fetcher is None:
        return
    state = fetcher.__dict__
    base = state.setdefault("_rayconnect_base_wait_ms", fetcher._fetch_max_wait_ms)
    held_tps: set[Any] = state.setdefault("_rayconnect_held", set())
    now = fetcher._fetch_max_wait_ms
    if held:
        held_tps.add(tp)
        wait = min(max(2 * now, 100), max(STALL_WAIT_MAX_MS, base))
    else:
        held_tps.discard(tp)
        wait = now if held_tps else max(now // 2, base)
    if wait != now:
        log.debug("%s: fetch wait %d -> %d ms", tp, now, wait)
        fetcher._fetch_max_wait_ms = wait


def _pacing() -> Any:
    """The fetcher to pace (fix d) for the fetch being processed, if any."""
    return _fetching.get() if "fetch_pacing" in _active else None


class MarkerAwarePartitionRecords(aiokafka_hooks.ORIGINAL_PARTITION_RECORDS):
    """``PartitionRecords`` that derives aborted transactions from markers if not given.

    Only read_committed fetches with an empty/absent aborted_transactions list are
    touched; everything else goes to aiokafka's code unchanged. Built for rayconnect's
    consumers only (:func:`_partition_records`).
    """

    def __init__(
        self,
        tp: Any,
        records: Any,
        aborted_transactions: Any,
        fetch_offset: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        isolation_level = kwargs.get("isolation_level", args[-1] if args else None)
        self._abort_marker_at: dict[int, bool] = {}
        if isolation_level == _fetcher.READ_COMMITTED and not aborted_transactions:
            scan = _scan_markers(records)
            records = _BatchReplay(scan.batches)
            aborted_transactions = scan.aborted
            self._abort_marker_at = scan.abort_marker_at
            _pace(_pacing(), tp, held=scan.held_from == fetch_offset)
            if scan.held_from is not None:
                if scan.held_from == fetch_offset and tp not in _stall_warned:
                    _stall_warned.add(tp)
                    log.warning(
                        "%s: transaction at offset %d has no COMMIT/ABORT marker in the "
                        "fetched data; holding it back. If this persists, the transaction "
                        "is larger than max_partition_fetch_bytes or still open.",
                        tp,
                        fetch_offset,
                    )
                else:
                    log.debug("%s: holding back undecided transaction at %d", tp, scan.held_from)
        super().__init__(tp, records, aborted_transactions, fetch_offset, *args, **kwargs)

    def _contains_abort_marker(self, next_batch: Any) -> bool:
        known = self._abort_marker_at.get(next_batch.base_offset)
        if known is not None:
            return known
        return bool(super()._contains_abort_marker(next_batch))


def _partition_records(*args: Any, **kwargs: Any) -> Any:
    """What aiokafka's fetcher builds as ``PartitionRecords(...)``: ours for a rayconnect
    consumer, aiokafka's for any other."""
    if _fetching.get() is not None:
        return MarkerAwarePartitionRecords(*args, **kwargs)
    return aiokafka_hooks.ORIGINAL_PARTITION_RECORDS(*args, **kwargs)


# --------------------------------------------------------------------------------------
# apply / remove
# --------------------------------------------------------------------------------------

FIXES = ("init_producer_id", "producer_fenced", "read_committed", "fetch_pacing")
"""Names of the fixes, for :func:`disabled` and :func:`applied_fixes`."""

_lock = threading.RLock()
_active: set[str] = set()

#: Each fix's own hook (fix d has none: it lives in the consumer's scope hook).
_HOOKS: dict[str, tuple[Hook, Any] | None] = {
    "init_producer_id": (Hook.INIT_PRODUCER_ID_REQUEST, _init_producer_id_request),
    "producer_fenced": (Hook.FOR_CODE, _for_code),
    "read_committed": (Hook.PARTITION_RECORDS, _partition_records),
    "fetch_pacing": None,
}
#: The scope hooks, and the fixes that need each installed.
_SCOPES: tuple[tuple[Hook, Any, frozenset[str]], ...] = (
    (Hook.SENDER_START, _sender_start, frozenset({"init_producer_id", "producer_fenced"})),
    (Hook.PROC_FETCH_REQUEST, _proc_fetch_request, frozenset({"read_committed", "fetch_pacing"})),
)


def _check(name: str) -> None:
    if name not in _HOOKS:
        raise ValueError(f"unknown compat fix {name!r}; known: {FIXES}")


def _install(name: str) -> None:
    hook = _HOOKS[name]
    if hook is not None:
        aiokafka_hooks.replace(*hook)


def _uninstall(name: str) -> None:
    hook = _HOOKS[name]
    if hook is not None:
        aiokafka_hooks.restore(hook[0])


def _sync_scopes() -> None:
    """Scope hooks installed exactly while a fix that reads them is."""
    for hook, value, fixes in _SCOPES:
        if _active & fixes:
            aiokafka_hooks.replace(hook, value)
        else:
            aiokafka_hooks.restore(hook)


def apply(*names: str) -> None:
    """Install the fixes (all by default) for the clients :func:`own` marks. Idempotent;
    safe to call on every import. Plain aiokafka clients are not affected."""
    _apply(names or FIXES)


def _apply(names: tuple[str, ...] | set[str]) -> None:
    with _lock:
        for name in names:
            _check(name)
            if name not in _active:
                _install(name)
                _active.add(name)
        _sync_scopes()


def remove(*names: str) -> None:
    """Undo :func:`apply` (all by default), for tests that show what happens without."""
    with _lock:
        for name in names or FIXES:
            _check(name)
            if name in _active:
                _uninstall(name)
                _active.discard(name)
        _sync_scopes()


def applied_fixes() -> frozenset[str]:
    return frozenset(_active)


def is_applied() -> bool:
    """True if every fix is installed."""
    return _active == set(FIXES)


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Run a block with some fixes (all by default) removed, then restore them.

    Process-wide (for rayconnect's clients): only for tests, with no other rayconnect client
    running concurrently.
    """
    with _lock:
        before = set(_active)
        remove(*names)
    try:
        yield
    finally:
        with _lock:
            _apply(before)
