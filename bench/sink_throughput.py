"""Sink pipeline throughput on the embedded broker: N records already in P partitions.

    .venv/bin/python bench/sink_throughput.py --records 1000000 --partitions 8

Prints one table: time to commit the whole backlog (from the moment every actor is up),
records/s and MB/s, rounds, round time (START to ACK) median and worst, Spark jobs and
jobs per round with data. Start-up (Ray, Spark) is reported apart: it is paid once.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time

import ray

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.kafka.admin import create_topic, produce_demo_records
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.progress import Progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--commit-interval", type=float, default=5.0)
    ap.add_argument("--flush-max-records", type=int, default=200_000)
    args = ap.parse_args()

    table = tempfile.mkdtemp(prefix="rc-bench-")
    with EmbeddedBroker("local") as broker:
        bootstrap = broker.bootstrap_servers
        asyncio.run(create_topic(bootstrap, "bench", args.partitions))
        p = Progress("produce", args.records)
        counts = asyncio.run(
            produce_demo_records(
                bootstrap, "bench", args.records, args.partitions, progress=p.update
            )
        )
        p.done(args.records)
        want = {f"local/bench/{k}": v for k, v in counts.items()}
        ray.init(namespace=names.NAMESPACE, log_to_driver=False)
        meta = rc.StaticMetadataService(
            (rc.KafkaStream("bench", {"local": rc.ClusterMetadata(bootstrap, ("bench",))}),)
        )
        t0 = time.monotonic()
        handle = rc.SinkPipeline(
            "bench",
            rc.KafkaSource(meta),
            rc.DeltaSink(table),
            commit_interval_s=args.commit_interval,
            flush_max_records=args.flush_max_records,
        ).start()
        startup = time.monotonic() - t0
        t0 = time.monotonic()
        progress = Progress("commit ", args.records)
        status = handle.wait_for(
            lambda s: progress.update(s.records_committed_since_start) or s["offsets"] == want,
            timeout_s=1800,
            poll_s=0.2,
        )
        elapsed = time.monotonic() - t0
        progress.done(status.records_committed_since_start)
        writer = ray.get_actor(names.writer("bench"), namespace=names.NAMESPACE)
        wstats = ray.get(writer.stats.remote())
        readers = handle.status().readers
        nbytes = sum(r.bytes_read for r in readers.values())
        handle.stop(commit=False)
        ray.shutdown()
    rounds = status.rounds_since_start.committed
    rows = [
        ("records", f"{args.records:,}"),
        ("partitions", args.partitions),
        ("start-up (Ray + Spark + actors)", f"{startup:.1f} s"),
        ("backlog committed in", f"{elapsed:.1f} s"),
        ("records/s", f"{args.records / elapsed:,.0f}"),
        ("MB/s (Arrow bytes read)", f"{nbytes / elapsed / 1e6:,.1f}"),
        ("rounds committed", rounds),
        (
            "round time median / worst",
            f"{status['round_s_median']:.2f} / {status['round_s_max']:.2f} s",
        ),
        ("commit latency median", f"{status['commit_s_median'] * 1000:.0f} ms"),
        ("Spark jobs (writes)", f"{wstats.spark_jobs} ({wstats.spark_writes})"),
        ("Spark jobs per committed round", f"{wstats.spark_jobs / max(rounds, 1):.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    shutil.rmtree(table, ignore_errors=True)


if __name__ == "__main__":
    main()
