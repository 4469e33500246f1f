"""A partitioned upsert table on real parts (issue 26's leftovers): Debezium change events
whose updates move keys between partitions, through a pipeline into Delta and Iceberg
tables partitioned by ``region`` - the table ends equal to the events' final state, each
key once and in its region's partition; changes that cannot apply (no key anywhere, an
unknown ``op``) are dead letters with their reason, on both table kinds. Only the key and
the partition column are declared (``infer_other_fields``): ``v`` and ``at`` are inferred,
``at`` from ISO-8601 strings with fractional seconds and offsets - a timestamp column."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet  # noqa: F401 - pa.parquet
import pytest
import sink_checks
from aiokafka import AIOKafkaProducer
from deltalake import DeltaTable
from iceberg_reads import load_table

import rayconnect as rc
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.kafka.admin import create_topic

CLUSTER = sink_checks.CLUSTER
REGIONS = ("north", "south", "east")
UTC = dt.UTC


def _events() -> tuple[list[tuple[int, bytes, bytes | None]], dict[int, dict], dict]:
    """(partition, key, value) of the stream, the rows it leaves, the (partition, offset) ->
    reason of the changes that cannot apply. Keys 0..59 over 2 partitions; each key is
    created, updated twice (the second update moves it to the next region), every third
    one deleted; ``at`` an ISO time with fractional seconds and an offset. Each event
    carries a ``source.lsn`` as Postgres's do (kept beside the row to order truncates; never
    a column of the table)."""
    out: list[tuple[int, bytes, bytes | None]] = []
    state: dict[int, dict] = {}
    bad: dict[tuple[int, int], str] = {}
    sent = [0, 0]

    def send(p: int, key: dict, value: dict | None, reason: str | None = None) -> None:
        if reason:
            bad[(p, sent[p])] = reason
        if value is not None:
            value = {**value, "source": {"lsn": 1000 + len(out), "table": "regions"}}
        out.append(
            (p, json.dumps(key).encode(), None if value is None else json.dumps(value).encode())
        )
        sent[p] += 1

    for rnd in range(3):
        for k in range(60):
            p = k % 2
            region = REGIONS[(k + (rnd == 2)) % 3]
            row = {
                "id": k,
                "region": region,
                "v": f"r{rnd}-{k}",
                "at": f"2024-05-01T1{rnd}:00:00.{k:03d}+02:00",
            }
            before = state.get(k)
            state[k] = {**row, "at": dt.datetime(2024, 5, 1, 8 + rnd, 0, 0, k * 1000, UTC)}
            send(
                p,
                {"id": k},
                {"op": "u" if before else "c", "before": before and {"id": k}, "after": row},
            )
    for k in range(0, 60, 3):
        del state[k]
        send(k % 2, {"id": k}, {"op": "d", "before": {"id": k}, "after": None})
        send(k % 2, {"id": k}, None)  # Debezium's tombstone after a delete: nothing
    send(0, {"id": 7}, {"op": "x", "after": {"id": 7}}, "debezium envelope")
    send(1, {}, {"op": "c", "after": {"region": "north", "v": "no key"}}, "key column")
    return out, state, bad


def _produce(bootstrap: str, topic: str, events: list) -> dict[str, int]:
    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for p, key, value in events:
                await producer.send_and_wait(topic, value, key=key, partition=p)
        finally:
            await producer.stop()

    asyncio.run(create_topic(bootstrap, topic, 2))
    asyncio.run(go())
    counts = [sum(1 for p, _, _ in events if p == q) for q in (0, 1)]
    return {f"{CLUSTER}/{topic}/{p}": n for p, n in enumerate(counts)}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "kind",
    # Iceberg's pipeline test (~3 min) runs in the slow group; its table-level test of a
    # key moving partition (tests/integration/tables/test_upsert_apply.py) stays in CI
    ["delta", pytest.param("iceberg", marks=pytest.mark.slow)],
)
def test_updates_move_keys_between_partitions_and_bad_changes_are_dead_letters(
    ray_session, kafka_broker, tmp_path: Path, kind: str
) -> None:
    name = f"upsert-parts-{kind}"
    events, state, bad = _events()
    want = _produce(kafka_broker.bootstrap_servers, name, events)
    if kind == "delta":
        sink: rc.DeltaSink | rc.IcebergSink = rc.DeltaSink(
            str(tmp_path / "t"), write_mode="upsert", partition_by=("region",)
        )
    else:
        sink = rc.IcebergSink(
            "db.regions",
            warehouse=str(tmp_path / "wh"),
            write_mode="upsert",
            partition_by=("region",),
        )
    meta = sink_checks.static_meta(kafka_broker.bootstrap_servers, [name])
    source = rc.KafkaSource(
        meta,
        value_format="json",
        value_schema={"id": "long", "region": "string"},  # the partition (and key) declared,
        infer_other_fields=True,  # the rest inferred: `at`'s ISO times become timestamps
        key_format="json",
        key_schema={"id": "long"},
        include_key=True,
        errors="dead_letter",
        envelope="debezium",
    )
    handle = rc.SinkPipeline(name, source, sink, commit_interval_s=1).start()
    try:
        handle.wait_for(lambda s: s["offsets"] == want, timeout_s=180)
    finally:
        handle.stop(commit=False)

    if kind == "delta":
        dt_ = DeltaTable(str(tmp_path / "t"))
        assert dt_.metadata().partition_columns == ["region"]
        table = dt_.to_pyarrow_table()
        dead = DeltaTable(str(tmp_path / "t" / DEAD_LETTER_DIR)).to_pyarrow_table()
        # a row's region comes from its files' partition values: it is where it belongs
        by_file = pa.table(dt_.get_add_actions(flatten=True))
        regions = {r["region"] for r in state.values()}  # (the updates left none in south)
        assert set(by_file.column("partition.region").to_pylist()) == regions
    else:
        iceberg = load_table(sink)
        assert [f.name for f in iceberg.spec().fields] == ["region"]
        table = iceberg.scan().to_arrow()
        for task in iceberg.scan().plan_files():  # each file holds its partition's rows only
            rows = pa.parquet.read_table(task.file.file_path.removeprefix("file://"))
            assert set(rows.column("region").to_pylist()) == {task.file.partition[0]}
        dead = load_table(sink, sink.table + "_dead_letters").scan().to_arrow()
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(state)  # each key once
    got = {r["id"]: {c: r[c] for c in ("id", "region", "v", "at")} for r in table.to_pylist()}
    assert got == state
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert not [c for c in table.column_names if c.startswith("_rayconnect")]
    reasons = {(r["_kafka_partition"], r["_kafka_offset"]): r["reason"] for r in dead.to_pylist()}
    assert reasons.keys() == bad.keys() and len(dead) == len(bad)
    assert all(bad[c] in reasons[c] for c in bad), reasons


# -- a truncate per partition, its partitions read a round apart -------------------------

TRUNCATE = b'{"op": "t", "before": null, "after": null, "source": {"table": "t"}}'


def _created(k: int, v: str) -> tuple[bytes, bytes]:
    event = {"op": "c", "before": None, "after": {"id": k, "v": v}, "source": {"table": "t"}}
    return json.dumps({"id": k}).encode(), json.dumps(event).encode()


@pytest.mark.timeout(300)
@pytest.mark.slow  # ~60 s (a pipeline of its own); the rule on real tables, round by round,
# is in tests/integration/tables/test_upsert_apply.py (CI), end to end the database mirror
def test_a_truncate_per_partition_is_exact_when_one_partition_is_read_a_round_late(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    """A TRUNCATE as rayconnect's Postgres source writes it (a marked copy in each
    partition), with partition 1's part of the history reaching the sink a round after
    partition 0's - as when its reader is behind: key 11 (partition 1) was inserted before
    the TRUNCATE, keys 2, 10 (partition 0) and 13 (partition 1) after it. The table ends as
    the database: {2, 10, 13}. (A single whole-table truncate on partition 0 would end
    with key 11 too: it would reach the table after the truncate did.)"""
    bootstrap, name = kafka_broker.bootstrap_servers, "upsert-truncx"
    asyncio.run(create_topic(bootstrap, name, 2))
    sent = [0, 0]
    marker = [("rayconnect.truncate", b"partition")]

    def produce(records: list[tuple[int, bytes | None, bytes, list]]) -> dict[str, int]:
        async def go() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
            await producer.start()
            try:
                for p, key, value, headers in records:
                    await producer.send_and_wait(name, value, key=key, partition=p, headers=headers)
                    sent[p] += 1
            finally:
                await producer.stop()

        asyncio.run(go())
        return {f"{CLUSTER}/{name}/{p}": n for p, n in enumerate(sent) if n}

    def created(p: int, k: int, v: str) -> tuple[int, bytes, bytes, list]:
        return (p, *_created(k, v), [])

    path = str(tmp_path / "t")
    source = rc.KafkaSource(
        sink_checks.static_meta(bootstrap, [name]),
        value_format="json",
        value_schema={"id": "long", "v": "string"},
        key_format="json",
        key_schema={"id": "long"},
        include_key=True,
        errors="dead_letter",
        envelope="debezium",
    )
    handle = rc.SinkPipeline(
        name, source, rc.DeltaSink(path, write_mode="upsert"), commit_interval_s=1
    ).start()

    def table() -> dict[int, str]:
        rows = DeltaTable(path).to_pyarrow_table()
        assert not [c for c in rows.column_names if c.startswith("_rayconnect")]
        return dict(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))

    try:
        want = produce([created(k % 2, k, "old") for k in range(10)])
        handle.wait_for(lambda s: s["offsets"] == want, timeout_s=120)
        assert table() == dict.fromkeys(range(10), "old")
        # partition 0's part: its truncate, then keys 10 and 2 created after it
        want = produce([(0, None, TRUNCATE, marker), created(0, 10, "after"),
                        created(0, 2, "after")])  # fmt: skip
        handle.wait_for(lambda s: s["offsets"] == want, timeout_s=60)
        # partition 1 is not truncated yet: its rows are as far as its reader got
        assert table() == {1: "old", 3: "old", 5: "old", 7: "old", 9: "old", 2: "after",
                           10: "after"}  # fmt: skip
        # partition 1's part, a round late: key 11 before its truncate, key 13 after it
        want = produce([created(1, 11, "before"), (1, None, TRUNCATE, marker),
                        created(1, 13, "after")])  # fmt: skip
        handle.wait_for(lambda s: s["offsets"] == want, timeout_s=60)
        assert table() == {2: "after", 10: "after", 13: "after"}
    finally:
        handle.stop(commit=False)
    assert not Path(path, DEAD_LETTER_DIR).exists() or not len(
        DeltaTable(str(Path(path, DEAD_LETTER_DIR))).to_pyarrow_table()
    )
