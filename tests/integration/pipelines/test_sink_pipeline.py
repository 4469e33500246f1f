"""Sink pipelines on real parts: tansu broker, Ray actors, Spark on Ray, a Delta table.

Exactly once is checked the strict way: the table's (cluster, topic, partition, offset)
rows must equal the set of everything produced, with no duplicates, and the committed
offsets must equal the high watermarks - after every role was killed mid-round.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray
import sink_checks
from deltalake import DeltaTable
from sink_checks import (
    Produced,
    assert_exactly_once,
    commit_history,
    kill_landed_in_round,
    open_round_with_data,
    table_rows,
)
from sink_checks import caught_up as _caught_up

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST
from rayconnect.kafka.admin import create_topic, high_watermarks, produce_demo_records
from rayconnect.protocol.upkeep import CompactSettings, LogSettings

CLUSTER = sink_checks.CLUSTER
_pipeline = sink_checks.pipeline


def table_of_kind(kind: str, tmp_path: Path) -> sink_checks.Table:
    """A fresh table of ``kind``: a Delta folder, or an Iceberg table in the embedded
    catalog (sqlite) of a local warehouse."""
    if kind == "iceberg":
        return rc.IcebergSink("db.orders", warehouse=str(tmp_path / "warehouse"))
    return tmp_path / "t"


ALL_ROLES = ("coordinator", "participant", "reader", "writer")


@pytest.mark.timeout(900)
# Iceberg in the slow group (~2 min): CI keeps Iceberg's kills in the typed pipeline tests
@pytest.mark.parametrize("kind", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_exactly_once_while_every_role_is_killed_mid_round(
    ray_session, kafka_broker, tmp_path, kill, kind
):
    """Kill coordinator, a participant, the reader and the writer - each with
    ray.kill and with SIGKILL - in the middle of a round while producing; nothing lost,
    nothing doubled."""
    topic = f"orders-{kind}"  # one broker per module: each run its own topic
    produced = Produced(kafka_broker.bootstrap_servers, topic, 4)
    produced.more(4000)
    table = table_of_kind(kind, tmp_path)
    name = f"kills-{kind}"
    pipeline = _pipeline(
        name,
        kafka_broker.bootstrap_servers,
        topic,
        table,
        commit_interval_s=3,
        write_timeout_s=20,
        flush_max_records=1500,
        commit_when_drained=False,  # rounds stay open for the interval: kills land in them
        # the writer's kills land in Spark jobs (the default would write these rounds in
        # the writer's process, never starting Spark at this load)
        spark=rc.SparkSettings(start="with_pipeline"),
    )
    handle = pipeline.start()
    by_role = {
        "coordinator": names.coordinator(name),
        "participant": names.participant_host(
            name, f"{CLUSTER}/{topic}/1", DEFAULT_PARTITIONS_PER_HOST
        ),
        "reader": names.reader(name, CLUSTER, 0),
        "writer": names.writer(name),
    }
    victims = [by_role[role] for role in ALL_ROLES]
    recovery: dict[str, float] = {}
    try:
        handle.wait_for(_caught_up(produced), timeout_s=120)
        for victim in victims:
            for how in ("ray.kill", "sigkill"):
                # A kill that missed its round proves nothing: kill again until one cuts.
                for _attempt in range(4):
                    produced.more(3000)
                    before = handle.wait_for(open_round_with_data, timeout_s=60, poll_s=0.05)
                    killed_at = time.time()
                    kill(victim, how)
                    produced.more(2000)
                    handle.wait_for(_caught_up(produced), timeout_s=240)
                    if kill_landed_in_round(table, before, killed_at):
                        break
                else:
                    pytest.fail(f"4 kills of {victim} ({how}) all missed an open round")
                recovery[f"{victim.split('/')[1]} {how}"] = time.time() - killed_at
        status = handle.status()
        assert_exactly_once(table, produced, status)
        assert status["epoch"] >= 3  # the coordinator came back twice, each with a new epoch
    finally:
        print("\nrecovery (kill -> all produced records committed):")
        for k, v in recovery.items():
            print(f"  {k:<24} {v:6.1f} s")
        handle.stop(commit=False)


@pytest.mark.timeout(600)
def test_stop_and_start_from_a_new_driver_resumes_from_the_table(
    ray_session, kafka_broker, tmp_path
):
    produced = Produced(kafka_broker.bootstrap_servers, "resume", 3)
    produced.more(3000)
    table = tmp_path / "t"
    handle = _pipeline(
        "resume", kafka_broker.bootstrap_servers, "resume", table, commit_interval_s=2
    ).start()
    try:
        handle.wait_for(_caught_up(produced), timeout_s=120)
    finally:
        handle.stop()
    assert ray.util.list_named_actors(all_namespaces=True) == [] or not any(
        a["name"].startswith("resume/") for a in ray.util.list_named_actors(all_namespaces=True)
    )
    produced.more(2500)
    # a new driver process starts the pipeline again and exits; the actors keep running
    address = ray.get_runtime_context().gcs_address  # not "auto": other Rays may run here
    script = textwrap.dedent(f"""
        import ray, rayconnect as rc
        ray.init(address="{address}", namespace="rayconnect")
        meta = rc.StaticMetadataService((rc.KafkaStream("resume", {{"{CLUSTER}":
            rc.ClusterMetadata("{kafka_broker.bootstrap_servers}", ("resume",))}}),))
        rc.SinkPipeline("resume", rc.KafkaSource(meta), rc.DeltaSink("{table}"),
                        commit_interval_s=2).start()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    handle = rc.attach("resume")
    try:
        status = handle.wait_for(_caught_up(produced), timeout_s=120)
        assert_exactly_once(table, produced, status)
    finally:
        handle.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "kind",
    # Iceberg's fencing is proven at the committer (tests/integration/tables: a zombie past
    # its checks loses to a new claim); the pipeline-level repeat runs with `pytest -m slow`.
    ["delta", pytest.param("iceberg", marks=pytest.mark.slow)],
)
def test_a_second_coordinator_fences_the_first_which_never_commits_again(
    ray_session, kafka_broker, tmp_path, kind
):
    from rayconnect.actors.coordinator import CoordinatorActor

    produced = Produced(kafka_broker.bootstrap_servers, f"fence-{kind}", 2)
    produced.more(2000)
    table = table_of_kind(kind, tmp_path)
    pipeline = _pipeline(
        f"fence-{kind}",
        kafka_broker.bootstrap_servers,
        f"fence-{kind}",
        table,
        commit_interval_s=1,
        write_timeout_s=5,
    )
    handle = pipeline.start()
    intruder = None
    try:
        first = handle.wait_for(_caught_up(produced), timeout_s=120)
        old_epoch = first["epoch"]
        keys = sorted(produced.offsets())
        intruder = CoordinatorActor.options(namespace="rayconnect").remote(pipeline.config, keys)
        ray.get(intruder.ready.remote(), timeout=60)
        assert ray.get(intruder.status.remote())["epoch"] == old_epoch + 1
        claimed = min(  # the intruder's claim, a table version of its own
            h["version"]
            for h in commit_history(table)
            if h.get("rayconnect.epoch") == str(old_epoch + 1)
        )
        produced.more(1000)
        status = handle.wait_for(lambda s: s["fenced"] is not None, timeout_s=120)
        assert f"fenced by epoch {old_epoch + 1}" in status["fenced"]
        # nothing the old epoch committed came after the claim
        late = [
            h
            for h in commit_history(table)
            if h["version"] > claimed and h.get("rayconnect.epoch") == str(old_epoch)
        ]
        assert late == []
        rows = table_rows(table)
        assert len(rows) == len(set(rows)) == sum(first["offsets"].values())
    finally:
        if intruder is not None:
            ray.kill(intruder)
        handle.stop(commit=False)


@pytest.mark.timeout(600)
def test_idle_partitions_do_not_delay_a_round_and_a_round_is_one_spark_job(
    ray_session, kafka_broker, tmp_path
):
    bootstrap = kafka_broker.bootstrap_servers
    asyncio.run(create_topic(bootstrap, "idle", 8))
    busy = [0, 1, 2, 3, 4, 5]  # 6 and 7 stay idle
    asyncio.run(produce_demo_records(bootstrap, "idle", 6000, busy))
    want = {f"{CLUSTER}/idle/{p}": 1000 for p in busy}
    table = tmp_path / "t"
    handle = _pipeline(
        "idle", bootstrap, "idle", table, commit_interval_s=2, write_timeout_s=60
    ).start()
    try:
        status = handle.wait_for(
            lambda s: all(s["offsets"].get(k) == v for k, v in want.items()), timeout_s=120
        )
        # idle partitions answered END at once: no round waited for write_timeout_s
        assert status.rounds_since_start.partial == 0
        assert status["round_s_max"] < 30
        # all partitions flush at END; the writer gathers them into ONE write per round: a
        # Spark job, or (while Spark starts) a write made by the writer process itself
        writer = ray.get_actor(names.writer("idle"), namespace="rayconnect")
        stats = ray.get(writer.stats.remote())
        assert stats.spark_jobs == stats.spark_writes
        assert stats.spark_writes + stats.writes_here == status.rounds_since_start.committed
        # and the host hands its partitions' flushes of a round to the writer in one call
        assert stats.calls == status.rounds_since_start.committed
    finally:
        handle.stop(commit=False)


@pytest.mark.timeout(600)
def test_a_full_buffer_flushes_and_asks_for_an_early_commit(ray_session, kafka_broker, tmp_path):
    """KIP-89: with a commit interval longer than the backlog takes to read, participants
    flush by size and REQUEST-COMMIT ends rounds early; memory stays bounded by the flush
    settings. The tail (less than two flushes) is committed by the interval."""
    produced = Produced(kafka_broker.bootstrap_servers, "kip89", 2)
    produced.more(12000)
    handle = _pipeline(
        "kip89",
        kafka_broker.bootstrap_servers,
        "kip89",
        tmp_path / "t",
        source={"max_poll_records": 500},  # a steady stream of batches, not one big one
        commit_interval_s=15,
        write_timeout_s=60,
        flush_max_records=1000,
        request_commit_after_flushes=2,
    ).start()
    try:
        status = handle.wait_for(_caught_up(produced), timeout_s=240)
        assert status.rounds_since_start.requested >= 2  # ended early, more than once
        hosts = {names.participant_host("kip89", k, 64) for k in produced.offsets()}
        participants = {
            key: p
            for n in hosts
            for key, p in ray.get(
                ray.get_actor(n, namespace="rayconnect").status.remote()
            ).partitions.items()
        }
        assert set(participants) == set(produced.offsets())
        assert all(p.flushes >= 6 for p in participants.values())  # 6000 each, by 1000
        assert_exactly_once(tmp_path / "t", produced, status)
    finally:
        handle.stop(commit=False)


@pytest.mark.timeout(400)
def test_commit_when_caught_up_ends_rounds_without_waiting_for_the_interval(
    ray_session, kafka_broker, tmp_path
):
    """With a 600 s interval, only "caught up" can end a round: every record is still
    committed, twice over (a backlog, then records that come later), exactly once; then a
    transactional producer's commit and abort (lag, exact)."""
    produced = Produced(kafka_broker.bootstrap_servers, "caughtup", 2)
    produced.more(3000)
    handle = _pipeline(
        "caughtup",
        kafka_broker.bootstrap_servers,
        "caughtup",
        tmp_path / "t",
        commit_interval_s=600,
        commit_when_caught_up=True,
    ).start()
    try:
        handle.wait_for(_caught_up(produced), timeout_s=150)
        produced.more(2000)
        status = handle.wait_for(_caught_up(produced), timeout_s=150)
        assert status.rounds_since_start.requested >= 2
        assert_exactly_once(tmp_path / "t", produced, status)
        lag_tells_the_truth_about_transactions(
            handle, kafka_broker.bootstrap_servers, produced, tmp_path / "t"
        )
    finally:
        handle.stop(commit=False)


def lag_tells_the_truth_about_transactions(
    handle: Any, bootstrap: str, produced: Produced, table: Path
) -> None:
    """Lag on a transactional topic (issue 38): a log that ends in a commit marker, or in an
    aborted transaction, is caught up - lag 0, the offsets past the markers - and lag is
    never 0 while a transaction's records are not in the table."""
    from rayconnect.kafka import clients

    async def transaction(producer: Any, commit: bool) -> None:
        await producer.begin_transaction()
        for i in range(6):
            await producer.send(produced.topic, f"txn-{i}".encode(), partition=i % 2)
        await producer.flush()
        if commit:
            await producer.commit_transaction()

    def lags(s: Any) -> dict[str, int | None]:
        return {k: p.lag for k, p in s.partition_status.items()}

    async def caught_up_with_lag_0() -> None:
        """The table's offsets reach the high watermarks (past the last marker), and
        every partition's lag is 0."""
        hws = await high_watermarks(bootstrap, produced.topic)
        ends = {f"{CLUSTER}/{produced.topic}/{p}": hw for p, hw in hws.items()}
        status = await asyncio.to_thread(handle.wait_for, lambda s: s.offsets == ends, 60, 0.5)
        assert lags(status) == dict.fromkeys(ends, 0)

    async def run() -> None:
        producer = clients.producer(bootstrap, transactional_id="lag-truth")
        await producer.start()
        try:
            await transaction(producer, commit=True)  # 3 records + a marker per partition
            await caught_up_with_lag_0()
            await transaction(producer, commit=False)  # open: its records are not committed
            for _ in range(6):  # never lag 0 (nor None) while they are not in the table
                await asyncio.sleep(0.5)
                status = await asyncio.to_thread(handle.status)
                assert all(lag for lag in lags(status).values()), lags(status)
            await producer.abort_transaction()  # the log now ends in an aborted transaction
            await caught_up_with_lag_0()
        finally:
            await producer.stop()

    asyncio.run(run())
    values = DeltaTable(str(table)).to_pyarrow_table(columns=["value"])["value"].to_pylist()
    ours = Counter(v for v in values if v.startswith(b"txn-"))
    assert ours == Counter(f"txn-{i}".encode() for i in range(6)), "committed once, aborted never"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_a_dead_participant_holds_the_others_back_no_longer_than_the_write_timeout(
    ray_session, kafka_broker, tmp_path, kind
):
    """Partial commit: a participant gone for good (no restart) never reports; the other
    partitions are committed after write_timeout_s, every round, and stay exactly once.
    One partition per host here, so that one partition can die alone."""
    name = f"partial-{kind}"
    produced = Produced(kafka_broker.bootstrap_servers, name, 3)
    produced.more(3000)
    table = table_of_kind(kind, tmp_path)
    handle = _pipeline(
        name,
        kafka_broker.bootstrap_servers,
        name,
        table,
        commit_interval_s=1,
        write_timeout_s=3,
        partitions_per_host=1,
    ).start()
    try:
        handle.wait_for(_caught_up(produced), timeout_s=120)
        dead = f"{CLUSTER}/{name}/2"
        ray.kill(
            ray.get_actor(names.participant_host(name, dead, 1), namespace="rayconnect"),
            no_restart=True,
        )
        before = dict(produced.counts)
        produced.more(3000)
        alive = {k: v for k, v in produced.offsets().items() if k != dead}
        status = handle.wait_for(
            lambda s: all(s["offsets"].get(k) == v for k, v in alive.items()), timeout_s=120
        )
        assert status.rounds_since_start.partial >= 1
        assert status["offsets"][dead] == before[2]  # left behind, nothing lost
        rows = table_rows(table)
        assert len(rows) == len(set(rows)) == sum(status["offsets"].values())
    finally:
        handle.stop(commit=False)


async def _produce_every_codec(bootstrap: str, topic: str) -> dict[tuple[int, int], tuple]:
    """Records with and without keys, values and headers, sent by one producer per codec
    (so the partitions hold plain, gzip, snappy, lz4 and zstd batches); returns
    (partition, offset) -> (key, value, headers) as the table must hold them."""
    from aiokafka import AIOKafkaProducer

    expected: dict[tuple[int, int], tuple] = {}
    for codec in (None, "gzip", "snappy", "lz4", "zstd"):
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec)
        await producer.start()
        try:
            sent = []
            for i in range(400):
                key = None if i % 7 == 0 else f"{codec}-{i}".encode()
                value = (f"{codec}:{i}:" + "x" * (i % 300)).encode()
                if i % 11 == 0 and key is not None:  # a tombstone (a record needs one of them)
                    value = None
                headers = [("trace", b"%d" % i), ("empty", None)][: i % 3]
                future = await producer.send(
                    topic, value, key=key, headers=headers, partition=i % 2
                )
                sent.append((future, key, value, headers))
            for future, key, value, headers in sent:
                meta = await future
                expected[(meta.partition, meta.offset)] = (
                    key,
                    value,
                    [{"key": k, "value": v} for k, v in headers],
                )
        finally:
            await producer.stop()
    return expected


@pytest.mark.timeout(300)
def test_every_codec_and_headers_reach_the_table_byte_for_byte(ray_session, kafka_broker, tmp_path):
    """The reader decodes record batches itself (kafka/record_batches.py): keys, values (null
    included) and headers of plain and compressed batches must land exactly as produced."""
    bootstrap = kafka_broker.bootstrap_servers
    asyncio.run(create_topic(bootstrap, "codecs", 2))
    expected = asyncio.run(_produce_every_codec(bootstrap, "codecs"))
    want = Counter(p for p, _ in expected)
    handle = _pipeline("codecs", bootstrap, "codecs", tmp_path / "t", commit_interval_s=2).start()
    try:
        handle.wait_for(
            lambda s: s["offsets"] == {f"{CLUSTER}/codecs/{p}": n for p, n in want.items()},
            timeout_s=150,
        )
        t = DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
        got = {
            (p, o): (k, v, h)
            for p, o, k, v, h in zip(
                *(t[c].to_pylist() for c in ("partition", "offset", "key", "value", "headers")),
                strict=True,
            )
        }
        assert len(got) == t.num_rows == len(expected) == 2000
        assert got == expected
    finally:
        handle.stop(commit=False)


# -- table upkeep beside other writers (README "Table upkeep"); forced interleavings of a
# compaction and a round's commit, both orders, are in tests/integration/tables/
# test_delta_upkeep.py (no Ray needed). Here so it shares this module's Ray (~15-30 s).


@pytest.mark.timeout(400)
def test_pipeline_keeps_its_table_healthy_beside_a_users_optimize_delete_vacuum(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    """The pipeline compacts its table, writes and uses checkpoints and tidies its log while
    a user runs OPTIMIZE, DELETE WHERE and VACUUM on it: every record produced and not
    deleted by the user is in the table exactly once. Then the table is dropped under it:
    it stops with the reason instead of writing on."""
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced(bootstrap, "upkeep", 4)
    produced.more(400)
    path = tmp_path / "t"
    sink = rc.DeltaSink(
        str(path),
        compact=CompactSettings(min_files=4, every_s=0),
        log=LogSettings(checkpoint_interval=5, log_retention_hours=10 / 3600, tidy_every_s=2),
    )
    handle = sink_checks.pipeline(
        "upkeep", bootstrap, "upkeep", sink, commit_interval_s=0.5, write_timeout_s=60
    ).start()
    deleted = {(CLUSTER, "upkeep", 1, o) for o in range(10)}
    users_jobs = [
        lambda: DeltaTable(str(path)).optimize.compact(),
        lambda: DeltaTable(str(path)).delete("`partition` = 1 AND `offset` < 10"),
        lambda: DeltaTable(str(path)).vacuum(retention_hours=0, enforce_retention_duration=False),
    ]
    try:
        handle.wait_for(_caught_up(produced), timeout_s=150)
        for job in users_jobs:  # each while more records arrive and rounds commit
            produced.more(200)
            job()
            handle.wait_for(_caught_up(produced), timeout_s=120)
        # a user's OPTIMIZE racing the pipeline's compaction commits twice in delta-rs;
        # upkeep finds it in the log and rewrites the rows once (tables/compaction_races.py)
        seen = DeltaTable(str(path)).version()
        status = handle.wait_for(
            lambda s: (
                s.upkeep.compactions >= 1
                and any(
                    (r.get("races") or {}).get("checked_to", -1) >= seen for r in s["upkeep_recent"]
                )
            ),
            timeout_s=60,
        )
        rows = table_rows(path)
        assert [r for r, n in Counter(rows).items() if n > 1] == []
        assert set(rows) == produced.rows() - deleted
        assert status["offsets"] == produced.offsets()
        assert status["gave_up"] is None, status
        dt = DeltaTable(str(path))
        assert dt.metadata().configuration["delta.checkpointInterval"] == "5"
        log_names = os.listdir(path / "_delta_log")
        assert any(".checkpoint." in n for n in log_names)
        # expired entries (10 s) cleaned up by a later tidy (every 2 s, idle or not)
        deadline = time.monotonic() + 40
        while "00000000000000000000.json" in os.listdir(path / "_delta_log"):
            assert time.monotonic() < deadline, "expired log entries never cleaned up"
            time.sleep(1)
        assert len(dt.file_uris()) < status.rounds_since_start.committed * 2, "not compacted"

        # the table is dropped under the running pipeline: it stops, with the reason
        for name in os.listdir(path / "_delta_log"):
            os.remove(path / "_delta_log" / name)
        produced.more(100)
        status = handle.wait_for(lambda s: s["gave_up"] is not None, timeout_s=60)
        assert "table broken" in status["gave_up"] and "is gone" in status["gave_up"]
        time.sleep(1.5)
        assert os.listdir(path / "_delta_log") == []  # nothing written into it
    finally:
        handle.stop(commit=False)
