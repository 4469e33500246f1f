"""Micro-benchmark of one writer Spark job: N rows in G groups, warm writer, repeated.

    .venv/bin/python bench/micro_spark_write.py [--rows 20000,100000,400000] [--groups 8] [--repeat 3]

Starts a Ray session and the writer actor (Spark on Ray via RayDP), then times
``WriterActor.write_many`` (one Spark job for all groups) and prints the writer's split of
each job: prepare (lend refs, build the DataFrame) vs the Spark job itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray  # noqa: E402
from common import RaySession, ensure_session_latest  # noqa: E402
from micro_to_arrow import make_records  # noqa: E402

from rayconnect.actors.writer import start_writer  # noqa: E402
from rayconnect.kafka.to_arrow import records_to_batch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="20000,100000,400000")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with RaySession() as session:
        ensure_session_latest(session.session_dir)
        t = time.monotonic()
        writer = start_writer("micro/writer", timeout_s=300)
        print(f"writer ready in {time.monotonic() - t:.1f} s")
        table = tempfile.mkdtemp(prefix="rc-micro-")
        for rows in map(int, a.rows.split(",")):
            per = rows // a.groups
            batch = records_to_batch("local", make_records(min(per, 25_000)))
            chunks = max(1, per // batch.num_rows)
            groups = [[ray.put(batch) for _ in range(chunks)] for _ in range(a.groups)]
            total = sum(len(g) for g in groups) * batch.num_rows
            walls, stats = [], []
            for _ in range(a.repeat):
                t = time.perf_counter()
                ray.get(writer.write_many.remote(table, groups))
                walls.append(time.perf_counter() - t)
                stats.append(ray.get(writer.stats.remote()))
            s = stats[-1]
            print(
                f"{total:>8,} rows in {a.groups} groups: wall {statistics.median(walls):.2f} s "
                f"(prepare {s.last_prepare_s:.2f} s, spark {s.last_spark_s:.2f} s) "
                f"= {total / statistics.median(walls):,.0f} rows/s"
            )
        ray.get(writer.close.remote())


if __name__ == "__main__":
    main()
