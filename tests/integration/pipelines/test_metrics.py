"""rayconnect's metrics reach Ray's Prometheus endpoint with the values recorded and the
pipeline/cluster/topic/partition (a route table's: pipeline/table) tags, and nothing else of
ours as a tag."""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
import ray

sys.path.insert(0, str(Path(__file__).parents[3] / "bench"))
from metric_series import ray_exporting_metrics  # noqa: E402 - bench/ is not a package


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """``{metric: {labels: value}}`` for ``ray_rayconnect_*`` (``_total`` suffix dropped)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for line in text.splitlines():
        m = re.match(r"^(ray_rayconnect_\w+?)(?:\{(.*)\})? ([0-9.eE+-]+|NaN)$", line)
        if m:
            labels = tuple(
                kv
                for kv in sorted(re.findall(r'(\w+)="([^"]*)"', m[2] or ""))
                if kv[0] in ("pipeline", "cluster", "topic", "partition", "task", "table", "le")
            )
            name = m[1].removesuffix("_total")
            out[name][labels] = out[name].get(labels, 0.0) + float(m[3])
    return out


@ray.remote(num_cpus=0)
class Recorder:
    def record(self) -> None:
        from rayconnect.metrics import SinkMetrics, SourceMetrics
        from rayconnect.protocol.coordinator import CoordinatorStatus

        m = SinkMetrics("mx")
        m.read("c0/orders/0", 100, 4000, high_watermark=150, next_offset=100)
        m.read("c0/orders/0", 50, 2000, high_watermark=150, next_offset=150)
        m.read("c0/orders/1", 7, 280, high_watermark=10, next_offset=7)
        m.committed({"c0/orders/0": 150, "c0/orders/1": 7}, 157, 0.02, 3.0)
        m.dead_letter("c0/orders/1", 2)
        m.outage(12.5)  # the coordinator sets it from its status every step
        fields = CoordinatorStatus.__struct_fields__
        base = dict.fromkeys(fields, 0)
        base.update(
            pipeline="mx",
            state="x",
            partitions=(),
            waiting_for=(),
            offsets={},
            last_round_duration_s=None,
            last_error=None,
        )
        m.rounds(CoordinatorStatus(**{**base, "rounds_committed": 2, "rounds_discarded": 1}))
        m.rounds(CoordinatorStatus(**{**base, "rounds_committed": 3, "rounds_discarded": 1}))
        m.tables_committed({"lake.a": (4, 30)}, 1_700_000_000.0)
        m.table_lag({"lake.a": 9, "lake.b": None})  # b: a reader restarting, not known
        m.table_lag({"lake.a": 3, "lake.b": 5})
        source = SourceMetrics("mx", 0)  # a source task's actor sets it every few seconds
        source.lag(4096, 1.5)
        source.lag(160, 0.25)
        SourceMetrics("mx", 1).lag(None, None)  # a task that cannot tell records nothing


@pytest.mark.timeout(120)
def test_metrics_reach_prometheus_with_their_values_and_tags():
    p0 = (("cluster", "c0"), ("partition", "0"), ("pipeline", "mx"), ("topic", "orders"))
    p1 = (("cluster", "c0"), ("partition", "1"), ("pipeline", "mx"), ("topic", "orders"))
    pipe = (("pipeline", "mx"),)
    task0 = (("pipeline", "mx"), ("task", "0"))
    table_a = (("pipeline", "mx"), ("table", "lake.a"))
    table_b = (("pipeline", "mx"), ("table", "lake.b"))
    expected = {
        "ray_rayconnect_records_read": {p0: 150, p1: 7},
        "ray_rayconnect_bytes_read": {p0: 6000, p1: 280},
        "ray_rayconnect_high_watermark": {p0: 150, p1: 10},
        "ray_rayconnect_read_lag": {p0: 0, p1: 3},
        "ray_rayconnect_committed_offset": {p0: 150, p1: 7},
        "ray_rayconnect_records_written": {pipe: 157},
        "ray_rayconnect_rounds_committed": {pipe: 3},
        "ray_rayconnect_rounds_discarded": {pipe: 1},
        "ray_rayconnect_dead_letter_records": {p1: 2},
        "ray_rayconnect_outage_s": {pipe: 12.5},
        "ray_rayconnect_table_records_written": {table_a: 30},
        "ray_rayconnect_table_version": {table_a: 4},
        "ray_rayconnect_table_last_commit_time_s": {table_a: 1_700_000_000.0},
        "ray_rayconnect_table_lag": {table_a: 3, table_b: 5},
        "ray_rayconnect_source_lag_bytes": {task0: 160},
        "ray_rayconnect_source_lag_s": {task0: 0.25},
        "ray_rayconnect_round_duration_s_count": {pipe: 1},
        "ray_rayconnect_commit_latency_s_count": {pipe: 1},
    }
    with ray_exporting_metrics("rayconnect-metrics-test") as port:
        recorder = Recorder.remote()  # stays alive: its gauges must stay visible
        ray.get(recorder.record.remote(), timeout=60)
        # Exported once a report interval: poll until every value arrived (or time is up),
        # never a fixed sleep that is too short on a loaded machine.
        deadline = time.monotonic() + 60
        while True:
            m = scrape(port)
            got = {name: dict(m.get(name, {})) for name in expected}
            if got == expected or time.monotonic() > deadline:
                break
            time.sleep(1)
        print({k: dict(v) for k, v in m.items() if "_bucket" not in k})
        assert got == expected
        # The buckets are exact counts (a histogram's _sum is Ray's estimate from bucket
        # midpoints, so it is not asserted): one round of 3.0 s lies in (2, 5].
        buckets = m["ray_rayconnect_round_duration_s_bucket"]
        assert buckets[(("le", "5.0"), *pipe)] == 1
        assert buckets[(("le", "2.0"), *pipe)] == 0
