"""The source API (KIP-618's SourceTask, in async Python) and how partitions map to tasks.

A ``SourceTask`` instance given to ``rc.SourcePipeline(task=...)`` is a template: every task
actor gets its own copy (pickled), calls ``start(context)`` on it, then ``poll()`` in a loop.
A task must be able to resume from the source offsets alone - ``commit_record`` and
``commit`` are hooks for acknowledging the source, not for keeping offsets, because after a
crash they may not have been called for records that did commit (seed 002).

Task assignment. A source partition is any JSON-able value (``{"file": "a.jsonl"}``).
Task ``i`` of ``N`` owns the partitions for which ``context.owns(partition)`` is true: by
default ``crc32(canonical JSON) % N == i``. The rule needs no coordination and no list of
partitions, so partitions that appear later (a new file) land on exactly one task, and after
a restart with another ``N`` every partition moves to exactly one new owner - which then
finds its offset in the combined offsets view (the old generation is fenced first). A source
that knows its partitions up front may use ``context.owns_index(j)`` (``j % N == i``) for an
even spread; GeneratorSource does.
"""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar, cast

import msgspec

from rayconnect.errors import ConfigError, no_such
from rayconnect.kafka.topics import TopicSpec
from rayconnect.protocol.source_status import SourceLag
from rayconnect.protocol.types import check_name


class SourceRecord(msgspec.Struct, frozen=True):
    """One record for Kafka plus where it came from.

    ``value``/``key``: bytes as is, str as UTF-8, anything else as JSON. ``partition`` None
    lets the producer's partitioner choose (by key). ``source_partition``/``source_offset``
    are JSON-able; records without a source partition commit no offset. ``every_partition``:
    one copy goes to each partition the topic has when it is sent, in the same transaction
    (``partition`` then None) - a marker every reader of the topic meets in its own
    partition's order, as the Postgres source's truncate events (``commit_record`` is
    called for each copy).
    """

    topic: str
    value: Any
    key: Any = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    partition: int | None = None
    source_partition: Any = None
    source_offset: Any = None
    every_partition: bool = False


class RecordMetadata(msgspec.Struct, frozen=True):
    """Where a committed record landed in Kafka."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None = None


def encode_partition(source_partition: Any) -> str:
    """Canonical text of a source partition: equal partitions, equal keys, any dict order."""
    return msgspec.json.encode(source_partition, order="sorted").decode()


def decode_partition(key: str) -> Any:
    return msgspec.json.decode(key)


def to_bytes(value: Any) -> bytes | None:
    """Record key/value serialisation: bytes as is, str as UTF-8, None as None, else JSON."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return msgspec.json.encode(value)


class BadRecord(ValueError):
    """A record ``poll()`` returned that cannot be written to Kafka; the message says why."""


Encoded = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]
_RAW = (bytes, type(None))


def encode_record(record: Any) -> Encoded:
    """``(value, key, headers)`` as the producer takes them, or ``BadRecord``. Checked per
    record, so one bad record is named (topic, source partition and offset) and routed to
    the dead-letter topic instead of failing a whole transaction for an unknown reason."""
    if (  # the common case, checked in a few steps: bytes, no headers, a valid topic
        type(record) is SourceRecord
        and type(record.value) in _RAW
        and type(record.key) in _RAW
        and (record.partition is None or (type(record.partition) is int and record.partition >= 0))
        and not record.every_partition
        and type(record.topic) is str
        and _topic_problem(record.topic) is None
    ):
        shared = record.headers
        if not shared:
            return record.value, record.key, None
        # a task shares one headers tuple per table shape: checked once (kept by id, the
        # object held so its id is not reused)
        known = _CHECKED_HEADERS.get(id(shared))
        if known is not None and known[0] is shared:
            return record.value, record.key, known[1]
    if not isinstance(record, SourceRecord):
        raise BadRecord(f"poll() returned a {type(record).__name__}, not a rayconnect.SourceRecord")
    problem = _topic_problem(record.topic) if isinstance(record.topic, str) else "not a str"
    if (
        problem is None
        and record.partition is not None
        and (not isinstance(record.partition, int) or record.partition < 0)
    ):
        problem = f"partition must be None or an int >= 0, not {record.partition!r}"
    if problem is None and record.every_partition and record.partition is not None:
        problem = f"every_partition with partition {record.partition!r}: give one of them"
    try:
        value, key = to_bytes(record.value), to_bytes(record.key)
    except (TypeError, msgspec.EncodeError) as e:
        problem = problem or f"cannot encode as JSON: {e}"
    try:
        headers: list[tuple[str, bytes | None]] = list(record.headers or ())
    except TypeError:
        headers, problem = [], problem or f"headers must be a list of pairs, not {record.headers!r}"
    for header in headers:
        if problem is None and not (
            isinstance(header, tuple)
            and len(header) == 2
            and isinstance(header[0], str)
            and isinstance(header[1], bytes | None)
        ):
            problem = f"a header must be (str, bytes | None), not {header!r}"
    if problem is not None:
        where = f"{record.topic!r} at {record.source_partition!r}/{record.source_offset!r}"
        raise BadRecord(f"record for {where}: {problem}")
    if headers and type(record.headers) is tuple:
        if len(_CHECKED_HEADERS) >= _CHECKED_HEADERS_MAX:
            _CHECKED_HEADERS.clear()
        _CHECKED_HEADERS[id(record.headers)] = (record.headers, headers)
    return value, key, headers or None


#: headers tuples found valid: id -> (the tuple, its list as the producer takes it)
_CHECKED_HEADERS: dict[int, tuple[Any, list[tuple[str, bytes | None]]]] = {}
_CHECKED_HEADERS_MAX = 256


@functools.lru_cache(maxsize=1024)
def _topic_problem(topic: str) -> str | None:
    """Why ``topic`` is no topic name, or None; cached: checked for every record."""
    try:
        check_name("topic", topic)
    except ValueError as e:
        return str(e)
    return None


#: a dead letter carries at most this much of the value (the cause may be its size)
DEAD_LETTER_MAX_VALUE = 64 * 1024


def dead_letter(record: Any, reason: str) -> Encoded:
    """What goes to the dead-letter topic for ``record``: its value and key as far as they
    encode (else their repr), and the reason and origin as ``rayconnect.*`` headers."""

    def best_effort(x: Any) -> bytes | None:
        try:
            return to_bytes(x)
        except Exception:
            return repr(x).encode()

    value = best_effort(getattr(record, "value", record))
    key = best_effort(getattr(record, "key", None))
    size = None if value is None else len(value)
    if value is not None and len(value) > DEAD_LETTER_MAX_VALUE:  # e.g. a record too large
        value = value[:DEAD_LETTER_MAX_VALUE]
    origin = {
        "topic": getattr(record, "topic", None),
        "source_partition": getattr(record, "source_partition", None),
        "source_offset": getattr(record, "source_offset", None),
    }
    headers: list[tuple[str, bytes | None]] = [
        ("rayconnect.error", reason.encode()),
        ("rayconnect.origin", best_effort(origin)),
        ("rayconnect.value_bytes", str(size).encode()),  # more than the value if truncated
    ]
    return value, key, headers


def task_of(source_partition: Any, tasks: int) -> int:
    """The task that owns ``source_partition`` among ``tasks`` (stable across processes)."""
    return zlib.crc32(encode_partition(source_partition).encode()) % tasks


class TransactionContext:
    """Connector-defined transaction boundaries (``transaction_boundary="connector"``).

    Call from ``poll()``: ``commit_transaction()`` ends the transaction after the records this
    poll returns, ``commit_transaction(record)`` right after ``record`` (which must be among
    them); ``abort_transaction`` likewise drops them - their offsets are not committed, so a
    task that wants them written must return them again.
    """

    def __init__(self) -> None:
        self._requests: list[tuple[str, SourceRecord | None]] = []

    def commit_transaction(self, record: SourceRecord | None = None) -> None:
        self._requests.append(("commit", record))

    def abort_transaction(self, record: SourceRecord | None = None) -> None:
        self._requests.append(("abort", record))

    def take(self) -> list[tuple[str, SourceRecord | None]]:
        requests, self._requests = self._requests, []
        return requests


class SourceTaskContext:
    """What a task is told at ``start``: who it is and the committed offsets it resumes from.

    ``offsets`` is the combined view (the pipeline's own offsets topic over the global one)
    of every source partition of the pipeline, read with read_committed after this task's
    zombies were fenced; ``offset(p)`` looks one up, ``owned_offsets()`` lists this task's.

    ``pipeline_settings`` (the pipeline's ``SourceSettings``; None outside a task actor) and
    ``transactional`` are for a task whose helpers write to Kafka in transactions of their
    own (the Postgres source's snapshot workers): the target, the offsets topics and the
    transactional id their ids derive from - they fence and commit as the task does.
    """

    def __init__(
        self,
        pipeline: str,
        task_index: int,
        tasks: int,
        offsets: Mapping[str, Any],
        transaction_context: TransactionContext | None = None,
        pipeline_settings: Any = None,
        transactional: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.task_index = task_index
        self.tasks = tasks
        self.offsets = dict(offsets)
        self.transaction_context = transaction_context
        self.pipeline_settings = pipeline_settings
        self.transactional = transactional

    def offset(self, source_partition: Any) -> Any:
        """The committed source offset of ``source_partition``, or None."""
        return self.offsets.get(encode_partition(source_partition))

    def owns(self, source_partition: Any) -> bool:
        return task_of(source_partition, self.tasks) == self.task_index

    def owns_index(self, j: int) -> bool:
        return j % self.tasks == self.task_index

    def owned_offsets(self) -> list[tuple[Any, Any]]:
        return [
            (decode_partition(k), v)
            for k, v in self.offsets.items()
            if task_of(decode_partition(k), self.tasks) == self.task_index
        ]


class SourceTask:
    """Subclass this; every method is async. Only ``poll`` is required.

    ``poll`` should return within about a second (an empty list when there is nothing new):
    the framework commits, and stops, only between polls. ``transaction_boundary``: the one
    boundary the task works with, if it needs one (the pipeline refuses another).
    """

    transaction_boundary: ClassVar[str | None] = None

    async def start(self, context: SourceTaskContext) -> None:
        self.context = context

    async def poll(self) -> list[SourceRecord]:
        raise NotImplementedError

    async def commit_record(self, record: SourceRecord, metadata: RecordMetadata) -> None:
        """``record`` is committed in Kafka (called after its transaction commits)."""

    async def commit(self) -> None:
        """Everything polled so far is committed in Kafka."""

    async def stop(self) -> None:
        """Release resources; called once, after the last commit."""

    def check(self) -> None:
        """Called once by the process that starts the pipeline, before any task actor:
        raise ConfigError if the source cannot work (unreachable, missing permission)."""

    def metrics(self) -> dict[str, Any]:
        """What the task knows of its source (e.g. the replication slot's LSNs), shown in
        status."""
        return {}

    def lag(self) -> SourceLag | None:
        """How far behind the source the committed records are (None: the task cannot
        tell); shown in status and recorded as metrics every few seconds."""
        return None

    def helper_transactional_ids(self, transactional_id: str) -> list[str]:
        """The transactional ids the task's helpers write with (derived from the task's
        ``transactional_id``): fenced with the task's own, before its offsets are read - a
        helper that died mid-transaction would hold read_committed readers back on a broker
        that does not time transactions out, and must not commit afterwards."""
        return []

    def helper_records_committed(self) -> int:
        """Records the task's helpers committed in their own Kafka transactions (the
        Postgres source's snapshot workers): counted in the task's ``records_committed``."""
        return 0

    def topics(self) -> list[TopicSpec]:
        """The topics this task writes to, with the partitions to make them with, once
        ``start`` ran: the runner makes the missing ones before the first poll
        (``kafka.topics``), so no broker's auto-create picks the partition count, and a
        broker that refuses says so at start. [] (the default): the task's topics are
        the user's to make."""
        return []

    def lag_at_rest(self) -> SourceLag | None:
        """How far behind its source the pipeline is, asked of the source itself (blocking;
        None: it cannot tell): status shows it while the task is not running - failed,
        restarting, starting - when ``lag`` has nothing to say. Called on a task that may
        never have started (by ``SourcePipelineHandle.status`` for a task that does not
        answer)."""
        return None

    def request_snapshot(self, tables: list[str]) -> None:
        """Snapshot ``tables`` again while the pipeline runs (``rayconnect snapshot``),
        called from any process on a copy of the task (blocking); ConfigError if the source
        cannot, or the tables are not its own."""
        raise ConfigError(f"{type(self).__name__} cannot snapshot tables on demand")

    async def release(self) -> None:
        """Free what the source keeps for this pipeline (a replication slot): called by
        ``stop(release=True)`` after the task stopped, for a pipeline deleted for good."""


SettingsT = TypeVar("SettingsT", bound=msgspec.Struct)


class ConfiguredTask(SourceTask, Generic[SettingsT]):
    """A built-in source whose parameters are one settings Struct (``settings_type``): the
    constructor, the pipeline file's ``task:`` block and the checks all come from it, so a
    parameter is written once. The constructor takes the Struct's fields, positionally or by
    name, checks them as a pipeline file would (bounds included) and sets them as attributes.
    """

    settings_type: ClassVar[type[msgspec.Struct]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = self.settings_type.__struct_fields__
        if len(args) > len(fields):
            raise ConfigError(f"{type(self).__name__} takes at most {len(fields)} arguments")
        for name, value in zip(fields, args, strict=False):
            if name in kwargs:
                raise ConfigError(f"{type(self).__name__}: {name} given twice")
            kwargs[name] = value
        for name in kwargs:
            if name not in fields:
                raise no_such(type(self).__name__, name, fields)
        values = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in kwargs.items()}
        try:
            self.settings = cast(SettingsT, msgspec.convert(values, self.settings_type))
        except msgspec.ValidationError as e:
            raise ConfigError(f"{type(self).__name__}: {e}") from None
        for name in fields:
            setattr(self, name, getattr(self.settings, name))


def check_topic(field: str, topic: str) -> None:
    """ConfigError naming ``field`` unless ``topic`` is a valid Kafka topic name."""
    try:
        check_name("topic", topic)
    except ValueError as e:
        raise ConfigError(f"{field}: {e}") from None
