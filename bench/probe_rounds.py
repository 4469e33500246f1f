"""Where a round's time goes under a steady load: samples the coordinator and the writer.

    .venv/bin/python bench/probe_rounds.py [--rate 10000] [--seconds 40] [--interval 2]
        [--partitions 8]

Offers ``--rate`` records/s to ``--partitions`` partitions for ``--seconds`` while a sink pipeline with
``commit_interval_s=--interval`` runs, then prints the rounds' END->START times, the writer's
Spark write times (prepare + Spark), the writer calls per round (one per participant host
since issue 28.2) and produce-to-visible percentiles. A diagnostic for
scenario (b), not part of ``run.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow.parquet as pq  # noqa: E402
import ray  # noqa: E402
from common import (  # noqa: E402
    Helper,
    RaySession,
    delta_visibility,
    percentiles,
    produce_to_visible_ms,
)
from rc_runner import start_live, stop, wait_committed  # noqa: E402

from rayconnect.actors import names  # noqa: E402
from rayconnect.kafka.admin import create_topic  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--caught-up", action="store_true", help="commit_when_caught_up=True")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other CommitSettings field (a JSON value), e.g. --set flush_max_age_s=0.5",
    )
    a = ap.parse_args()
    settings = {"commit_interval_s": a.interval, "commit_when_caught_up": a.caught_up}
    settings.update((k, json.loads(v)) for k, v in (kv.split("=", 1) for kv in a.set))
    with EmbeddedBroker("probe") as broker, RaySession(), tempfile.TemporaryDirectory() as tmp:
        bs = broker.bootstrap_servers
        asyncio.run(create_topic(bs, "probe", a.partitions))
        handle = start_live(
            "probe",
            bs,
            "probe",
            f"{tmp}/t",
            settings,
        )
        writer = ray.get_actor(names.writer("probe"), namespace=names.NAMESPACE)
        coord = ray.get_actor(names.coordinator("probe"), namespace=names.NAMESPACE)
        writes: dict[int, tuple[float, float, float]] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                s = ray.get(writer.stats.remote())
                here = not s.spark_writes  # every write made without Spark (latency profile)
                writes[s.spark_writes + s.writes_here] = (
                    (s.last_write_here_s if here else s.last_write_s) or 0,
                    s.last_prepare_s or 0,
                    s.last_spark_s or 0,
                )
                time.sleep(0.2)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            producer = Helper("paced_producer.py", bs, "probe", a.rate, a.seconds)
            producer.wait_ready()
            res = producer.result(a.seconds + 120)
            status = wait_committed(handle, "probe", res["counts"], timeout_s=120)
            done.set()
            t.join()
            s = ray.get(coord.status.remote())
            calls = ray.get(writer.stats.remote()).calls
        finally:
            stop("probe", handle)
        lat = percentiles(produce_to_visible_ms(f"{tmp}/t"))
        print("version  records  visible-after (s): oldest / newest record (the first 25)")
        rows = []
        for version, committed, adds in delta_visibility(f"{tmp}/t"):
            ts = [
                pq.read_table(os.path.join(tmp, "t", unquote(rel)), columns=["timestamp"])[
                    "timestamp"
                ]
                .cast("int64")
                .to_numpy()
                / 1e6
                for rel in adds
            ]
            if ts:
                lo = min(t.min() for t in ts)
                hi = max(t.max() for t in ts)
                n = sum(len(t) for t in ts)
                rows.append((version, n, committed - lo, committed - hi))
        line = "{:>7}  {:>7}  {:6.2f} / {:6.2f}"
        for row in rows[:25]:
            print(line.format(*row))
        print("the 8 versions whose oldest record waited longest:")
        for row in sorted(rows, key=lambda r: -r[2])[:8]:
            print(line.format(*row))
        w = [v for k, v in sorted(writes.items()) if k > 1]  # the warm-up write is #1
        med = lambda i: statistics.median(x[i] for x in w) if w else float("nan")  # noqa: E731
        rounds = status.rounds_since_start.committed
        print(f"rounds committed {rounds}, writes {len(w)}")
        print(f"writer calls {calls}, {calls / max(rounds, 1):.1f} a round")
        print(f"round START->ACK median {s['round_s_median']:.2f} s")
        print(f"END->next START median {s['end_to_start_s_median']:.2f} s")
        print(f"write median {med(0):.2f} s (prepare {med(1):.2f} s, spark {med(2):.2f} s)")
        print(f"commit median {s['commit_s_median'] * 1000:.0f} ms")
        print(f"produce-to-visible p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms")


if __name__ == "__main__":
    main()
