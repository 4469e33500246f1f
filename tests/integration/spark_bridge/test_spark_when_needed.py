"""``spark.start: when_needed`` on a real writer actor and RayDP: ready without Spark, writes
in the writer's process while they leave it idle, Spark started once they keep it busy, and
Spark jobs from then on. Its own Ray: RayDP allows one Spark per Ray namespace (the writer
module's writer holds it), and this writer's Spark must start."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray_tmp import cleaned_ray_tmp
from test_spark_writer import expected_keys, jobs_delta, key_set, read_files, records

from rayconnect.actors import names
from rayconnect.actors.writer import start_writer
from rayconnect.config.spark import SparkSettings

pytestmark = [pytest.mark.timeout(240)]

NAMESPACE = "rayconnect-test-when-needed"


@pytest.fixture(scope="module")
def ray_alone() -> Iterator[None]:
    with cleaned_ray_tmp():
        ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE)
        try:
            yield
        finally:
            ray.shutdown()


def test_when_needed_writes_here_until_busy_then_starts_spark(
    ray_alone: None, tmp_path: Path
) -> None:
    """``spark.start: when_needed``: the writer is ready without Spark and writes in its own
    process while that leaves it idle; once its writes keep it busy (here half of a 3-s
    window) Spark starts, and from then on a write is a Spark job. Every write's rows
    exactly, whoever wrote them."""
    lazy = start_writer(
        names.writer(f"lazy-{uuid.uuid4().hex[:6]}"),
        namespace=NAMESPACE,
        spark=SparkSettings(start="when_needed", busy_window_s=3, start_when_busy=0.5),
    )
    try:
        stats = ray.get(lazy.stats.remote())
        assert stats["spark_start"] == "when_needed" and stats["spark_start_s"] is None
        table = tmp_path / "t"
        for i in range(5):  # a light load over more than a window: Spark is not needed
            files = ray.get(lazy.write.remote(str(table), [ray.put(records(0, i * 100, 100))]))
            assert key_set(read_files(table, files)) == expected_keys(0, i * 100, 100)
            time.sleep(0.8)
        stats = ray.get(lazy.stats.remote())
        assert stats["writes_here"] == 5 and stats["spark_writes"] == 0
        assert stats["spark_started_because"] is None and stats["spark_start_s"] is None

        big = ray.put(records(1, 0, 300_000))  # writes back to back: ~all of the window busy
        deadline = time.monotonic() + 60
        while stats["spark_started_because"] is None:
            assert time.monotonic() < deadline, stats
            for files in ray.get([lazy.write.remote(str(table), [big]) for _ in range(4)]):
                assert sum(f.records for f in files) == 300_000  # (read back below: slow)
            stats = ray.get(lazy.stats.remote())
        assert key_set(read_files(table, files)) == expected_keys(1, 0, 300_000)
        assert "of the last 3 s (start_when_busy 0.5)" in stats["spark_started_because"]
        assert stats["spark_writes"] == 0  # written here while Spark starts

        deadline = time.monotonic() + 150
        while stats["warm_up_s"] is None:  # Spark up and warmed up
            assert time.monotonic() < deadline and stats["problem"] is None, stats
            time.sleep(1)
            stats = ray.get(lazy.stats.remote())
        before = stats
        files = ray.get(lazy.write.remote(str(table), [ray.put(records(2, 0, 500))]))
        assert key_set(read_files(table, files)) == expected_keys(2, 0, 500)
        assert jobs_delta(lazy, before) == (1, 1)
    finally:
        try:
            ray.get(lazy.close.remote(), timeout=60)
        finally:
            ray.kill(lazy)
