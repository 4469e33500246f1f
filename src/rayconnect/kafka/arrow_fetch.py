"""The reader's fetch path: each fetched partition as Arrow-ready columns, not record objects.

A consumer created with ``key_deserializer=arrow_columns`` gets from ``getmany`` ONE
``RecordColumns`` per fetched partition (``kafka.record_batches``) instead of one
``ConsumerRecord`` per record. aiokafka 0.14 (pinned) is hooked at two points of its fetcher,
installed by :func:`install`, and used for rayconnect's consumers only (``compat.own``); any
other consumer in the process gets aiokafka's own classes there:

- ``MemoryRecords`` -> a wrapper that keeps the fetched bytes (aiokafka's C class does not
  expose them), so the batches can be decoded straight from the buffer;
- ``PartitionRecords`` -> :class:`ArrowPartitionRecords`, a subclass of the read_committed fix
  (``compat.MarkerAwarePartitionRecords``). Per batch it keeps aiokafka's own rules - CRC check,
  aborted transactions, control batches skipped, records before the fetch offset dropped - and
  only the decoding of the records that pass changes: all at once, not one object each.

The position moves exactly as in aiokafka: past every batch looked at. ``max_records`` of
``getmany`` counts fetched partitions in this mode, not records: a poll is bounded by the
fetch sizes instead, and the reader hands a fetch on in pieces of ``max_poll_records``.

Without :func:`install`, ``arrow_columns`` is the identity: the consumer gets
``ConsumerRecord``s as usual (the reader accepts both).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import aiokafka.consumer.fetcher as _fetcher
import aiokafka.errors as _errors

from rayconnect.kafka import aiokafka_hooks, compat
from rayconnect.kafka.aiokafka_hooks import Hook
from rayconnect.kafka.record_batches import (
    RecordColumns,
    batch_spans,
    columns_of,
    decode_batches,
)


def arrow_columns(key: bytes | None) -> bytes | None:
    """The marker a consumer passes as ``key_deserializer`` to get ``RecordColumns``."""
    return key


def _memory_records(data: bytes) -> Any:
    """What aiokafka's fetcher builds as ``MemoryRecords(data)``."""
    if compat.in_rayconnect_fetch():
        return _KeptMemoryRecords(data)
    return aiokafka_hooks.ORIGINAL_MEMORY_RECORDS(data)


def _partition_records(*args: Any, **kwargs: Any) -> Any:
    """What aiokafka's fetcher builds as ``PartitionRecords(...)``."""
    if compat.in_rayconnect_fetch():
        return ArrowPartitionRecords(*args, **kwargs)
    return aiokafka_hooks.ORIGINAL_PARTITION_RECORDS(*args, **kwargs)


class _KeptMemoryRecords:
    """aiokafka's ``MemoryRecords``, plus the bytes it was built from."""

    __slots__ = ("_records", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._records = aiokafka_hooks.ORIGINAL_MEMORY_RECORDS(data)

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        return self._records.next_batch()

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())


class ArrowPartitionRecords(compat.MarkerAwarePartitionRecords):
    """``PartitionRecords`` that yields one ``RecordColumns`` for a marked consumer."""

    def __init__(self, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
        self._data = getattr(records, "data", None)
        super().__init__(tp, records, *args, **kwargs)

    def _unpack_records(self) -> Iterator[Any]:
        if self._key_deserializer is not arrow_columns:
            yield from super()._unpack_records()
            return
        fetch_offset = self.next_fetch_offset
        kept = list(self._passing_batches())
        if not kept:
            return
        columns = self._decode(kept, fetch_offset)
        if len(columns):
            yield columns

    def _passing_batches(self) -> Iterator[Any]:
        """The batches whose records are handed out, by aiokafka's rules (``_unpack_records``
        of aiokafka 0.14, minus the per-record loop); moves ``next_fetch_offset`` past every
        batch looked at."""
        records = self._records
        while records.has_next():
            batch = records.next_batch()
            if batch is None:
                break
            if self._check_crcs and not batch.validate_crc():
                raise _errors.CorruptRecordException(f"Invalid CRC - {self._tp}")
            skip = batch.is_control_batch
            if self._isolation_level == _fetcher.READ_COMMITTED and batch.producer_id is not None:
                self._consume_aborted_up_to(batch.base_offset)
                if batch.is_control_batch and self._contains_abort_marker(batch):
                    self._aborted_producers.discard(batch.producer_id)
                skip = skip or (
                    batch.is_transactional and batch.producer_id in self._aborted_producers
                )
            if not skip:
                yield batch
            self.next_fetch_offset = batch.next_offset

    def _decode(self, batches: list[Any], fetch_offset: int) -> RecordColumns:
        if self._data is not None:
            spans = batch_spans(self._data)
            at = [span for b in batches if (span := spans.get(b.base_offset)) is not None]
            if len(at) == len(batches):
                columns = decode_batches(self._data, at, fetch_offset)
                if columns is not None:
                    return columns
        # Old formats, a missing codec, bytes that do not add up: aiokafka's decoder.
        return columns_of([r for b in batches for r in b if r.offset >= fetch_offset])


_lock = threading.Lock()


def install() -> None:
    """Hook aiokafka's fetcher (idempotent); also applies the compat fixes it builds on."""
    compat.apply()
    with _lock:
        aiokafka_hooks.replace(Hook.MEMORY_RECORDS, _memory_records)
        aiokafka_hooks.replace(Hook.PARTITION_RECORDS, _partition_records)
