"""The snapshot workers write their chunks themselves (real Postgres, embedded broker, Ray):
a keyed table cut into many chunks and a keyless one (one job, one transaction) are in
Kafka exactly once - read_committed, every row once, no other - and each chunk's progress
is committed, done, under the plan the task committed."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from fixtures.postgres import PostgresServer

import rayconnect as rc
from rayconnect.kafka.offsets_store import read_offsets
from rayconnect.kafka.read_back import read_topic

pytestmark = [pytest.mark.usefixtures("ray_session")]


@pytest.mark.timeout(120)
def test_workers_write_every_row_once_with_their_chunks_progress(
    postgres: PostgresServer, kafka_broker
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    postgres.psql(
        "CREATE TABLE keyed (id bigint PRIMARY KEY, s text);"
        "INSERT INTO keyed SELECT g, 'k' || g FROM generate_series(1, 3000) g;"
        "CREATE TABLE heap (n int, s text); ALTER TABLE heap REPLICA IDENTITY FULL;"
        "INSERT INTO heap SELECT g % 700, 'h' FROM generate_series(1, 2000) g;"
        "ANALYZE keyed; ANALYZE heap"
    )
    source = rc.PostgresSource(
        dsn=postgres.dsn, slot="rc_workers", tables=["keyed", "heap"],
        password_file=postgres.password_file, batch_size=200,
        snapshot_parallelism=2, snapshot_chunk_rows=500,
    )  # fmt: skip
    pipeline = rc.SourcePipeline(
        "pg-workers", task=source, target=rc.KafkaTarget(bootstrap),
        transaction_boundary="connector", exactly_once="required",
    )  # fmt: skip
    handle = pipeline.start()
    try:
        status = handle.wait_for(
            lambda s: s["tasks"][0].get("source", {}).get("phase") == "stream", 90, 0.2
        )
        assert status["tasks"][0]["records_committed"] == 5000  # the workers' rows
    finally:
        handle.stop(release=True)
    keyed = asyncio.run(read_topic(bootstrap, "pg.public.keyed", "read_committed"))
    ids = Counter(json.loads(k)["id"] for k, _ in keyed)
    assert set(ids) == set(range(1, 3001)) and max(ids.values()) == 1
    heap = asyncio.run(read_topic(bootstrap, "pg.public.heap", "read_committed"))
    rows = Counter(json.loads(v)["after"]["n"] for _, v in heap)
    assert rows == Counter(g % 700 for g in range(1, 2001))
    offsets = asyncio.run(
        read_offsets(bootstrap, "rayconnect-offsets-pg-workers", "pg-workers")
    ).offsets
    chunks = [v for k, v in offsets.items() if "snapshot_chunk" in k]
    assert len(chunks) > 6  # the keyed table in 500-row chunks, the heap's pages
    assert len({c["plan"] for c in chunks}) == 1
    assert all(c["chunk"][5] for c in chunks)  # done (Chunk is array-like)
