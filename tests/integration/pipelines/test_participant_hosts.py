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
from rayconnect.actors.directory import pipeline_actor_names
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST

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
        assert sorted(held.partitions) == sorted(produced[1].offsets())
        assert {p.host for p in held.partitions.values()} == {victim}
        status = handle.wait_for(_caught_up(produced), timeout_s=90)
        # a host hands all its partitions' flushes of a round to the writer in one call
        # (per partition it was 64 a host a round; a flush by age or one that waited for its
        # machine's lock may take a call of its own, hence some slack)
        counts = status.rounds_since_start
        rounds = counts.committed + counts.partial + counts.discarded
        writer = ray.get_actor(names.writer(NAME), namespace=names.NAMESPACE)
        calls = ray.get(writer.stats.remote()).calls
        assert 0 < calls <= 2 * TOPICS * rounds, (calls, counts)
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
        assert after.pid != held.pid  # the host died and Ray restarted it
        assert len(after.partitions) == PER_TOPIC
        print(f"\nstart {start_s:.1f} s, kills landed in an open round: {landed}")
        print(f"writer calls before the kills {calls} in {rounds} rounds")
    finally:
        handle.stop(commit=False)


@pytest.mark.timeout(300)
def test_a_restarted_host_steers_a_reader_that_lived_on_once_the_enumerator_is_back(
    ray_session, kafka_broker, kill, tmp_path
):
    """A host finds its readers through the enumerator. When the host restarts while the
    enumerator is away (a lost node took both, in CI), its machines' seeks find no reader; a
    reader that lived on must still be sent back to the committed offset - else records it
    read into the dead host's round stay unread while the partition is quiet (nothing new
    arrives to reveal the gap). Here the enumerator is ended for good, the host SIGKILLed
    mid-round, and the enumerator started again (from its saved split assignment: the
    readers live on); nothing more is produced."""
    from rayconnect.actors.enumerator import EnumeratorActor

    name = "steer-later"
    produced = Produced(kafka_broker.bootstrap_servers, name, 2)
    produced.more(400)
    pipeline = sink_checks.pipeline(
        name,
        kafka_broker.bootstrap_servers,
        name,
        tmp_path / "t",
        commit_interval_s=2,
        write_timeout_s=10,
        commit_when_drained=False,  # rounds stay open for the interval: the kill lands in one
    )
    handle = pipeline.start()
    try:
        handle.wait_for(sink_checks.caught_up(produced), timeout_s=120)
        readers_before = {
            n: s.started_at for n, s in handle.status().readers.items() if s.started_at is not None
        }
        enumerator = ray.get_actor(names.enumerator(name), namespace=names.NAMESPACE)
        ray.kill(enumerator, no_restart=True)
        before = sink_checks.produce_into_an_open_round(handle, produced, 300)
        host = names.participant_host(name, f"{CLUSTER}/{name}/0", DEFAULT_PARTITIONS_PER_HOST)
        kill(host, "sigkill")
        # the restarted host's machines get their START and seek - into the void
        start = before["txn_id"]
        handle.wait_for(lambda s: s["txn_id"] >= start + 2, timeout_s=60)
        assert handle.status()["offsets"] != produced.offsets(), "committed without a seek"
        EnumeratorActor.options(
            name=names.enumerator(name), namespace=names.NAMESPACE, lifetime="detached"
        ).remote(pipeline.config)
        status = handle.wait_for(sink_checks.caught_up(produced), timeout_s=90)
        readers_after = {n: s.started_at for n, s in status.readers.items()}
        assert readers_after == readers_before, "the readers were restarted: nothing tested"
        sink_checks.assert_exactly_once(tmp_path / "t", produced, status)
    finally:
        handle.stop(commit=False)
