"""FLIP-246 on real parts: one pipeline over two embedded clusters (two tansu brokers),
its metadata in a YAML file that the test edits while the pipeline runs.

One pipeline lives through every phase (a Spark start costs ~25 s): a topic added, a
malformed edit, a cluster removed and re-added, the enumerator killed in the middle of a
change, a cluster removed while its broker is down. After each phase the table must hold
exactly what was produced to the subscribed topics, once.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.kafka.admin import create_topic, produce_demo_records
from rayconnect.metadata import FileMetadataService
from rayconnect.protocol.actor_status import DiscoveryStatus

PIPELINE = "multi"


class World:
    """The clusters, what was produced where, and the metadata file."""

    def __init__(self, clusters, path: Path) -> None:
        self.bootstrap = clusters.bootstrap_servers  # {"c0": "127.0.0.1:p0", "c1": ...}
        self.path = path
        self.counts: Counter[tuple[str, str, int]] = Counter()
        self.produced = 0

    def topic(self, cluster: str, topic: str, partitions: int = 2) -> None:
        asyncio.run(create_topic(self.bootstrap[cluster], topic, partitions))

    def produce(self, cluster: str, topic: str, n: int) -> None:
        counts = asyncio.run(
            produce_demo_records(self.bootstrap[cluster], topic, n, start_index=self.produced)
        )
        self.produced += n
        for p, c in counts.items():
            self.counts[(cluster, topic, p)] += c

    def write_metadata(self, clusters: dict[str, list[str]]) -> float:
        doc = {
            "streams": [
                {
                    "stream_id": "orders",
                    "clusters": {
                        c: {"bootstrap_servers": self.bootstrap[c], "topics": topics}
                        for c, topics in clusters.items()
                    },
                }
            ]
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc))
        tmp.replace(self.path)  # atomic: the service never reads half a file
        return time.monotonic()

    def offsets(self, *clusters: str) -> dict[str, int]:
        return {f"{c}/{t}/{p}": n for (c, t, p), n in self.counts.items() if c in clusters}

    def rows(self, *clusters: str) -> set[tuple[str, str, int, int]]:
        return {
            (c, t, p, o) for (c, t, p), n in self.counts.items() if c in clusters for o in range(n)
        }


def table_rows(path: Path) -> list[tuple[str, str, int, int]]:
    t = DeltaTable(str(path)).to_pyarrow_table(columns=["cluster", "topic", "partition", "offset"])
    return list(zip(*(t[c].to_pylist() for c in t.column_names), strict=True))


def caught_up(want: dict[str, int]):
    return lambda s: all(s["offsets"].get(k) == v for k, v in want.items())


def assert_exactly_once(path: Path, want_rows: set) -> None:
    rows = table_rows(path)
    dupes = [r for r, c in Counter(rows).items() if c > 1]
    assert dupes == [], f"{len(dupes)} duplicates, e.g. {dupes[:3]}"
    assert set(rows) == want_rows, (
        f"missing {len(want_rows - set(rows))}, extra {len(set(rows) - want_rows)}"
    )


def all_splits(discovery: DiscoveryStatus) -> set[str]:
    return {k for keys in discovery.splits_per_reader.values() for k in keys}


def reader_started_at(handle, reader: str) -> float:
    return handle.status().readers[names.reader(PIPELINE, *reader.split("/"))].started_at


@pytest.mark.timeout(900)
def test_clusters_and_topics_come_and_go_without_a_restart(
    ray_session, kafka_clusters, tmp_path, kill
):
    world = World(kafka_clusters, tmp_path / "streams.yaml")
    world.topic("c0", "orders")
    world.topic("c1", "orders")
    world.topic("c1", "orders-eu")
    world.produce("c0", "orders", 2000)
    world.produce("c1", "orders", 2000)
    world.write_metadata({"c0": ["orders"], "c1": ["orders"]})
    table = tmp_path / "t"
    source = rc.KafkaSource(FileMetadataService(str(world.path)), discovery_interval_s=0.5)
    handle = rc.SinkPipeline(
        PIPELINE, source, rc.DeltaSink(str(table)), commit_interval_s=1, write_timeout_s=10
    ).start()
    propagation: list[float] = []

    def wait_for_readers(predicate, since: float) -> None:
        handle.wait_for(lambda s: predicate(s.discovery), timeout_s=60, poll_s=0.05)
        propagation.append(time.monotonic() - since)

    try:
        # 1. one stream over two clusters, exactly once
        handle.wait_for(caught_up(world.offsets("c0", "c1")), timeout_s=120)
        assert_exactly_once(table, world.rows("c0", "c1"))
        c0_started = reader_started_at(handle, "c0/0")

        # 2. a topic added to the file is read without a restart; c0's reader is untouched
        world.produce("c1", "orders-eu", 1000)
        edited = world.write_metadata({"c0": ["orders"], "c1": ["orders", "orders-eu"]})
        wait_for_readers(lambda d: "c1/orders-eu/0" in all_splits(d), edited)
        handle.wait_for(caught_up(world.offsets("c0", "c1")), timeout_s=120)
        assert reader_started_at(handle, "c0/0") == c0_started

        # 3. a malformed edit is ignored, with the file and the field in status
        world.path.write_text("streams:\n  - stream_id: orders\n    clusters: 7\n")
        status = handle.wait_for(lambda s: s.discovery.last_error, timeout_s=30)
        assert "streams.yaml" in status.discovery.last_error
        assert "$.streams[0].clusters" in status.discovery.last_error
        world.produce("c0", "orders", 500)
        handle.wait_for(caught_up(world.offsets("c0", "c1")), timeout_s=120)

        # 4. cluster c1 removed: its partitions commit and retire; c0 goes on
        edited = world.write_metadata({"c0": ["orders"]})
        wait_for_readers(lambda d: set(d.clusters) == {"c0"}, edited)
        c1_offsets = {k: v for k, v in handle.status()["offsets"].items() if k.startswith("c1/")}
        assert c1_offsets == world.offsets("c1")  # all it read was committed before it left
        world.produce("c1", "orders", 700)  # produced while c1 is not subscribed
        world.produce("c0", "orders", 300)
        handle.wait_for(caught_up(world.offsets("c0")), timeout_s=120)
        assert not any(k.startswith("c1/") for k in handle.status()["partitions"])

        # 5. c1 re-added: it resumes from the table's offsets, nothing read twice
        edited = world.write_metadata({"c0": ["orders"], "c1": ["orders", "orders-eu"]})
        wait_for_readers(lambda d: set(d.clusters) == {"c0", "c1"}, edited)
        handle.wait_for(caught_up(world.offsets("c0", "c1")), timeout_s=120)
        assert_exactly_once(table, world.rows("c0", "c1"))

        # 6. the enumerator killed in the middle of a change recovers and applies it
        world.topic("c0", "returns")
        world.produce("c0", "returns", 400)
        world.write_metadata({"c0": ["orders", "returns"], "c1": ["orders", "orders-eu"]})
        kill(names.enumerator(PIPELINE), "sigkill")
        handle.wait_for(caught_up(world.offsets("c0", "c1")), timeout_s=180)
        assert_exactly_once(table, world.rows("c0", "c1"))

        # 7. toggling a topic in and out: how long a change takes to reach the readers
        for i in range(7):  # with the 3 changes above: 10 measured
            topics = ["orders", "orders-eu"] if i % 2 else ["orders"]
            edited = world.write_metadata({"c0": ["orders", "returns"], "c1": topics})
            has_eu = bool(i % 2)
            wait_for_readers(
                lambda d, has_eu=has_eu: (
                    any(k.startswith("c1/orders-eu/") for k in all_splits(d)) == has_eu
                ),
                edited,
            )
        print(
            f"\nmetadata change -> readers: median {statistics.median(propagation):.2f} s "
            f"over {len(propagation)} changes, max {max(propagation):.2f} s"
        )

        # 8. a cluster removed while its broker is unreachable does not block the others
        kafka_clusters["c1"].stop()
        world.write_metadata({"c0": ["orders", "returns"]})
        world.produce("c0", "orders", 500)
        handle.wait_for(caught_up(world.offsets("c0")), timeout_s=120)
        assert_exactly_once(table, world.rows("c0", "c1"))  # c1's rows stay as committed
    finally:
        handle.stop(commit=False)
