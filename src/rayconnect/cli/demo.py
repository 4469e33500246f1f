"""``rayconnect demo``: the first round trip, end to end on real parts.

Embedded broker -> N demo records -> aiokafka reads them into Arrow -> the Spark writer actor
(Spark on Ray via RayDP) writes Parquet -> the Delta committer commits the files AND each
partition's next offset in ONE table version. The demo then verifies what it claims: exactly
N rows, N distinct (topic, partition, offset), committed offsets equal to the produced counts;
its exit status says whether that held.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.progress import Progress

PIPELINE = "demo"
CLUSTER = "local"
TOPIC = "demo-events"


class DemoError(RuntimeError):
    """The demo cannot run with the arguments given."""


@dataclass
class DemoResult:
    rows: int
    distinct: int
    offsets: dict[str, int]
    expected: dict[str, int]
    exact: bool
    version: int
    elapsed_s: float
    table: str
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        n = sum(self.expected.values())
        return (
            self.exact and self.rows == n and self.distinct == n and self.offsets == self.expected
        )


async def _read_all(
    bootstrap: str, topic: str, expected: dict[int, int], chunk_records: int
) -> list[pa.RecordBatch]:
    """Read every partition from offset 0 to its high watermark, as Arrow batches."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from rayconnect.kafka.to_arrow import records_to_batch

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(expected)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        total = sum(expected.values())
        progress = Progress("read   ", total)
        batches: list[pa.RecordBatch] = []
        pending: list = []
        done = 0
        while done < total:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=chunk_records)
            for tp, records in fetched.items():
                limit = expected[tp.partition]
                records = [r for r in records if r.offset < limit]
                pending.extend(records)
                done += len(records)
            if len(pending) >= chunk_records or (done >= total and pending):
                batches.append(records_to_batch(CLUSTER, pending))
                pending = []
            progress.update(done)
        progress.done(done)
        return batches
    finally:
        await consumer.stop()


def run_demo(
    records: int = 100_000,
    partitions: int = 4,
    table: str | None = None,
    *,
    chunk_records: int = 50_000,
    out=sys.stdout,
) -> DemoResult:
    import ray

    from rayconnect.actors.writer import start_writer
    from rayconnect.kafka import compat
    from rayconnect.kafka.admin import create_topic, produce_demo_records
    from rayconnect.kafka.embedded import EmbeddedBroker
    from rayconnect.protocol import TopicPartition
    from rayconnect.spark_bridge.delta import DeltaCommitter
    from rayconnect.spark_bridge.session import require_java

    require_java()
    compat.apply()
    table_path = str(Path(table or tempfile.mkdtemp(prefix="rayconnect-demo-")).resolve())
    if Path(table_path, "_delta_log").exists():
        raise DemoError(
            f"{table_path} already holds a Delta table; the demo starts a fresh broker whose "
            "offsets restart at 0, so give it a new --table path (or none for a temp folder)"
        )
    started = time.monotonic()
    timings: dict[str, float] = {}
    print(
        f"rayconnect demo: {records:,} records, {partitions} partitions -> {table_path}", file=out
    )

    with EmbeddedBroker(cluster_id=CLUSTER) as broker:
        bootstrap = broker.bootstrap_servers
        print(f"  broker      tansu at {bootstrap} (log {broker.log_path})", file=out)
        t = time.monotonic()
        asyncio.run(create_topic(bootstrap, TOPIC, partitions))
        produce_progress = Progress("produce", records)
        counts = asyncio.run(
            produce_demo_records(
                bootstrap, TOPIC, records, partitions, progress=produce_progress.update
            )
        )
        produce_progress.done(records)
        timings["produce_s"] = time.monotonic() - t

        t = time.monotonic()
        print("  ray         starting a local Ray and the Spark writer (~20-30 s)...", file=out)
        ray.init(namespace="rayconnect", ignore_reinit_error=True, log_to_driver=False)
        try:
            writer = start_writer(f"{PIPELINE}/writer", timeout_s=300)
            timings["startup_s"] = time.monotonic() - t

            committer = DeltaCommitter(table_path, PIPELINE)
            committer.ensure_table()
            keys = {p: TopicPartition(CLUSTER, TOPIC, p).key for p in range(partitions)}
            before = committer.committed_offsets(keys.values())

            t = time.monotonic()
            batches = asyncio.run(_read_all(bootstrap, TOPIC, counts, chunk_records))
            timings["read_s"] = time.monotonic() - t

            t = time.monotonic()
            refs = [ray.put(b) for b in batches]
            files = ray.get(writer.write.remote(table_path, refs), timeout=600)
            timings["write_s"] = time.monotonic() - t
            print(f"  write       {len(files)} Parquet files in one Spark job", file=out)

            t = time.monotonic()
            offsets = {keys[p]: n for p, n in counts.items()}
            version = committer.commit(
                files,
                offsets=offsets,
                expected={k: before.get(k) for k in offsets},
                metadata={"pipeline": PIPELINE, "source": "rayconnect demo"},
            )
            timings["commit_s"] = time.monotonic() - t
        finally:
            ray.shutdown()

    elapsed = time.monotonic() - started
    result = _verify(table_path, committer, keys, counts, version, elapsed)
    result.timings = timings
    _summary(result, out)
    return result


def _verify(table_path, committer, keys, counts, version, elapsed) -> DemoResult:
    """Read the table back: rows, distinct (topic, partition, offset) and that each partition
    holds exactly the offsets 0..count-1, nothing else."""
    from deltalake import DeltaTable

    data = DeltaTable(table_path).to_pyarrow_table(columns=["topic", "partition", "offset"])
    distinct = data.group_by(["topic", "partition", "offset"]).aggregate([]).num_rows
    exact = True
    for p, n in counts.items():
        offs = data.filter(pc.equal(data["partition"], p))["offset"].to_numpy()
        exact = exact and len(offs) == n and bool((np.sort(offs) == np.arange(n)).all())
    return DemoResult(
        rows=data.num_rows,
        distinct=distinct,
        exact=exact,
        offsets=committer.committed_offsets(keys.values()),
        expected={keys[p]: n for p, n in counts.items()},
        version=version,
        elapsed_s=elapsed,
        table=table_path,
    )


def _summary(r: DemoResult, out) -> None:
    n = sum(r.expected.values())
    print("", file=out)
    print(
        f"  rows in table      {r.rows:,} ({r.distinct:,} distinct topic/partition/offset)",
        file=out,
    )
    print(f"  table version      {r.version}", file=out)
    print(
        "  committed offsets  " + ", ".join(f"{k}={v}" for k, v in sorted(r.offsets.items())),
        file=out,
    )
    print(
        f"  elapsed            {r.elapsed_s:.1f} s ({n / r.elapsed_s:,.0f} records/s end to end)",
        file=out,
    )
    steps = ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in r.timings.items())
    print(f"  steps              {steps}", file=out)
    data_s = sum(r.timings.get(k, 0.0) for k in ("read_s", "write_s", "commit_s"))
    if data_s:
        print(f"  data path          {n / data_s:,.0f} records/s (read + write + commit)", file=out)
    print(f"  table              {r.table}", file=out)
    print(
        f"  read it            python -c \"import polars as pl; print(pl.read_delta('{r.table}'))\"",
        file=out,
    )
    print(
        f"                     duckdb -c \"INSTALL delta; LOAD delta; SELECT count(*) FROM delta_scan('{r.table}')\"",
        file=out,
    )
    verdict = "OK: exactly once" if r.ok else "FAILED: table does not match what was produced"
    print(f"  result             {verdict}", file=out)
