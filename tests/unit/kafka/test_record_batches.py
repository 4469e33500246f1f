"""The reader's batch decoder (kafka/record_batches.py) and fetch hook (kafka/arrow_fetch.py).

The reference is aiokafka's own decoder (its C extension, the one the reader used before):
on any records the fast path must give the same offsets, timestamps, keys and values, or
say it cannot (``None``) and let the fallback - that same decoder - do it.
"""

from __future__ import annotations

import aiokafka.consumer.fetcher as fetcher
import pyarrow as pa
import pytest
from aiokafka import TopicPartition
from aiokafka.consumer.fetcher import READ_COMMITTED
from aiokafka.record.memory_records import MemoryRecords
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_batches import ABORT, COMMIT, batch, marker, records_batch

from rayconnect.kafka import arrow_fetch
from rayconnect.kafka.arrow_fetch import ArrowPartitionRecords, _KeptMemoryRecords, arrow_columns
from rayconnect.kafka.record_batches import RecordColumns, batch_spans, columns_of, decode_batches
from rayconnect.kafka.to_arrow import columns_to_batch, records_to_batch

pytestmark = pytest.mark.timeout(120)

TP = TopicPartition("t", 0)
GZIP = 1
CODECS = [0, GZIP, 2, 3, 4]  # none, gzip, snappy, lz4, zstd (the last three via cramjam)

blob = st.one_of(
    st.none(),
    st.binary(max_size=12),  # inline in an Arrow binary view
    st.binary(min_size=13, max_size=300),  # out of line
    # record length needs a 3-byte varint (cheap to generate: one byte repeated)
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=1), st.integers(8_000, 20_000)),
)
header = st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=30)))
record = st.tuples(
    st.integers(0, 2**41),
    blob,
    blob,
    st.one_of(st.just([]), st.lists(header, max_size=4)),  # most records: no headers
)


def aiokafka_records(data: bytes, from_offset: int = 0) -> list:
    records = MemoryRecords(data)
    out = []
    while records.has_next():
        out.extend(r for r in records.next_batch() if r.offset >= from_offset)
    return out


def assert_same(ours: RecordColumns, reference: RecordColumns) -> None:
    assert ours.offsets.tolist() == reference.offsets.tolist()
    assert ours.timestamps_ms.tolist() == reference.timestamps_ms.tolist()
    assert ours.keys.equals(reference.keys)
    assert ours.values.equals(reference.values)
    assert header_lists(ours) == header_lists(reference)


def header_lists(columns: RecordColumns) -> list:
    """Each record's headers (``headers=None`` stands for no record having any)."""
    if columns.headers is None:
        return [[]] * len(columns)
    return columns.headers.to_pylist()


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.lists(record, min_size=1, max_size=20), st.sampled_from(CODECS)),
        min_size=1,
        max_size=6,
    ),
    first_offset=st.integers(0, 1_000),
    skip=st.integers(0, 30),
)
def test_decode_matches_aiokafka(batches: list, first_offset: int, skip: int) -> None:
    data, offset = b"", first_offset
    for records, compression in batches:
        data += records_batch(offset, records, compression=compression)
        offset += len(records) + 3  # gaps between batches, as compaction leaves them
    spans = list(batch_spans(data).values())
    assert len(spans) == len(batches)
    from_offset = first_offset + skip  # a fetch may start inside the first batch
    ours = decode_batches(data, spans, from_offset)
    assert ours is not None
    assert_same(ours, columns_of(aiokafka_records(data, from_offset)))


def test_what_the_fast_path_does_not_cover_is_declined() -> None:
    plain = [(1, b"k", b"v" * 40, [])]
    unknown_codec = bytearray(records_batch(0, plain))
    unknown_codec[22] |= 0x07
    assert decode_batches(bytes(unknown_codec), [(0, len(unknown_codec))], 0) is None
    # bytes that do not add up: a record length that runs past its batch
    broken = bytearray(records_batch(0, plain))
    broken[61] = 0x7E  # first record's length varint: 63 bytes
    assert decode_batches(bytes(broken), list(batch_spans(bytes(broken)).values()), 0) is None


def test_log_append_time_batches_use_the_batch_timestamp() -> None:
    data = records_batch(5, [(1, b"a", b"x", []), (2, b"b", b"y", [])], log_append_time=777)
    ours = decode_batches(data, list(batch_spans(data).values()), 0)
    assert ours is not None and ours.timestamps_ms.tolist() == [777, 777]
    assert [r.timestamp for r in aiokafka_records(data)] == [777, 777]


def test_a_truncated_last_batch_is_left_out() -> None:
    data = records_batch(0, [(1, b"a", b"x", [])]) + records_batch(1, [(1, b"b", b"y", [])])
    assert list(batch_spans(data[:-3])) == [0]
    assert list(batch_spans(data)) == [0, 1]


def read(
    data: bytes, fetch_offset: int = 0, deserializer: object = arrow_columns
) -> tuple[list, int]:
    records = ArrowPartitionRecords(
        TP, _KeptMemoryRecords(data), [], fetch_offset, deserializer, None, False, READ_COMMITTED
    )
    return list(records), records.next_fetch_offset


def test_fetch_hook_keeps_aiokafkas_transaction_rules() -> None:
    # 0 committed (pid 1) | 1 COMMIT | 2-3 aborted (pid 2) | 4 ABORT | 5-6 plain | 7-8 open txn
    data = (
        batch(0, 1, [b"c"])
        + marker(1, 1, COMMIT)
        + batch(2, 2, [b"a1", b"a2"])
        + marker(4, 2, ABORT)
        + batch(5, -1, [b"p1", b"p2"], txn=False)
        + batch(7, 3, [b"u1", b"u2"])
    )
    items, next_offset = read(data)
    assert len(items) == 1 and isinstance(items[0], RecordColumns)
    assert items[0].offsets.tolist() == [0, 5, 6]
    assert items[0].values.to_pylist() == [b"c", b"p1", b"p2"]
    assert next_offset == 7  # held back at the undecided transaction, as compat does
    # from inside a batch: the records before the fetch offset are dropped
    items, next_offset = read(data, fetch_offset=6)
    assert items[0].offsets.tolist() == [6] and next_offset == 7
    # only control/aborted batches: nothing handed out, the position still moves past them
    assert read(batch(2, 2, [b"a"]) + marker(3, 2, ABORT)) == ([], 4)
    # an unmarked consumer gets aiokafka's ConsumerRecords, as before
    records, next_offset = read(data, deserializer=None)
    assert [r.value for r in records] == [b"c", b"p1", b"p2"] and next_offset == 7


def test_fetch_hook_decodes_headers() -> None:
    rows = [(i, b"k%d" % i, b"v" * i, [("h", b"%d" % i)] if i == 3 else []) for i in range(6)]
    for data in (records_batch(0, rows), records_batch(0, rows, compression=GZIP)):
        (items,), _ = read(data, fetch_offset=1)
        assert_same(items, columns_of(aiokafka_records(data, 1)))
        assert items.headers.to_pylist() == [[], [], [{"key": "h", "value": b"3"}], [], []]


def test_columns_to_batch_equals_records_to_batch() -> None:
    rows = [
        (i, None if i == 2 else b"k", b"v%d" % i, [("h", b"x")] if i == 1 else []) for i in range(5)
    ]
    data = records_batch(40, rows[:2]) + records_batch(42, rows[2:])
    (items,), _ = read(data)
    halves = [items, items]  # two fetches of one poll are concatenated
    consumer_records = [
        fetcher.ConsumerRecord(
            "t", 0, r.offset, r.timestamp, 0, r.key, r.value, None, 0, 0, r.headers
        )
        for r in aiokafka_records(data)
    ]
    expected = records_to_batch("c", consumer_records)
    assert columns_to_batch("c", "t", 0, [items]).equals(expected)
    doubled = columns_to_batch("c", "t", 0, halves)
    assert doubled.equals(pa.concat_batches([expected, expected]))


def test_install_hooks_the_fetcher_and_is_idempotent() -> None:
    saved = fetcher.PartitionRecords, fetcher.MemoryRecords
    try:
        arrow_fetch.install()
        arrow_fetch.install()
        assert fetcher.PartitionRecords is arrow_fetch._partition_records
        assert fetcher.MemoryRecords is arrow_fetch._memory_records
        kept = _KeptMemoryRecords(batch(0, -1, [b"x"], txn=False))
        assert kept.has_next() and kept.next_batch().base_offset == 0
    finally:
        fetcher.PartitionRecords, fetcher.MemoryRecords = saved
    assert arrow_columns(b"k") == b"k"  # the identity: harmless without the hook
