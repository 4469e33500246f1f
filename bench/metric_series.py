"""How many Prometheus series a routed sink of T tables x P partitions exports (issue 27.4).

Records every metric a running pipeline records - per partition (read, committed, a dead
letter on one), per route table (committed, lag), per pipeline (rounds, outage, the two
histograms) - through ``rayconnect.metrics.SinkMetrics`` in one actor of a local Ray, then
scrapes the node's metrics port and counts the ``ray_rayconnect_*`` sample lines (each one
series; a histogram's buckets, _sum and _count each count).

    python bench/metric_series.py --tables 200 --partitions 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import socket
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import ray


@ray.remote(num_cpus=0)
class Recorder:
    def record(self, tables: int, partitions: int) -> None:
        from rayconnect.metrics import SinkMetrics, _record

        m = SinkMetrics("many")
        offsets = {}
        for t in range(tables):
            for p in range(partitions):
                key = f"local/db.public.t{t:03d}/{p}"
                m.read(key, 10, 400, high_watermark=20, next_offset=10)
                offsets[key] = 10
        m.committed(offsets, 10 * len(offsets), 0.02, 3.0)
        m.dead_letter(next(iter(offsets)), 1)
        m.tables_committed({f"t{t:03d}": (3, 40) for t in range(tables)}, time.time())
        m.table_lag({f"t{t:03d}": 40 for t in range(tables)})
        m.outage(0.0)
        for counter in ("rounds_committed", "rounds_discarded"):  # as m.rounds does
            _record(counter, "inc", 1, {"pipeline": "many"})


def series(port: int) -> Counter[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    found: Counter[str] = Counter()
    for line in text.splitlines():
        if m := re.match(r"^(ray_rayconnect_\w+?)(?:\{.*\})? ", line):
            found[m[1]] += 1
    return found


@contextlib.contextmanager
def ray_exporting_metrics(namespace: str) -> Iterator[int]:
    """A local Ray of its own (one shut down first: the export port is set at start)
    exporting metrics on a free port every second; yields the port (the metrics test's too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp_dir = tempfile.mkdtemp(prefix="rc-m-", dir="/tmp")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        namespace=namespace,
        num_cpus=1,
        include_dashboard=True,
        _temp_dir=temp_dir,
        _metrics_export_port=port,
        _system_config={"metrics_report_interval_ms": 1000},
        log_to_driver=False,
    )
    try:
        yield port
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    with ray_exporting_metrics("rayconnect-series") as port:
        recorder = Recorder.remote()
        ray.get(recorder.record.remote(args.tables, args.partitions), timeout=120)
        found: Counter[str] = Counter()
        deadline, last = time.monotonic() + 120, -1
        # until every kind is there (gauges come first) and two scrapes in a row agree
        kinds = ("records_read", "table_records_written", "round_duration_s_bucket")
        while time.monotonic() < deadline:
            time.sleep(3)
            found = series(port)
            complete = all(f"ray_rayconnect_{k}" in found for k in kinds)
            if complete and sum(found.values()) == last:
                break
            last = sum(found.values())
        print(json.dumps({"tables": args.tables, "partitions": args.partitions,
                          "series": sum(found.values()), "by_metric": dict(sorted(found.items()))},
                         indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
