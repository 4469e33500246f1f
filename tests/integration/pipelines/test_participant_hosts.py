"""Participant hosts at scale: 256 partitions (4 topics x 64) in 4 host processes, a host
killed mid-round (ray.kill, then SIGKILL), exactly once.

A host's death loses all its partitions' buffers at once; the round commits the other hosts'
partitions or is discarded, and the dead host's partitions resume from the table.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import ray
import sink_checks
from sink_checks import Produced, kill_landed_in_round, open_round_with_data, table_rows

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.runtime import pipeline_actor_names

CLUSTER = sink_checks.CLUSTER
TOPICS = 4
PER_TOPIC = 64
NAME = "hosts256"


def _pipeline(bootstrap: str, topics: list[str], table) -> rc.SinkPipeline:
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("many", {CLUSTER: rc.ClusterMetadata(bootstrap, tuple(topics))}),)
    )
    return rc.SinkPipeline(
        NAME,
        rc.KafkaSource(meta),
        rc.DeltaSink(str(table)),
        commit_interval_s=2,
        write_timeout_s=15,
    )


def _offsets(produced: list[Produced]) -> dict[str, int]:
    return {k: v for p in produced for k, v in p.offsets().items()}


def _more(produced: list[Produced], per_topic: int) -> None:
    for p in produced:
        p.more(per_topic)


def _caught_up(produced: list[Produced]):
    want = _offsets(produced)
    return lambda s: s["offsets"] == want


@pytest.mark.timeout(300)
def test_256_partitions_in_4_hosts_exactly_once_when_a_host_dies_mid_round(
    ray_session, kafka_broker, kill, tmp_path
):
    topics = [f"many-{t}" for t in range(TOPICS)]
    produced = [Produced(kafka_broker.bootstrap_servers, t, PER_TOPIC) for t in topics]
    _more(produced, 10 * PER_TOPIC)
    table = tmp_path / "t"
    started = time.monotonic()
    handle = _pipeline(kafka_broker.bootstrap_servers, topics, table).start()
    start_s = time.monotonic() - started
    victim = names.participant_host(NAME, f"{CLUSTER}/{topics[1]}/0", PER_TOPIC)
    try:
        hosts = pipeline_actor_names(NAME, "participants")
        assert hosts == [f"{NAME}/participants/{CLUSTER}/{t}/0" for t in topics]
        held = ray.get(ray.get_actor(victim, namespace=names.NAMESPACE).status.remote())
        assert sorted(held["partitions"]) == sorted(produced[1].offsets())
        assert {p["host"] for p in held["partitions"].values()} == {victim}
        handle.wait_for(_caught_up(produced), timeout_s=90)
        landed = {}
        for how in ("ray.kill", "sigkill"):
            _more(produced, 10 * PER_TOPIC)
            before = handle.wait_for(open_round_with_data, timeout_s=60, poll_s=0.05)
            killed_at = time.time()
            kill(victim, how)
            _more(produced, 5 * PER_TOPIC)
            handle.wait_for(_caught_up(produced), timeout_s=90)
            landed[how] = kill_landed_in_round(table, before, killed_at)
        status = handle.status()
        rows = table_rows(table)
        dupes = [r for r, c in Counter(rows).items() if c > 1]
        assert dupes == [], f"{len(dupes)} duplicated records, e.g. {dupes[:5]}"
        assert set(rows) == set().union(*(p.rows() for p in produced))
        # the topics are fresh: what was produced per partition is its high watermark
        assert status["offsets"] == _offsets(produced)
        assert len(status["offsets"]) == TOPICS * PER_TOPIC
        assert all(lag == 0 for lag in status["lag"].values())
        after = ray.get(ray.get_actor(victim, namespace=names.NAMESPACE).status.remote())
        assert after["pid"] != held["pid"]  # the host died and Ray restarted it
        assert len(after["partitions"]) == PER_TOPIC
        print(f"\nstart {start_s:.1f} s, kills landed in an open round: {landed}")
    finally:
        handle.stop(commit=False)
