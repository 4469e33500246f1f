"""The baseline: what a user would write without rayconnect - kafka-delta-ingest, plainly.

    python bench/baseline.py BOOTSTRAP TOPIC TABLE EXPECTED [--flush-records N] [--flush-age S]
                                                        [--max-records N]

One Python process, one asyncio loop: aiokafka -> pyarrow -> ``deltalake.write_deltalake``
append. Every ``--flush-records`` records (or ``--flush-age`` seconds, whichever first) the
buffer becomes one Parquet file and one Delta version that carries one txn action per
partition (app id ``<topic>/<partition>``, version = next offset), so a restart resumes
from the table exactly once (kafka-delta-ingest's design). Conversion is the obvious
column-by-column ``from_pydict``, headers built only when a record has some. Prints READY
once assigned, then one JSON line at the end.

Its defaults are the strongest plain loop measured here (issue 13: ``getmany(max_records=
20000)``, 4 MiB partition fetches, a version every 50k records): a weak baseline flatters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import pyarrow as pa
from aiokafka import AIOKafkaConsumer, TopicPartition
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from rayconnect.schema import RAW_RECORD_SCHEMA

SCHEMA = pa.schema([f.with_nullable(True) for f in RAW_RECORD_SCHEMA])


_NO_HEADERS = pa.array([], SCHEMA.field("headers").type.value_type)


def _headers(records: list) -> pa.Array:
    """The headers column; all-empty (the common case) without a Python list per record."""
    if any(r.headers for r in records):
        return pa.array(
            [[{"key": k, "value": v} for k, v in r.headers] for r in records],
            SCHEMA.field("headers").type,
        )
    zeros = pa.array([0] * (len(records) + 1), pa.int32())
    return pa.ListArray.from_arrays(zeros, _NO_HEADERS, type=SCHEMA.field("headers").type)


def to_batch(cluster: str, records: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "cluster": [cluster] * len(records),
            "topic": [r.topic for r in records],
            "partition": [r.partition for r in records],
            "offset": [r.offset for r in records],
            "timestamp": [r.timestamp * 1000 for r in records],
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "headers": _headers(records),
        },
        schema=SCHEMA,
    )


def to_batch_json(cluster: str, records: list) -> pa.RecordBatch:
    """``--json``: what a one-process consumer writes for typed tables - each value parsed
    with ``json.loads`` (one dict per record), the Kafka coordinates beside it."""
    rows = []
    for r in records:
        row = json.loads(r.value)
        row.update(
            _kafka_cluster=cluster,
            _kafka_topic=r.topic,
            _kafka_partition=r.partition,
            _kafka_offset=r.offset,
            _kafka_timestamp=r.timestamp * 1000,
        )
        rows.append(row)
    batch = pa.RecordBatch.from_pylist(rows)
    ts = batch.schema.get_field_index("_kafka_timestamp")
    return batch.set_column(
        ts, "_kafka_timestamp", batch.column(ts).cast(pa.timestamp("us", tz="UTC"))
    )


#: The table's delta-rs storage options as JSON (a table on object storage), from the
#: environment rather than the command line, where every process listing would show them.
STORAGE_ENV = "BENCH_BASELINE_STORAGE_OPTIONS"


async def resume_consumer(
    bootstrap: str, topic: str, dt: DeltaTable
) -> tuple[AIOKafkaConsumer, dict[int, int]]:
    """A started consumer of every partition of ``topic`` at the table's txn versions (app id
    ``<topic>/<partition>``): a restart resumes exactly once; and those offsets."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(tps)
    committed: dict[int, int] = {}
    for tp in tps:
        committed[tp.partition] = dt.transaction_version(f"{topic}/{tp.partition}") or 0
        consumer.seek(tp, committed[tp.partition])
    return consumer, committed


async def main(a: argparse.Namespace) -> dict:
    storage = json.loads(os.environ.get(STORAGE_ENV) or "{}") or None
    if not DeltaTable.is_deltatable(a.table, storage_options=storage):
        if a.json:  # typed: the table takes the first batch's schema
            schema = pa.schema(
                [
                    pa.field("_kafka_cluster", pa.string()),
                    pa.field("_kafka_topic", pa.string()),
                    pa.field("_kafka_partition", pa.int64()),
                    pa.field("_kafka_offset", pa.int64()),
                    pa.field("_kafka_timestamp", pa.timestamp("us", tz="UTC")),
                ]
            )
        else:
            schema = SCHEMA
        DeltaTable.create(a.table, schema, mode="ignore", storage_options=storage)
    dt = DeltaTable(a.table, storage_options=storage)
    consumer, committed = await resume_consumer(a.bootstrap, a.topic, dt)
    print("READY", flush=True)
    t0_wall = None
    buffered: list[pa.RecordBatch] = []
    n_buffered = 0
    next_offsets = dict(committed)
    last_flush = time.monotonic()
    t0 = None
    versions = write_s = 0.0
    total = 0
    try:
        while sum(committed.values()) < a.expected:
            fetched = await consumer.getmany(timeout_ms=200, max_records=a.max_records)
            for tp, records in fetched.items():
                if not records:
                    continue
                if t0 is None:
                    t0, t0_wall = time.perf_counter(), time.time()
                buffered.append((to_batch_json if a.json else to_batch)("local", records))
                n_buffered += len(records)
                next_offsets[tp.partition] = records[-1].offset + 1
            now = time.monotonic()
            if n_buffered and (n_buffered >= a.flush_records or now - last_flush >= a.flush_age):
                w0 = time.perf_counter()
                moved = {p: o for p, o in next_offsets.items() if o != committed[p]}
                data = (
                    pa.concat_tables(
                        [pa.Table.from_batches([b]) for b in buffered], promote_options="permissive"
                    )
                    if a.json
                    else pa.Table.from_batches(buffered, SCHEMA)
                )
                write_deltalake(
                    dt,
                    data,
                    mode="append",
                    schema_mode="merge" if a.json else None,
                    commit_properties=CommitProperties(
                        app_transactions=[
                            Transaction(f"{a.topic}/{p}", o) for p, o in moved.items()
                        ]
                    ),
                )
                dt.update_incremental()
                write_s += time.perf_counter() - w0
                versions += 1
                total += n_buffered
                committed.update(moved)
                buffered, n_buffered, last_flush = [], 0, now
        elapsed = time.perf_counter() - (t0 or time.perf_counter())
    finally:
        await consumer.stop()
    return {
        "records": total,
        "seconds": elapsed,
        "records_per_s": total / elapsed if elapsed else None,
        "versions": int(versions),
        "write_s": write_s,
        "pid": os.getpid(),
        "t0_wall": t0_wall,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("table")
    ap.add_argument("expected", type=int)
    ap.add_argument("--flush-records", type=int, default=50_000)
    ap.add_argument("--max-records", type=int, default=20_000, help="getmany's max_records")
    ap.add_argument("--json", action="store_true", help="decode JSON values into columns")
    ap.add_argument("--flush-age", type=float, default=5.0)
    print(json.dumps(asyncio.run(main(ap.parse_args()))), flush=True)
