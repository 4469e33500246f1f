"""Typed tables on real parts: JSON values decoded on the Spark executors into columns, a
field appearing mid-stream, bad records to the dead-letter table - exactly once across both
tables while the coordinator is killed mid-round - and ``errors: stop``."""

from __future__ import annotations

import asyncio
import datetime
import json
import struct
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import sink_checks
from aiokafka import AIOKafkaProducer
from deltalake import DeltaTable
from iceberg_reads import duckdb_query, load_table
from sink_checks import produce_into_an_open_round
from table_files_duckdb import duckdb_delta_rows

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.kafka.admin import create_topic

CLUSTER = sink_checks.CLUSTER
PARTITIONS = 2


class JsonTopic:
    """Values produced per partition, in offset order (a fresh topic: offsets 0..n-1)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        asyncio.run(create_topic(bootstrap, topic, PARTITIONS))

    def send(self, values: list[bytes]) -> None:
        async def go() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await producer.start()
            try:
                futures = []
                for value in values:
                    p = sum(len(v) for v in self.values.values()) % PARTITIONS
                    futures.append(await producer.send(self.topic, value, partition=p))
                    self.values[p].append(value)
                await asyncio.gather(*futures)
            finally:
                await producer.stop()

        asyncio.run(go())

    def offsets(self) -> dict[str, int]:
        return {f"{CLUSTER}/{self.topic}/{p}": len(v) for p, v in self.values.items() if v}

    def caught_up(self):  # noqa: ANN201 - a wait_for predicate
        want = self.offsets()
        return lambda s: s["offsets"] == want


def good(i: int, color: bool = False) -> bytes:
    record = {"id": i, "name": f"n{i}", "tags": [f"t{i % 3}"], "at": "2026-11-23T10:00:00Z"}
    if color:
        record["color"] = "red" if i % 2 else "blue"
    return json.dumps(record).encode()


def is_good(value: bytes) -> bool:
    try:
        return isinstance(json.loads(value)["id"], int)
    except (ValueError, KeyError, TypeError):
        return False


class Feed:
    """The values still to send, handed out in order (``produce_into_an_open_round``)."""

    def __init__(self, topic: JsonTopic, values: list[bytes]) -> None:
        self.topic, self.rest = topic, list(values)

    def more(self, n: int) -> None:
        part, self.rest = self.rest[:n], self.rest[n:]
        if part:
            self.topic.send(part)


class TypedTable:
    """The typed sink of one table kind, and its two tables read back as users would
    (Delta: delta-rs/Polars and DuckDB; Iceberg: pyiceberg's scan and DuckDB)."""

    def __init__(self, kind: str, tmp_path: Path, partition_by: tuple[str, ...]) -> None:
        self.kind, self.root = kind, tmp_path / "t"
        if kind == "delta":
            self.sink: rc.DeltaSink | rc.IcebergSink = rc.DeltaSink(
                str(self.root), partition_by=partition_by
            )
        else:
            self.sink = rc.IcebergSink(
                "db.typed", warehouse=str(tmp_path / "wh"), partition_by=partition_by
            )

    def rows(self, dead: bool = False) -> pl.DataFrame:
        if self.kind == "delta":
            return pl.read_delta(str(self.root / DEAD_LETTER_DIR if dead else self.root))
        table = self.sink.table + ("_dead_letters" if dead else "")
        return pl.from_arrow(load_table(self.sink, table).scan().to_arrow())

    def duckdb(self, sql: str) -> list[tuple]:
        if self.kind == "delta":
            return duckdb_delta_rows(self.root, sql)
        return duckdb_query(self.sink, sql)

    def files_partitions(self) -> list[dict]:
        """Each data file's partition values (name -> value)."""
        if self.kind == "delta":
            dt = DeltaTable(str(self.root))
            adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
            return [
                {
                    k.removeprefix("partition."): v
                    for k, v in a.items()
                    if k.startswith("partition.")
                }
                for a in adds
            ]
        return load_table(self.sink).inspect.files()["partition"].to_pylist()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_json_inferred_evolution_and_dead_letters_exactly_once_through_kills(
    ray_session, kafka_broker, tmp_path: Path, kill, kind: str
) -> None:
    topic = JsonTopic(kafka_broker.bootstrap_servers, f"typed-json-{kind}")
    topic.send([good(i) for i in range(400)])
    table = TypedTable(kind, tmp_path, ("day=day(_kafka_timestamp)", "_kafka_partition"))
    meta = rc.StaticMetadataService(
        (
            rc.KafkaStream(
                "s", {CLUSTER: rc.ClusterMetadata(kafka_broker.bootstrap_servers, (topic.topic,))}
            ),
        )
    )
    pipeline = rc.SinkPipeline(
        "typed",
        rc.KafkaSource(meta, value_format="json", errors="dead_letter"),
        table.sink,
        commit_interval_s=2,
    )
    handle = pipeline.start()
    try:
        handle.wait_for(topic.caught_up(), timeout_s=120)
        # A field appears mid-stream; garbage bytes and a type conflict among the records.
        later = [
            b"\x00garbage" if i % 97 == 0 else b'{"id":"x"}' if i % 101 == 0 else good(i, True)
            for i in range(400, 1400)
        ]
        # Killed mid-round: the coordinator, then the participant host of both partitions.
        host = names.participant_host(
            "typed", f"{CLUSTER}/{topic.topic}/0", DEFAULT_PARTITIONS_PER_HOST
        )
        feed = Feed(topic, later)
        for victim in (names.coordinator("typed"), host):
            # a round may read and commit a chunk between two polls: send more until one holds
            produce_into_an_open_round(handle, feed, 100, attempts=5, wait_s=8)
            kill(victim, "sigkill")
        feed.more(len(feed.rest))
        handle.wait_for(topic.caught_up(), timeout_s=240)
        status = handle.status()
    finally:
        handle.stop(commit=False)

    main, dead = table.rows(), table.rows(dead=True)
    coords = lambda df: list(zip(df["_kafka_partition"], df["_kafka_offset"], strict=True))  # noqa: E731
    produced = {(p, o): v for p, vs in topic.values.items() for o, v in enumerate(vs)}
    # Exactly once across both tables: each record in one of them, once.
    assert [c for c, n in Counter(coords(main) + coords(dead)).items() if n > 1] == []
    assert set(coords(main)) == {c for c, v in produced.items() if is_good(v)}
    assert set(coords(dead)) == {c for c, v in produced.items() if not is_good(v)}
    assert len(dead) == sum(1 for i in range(400, 1400) if i % 97 == 0 or i % 101 == 0)
    assert dead["value"].to_list() == [produced[c] for c in coords(dead)]
    assert all(dead["reason"].str.contains("JSON"))
    # Decoded columns, the new one null for the rows written before it appeared.
    by_id = {r["id"]: r for r in main.to_dicts()}
    assert by_id[5]["name"] == "n5" and by_id[5]["tags"] == ["t2"] and by_id[5]["color"] is None
    assert by_id[1001]["color"] == "red" and by_id[1002]["color"] == "blue"
    assert str(main.schema["at"]).startswith("Datetime")
    assert status["offsets"] == topic.offsets()
    per_partition = Counter(f"{CLUSTER}/{topic.topic}/{p}" for p in dead["_kafka_partition"])
    assert status["dead_letters"] == dict(per_partition)
    assert table.duckdb("SELECT count(*), count(color) FROM TABLE") == [
        (len(main), main["color"].count())
    ]
    # Partitioned by the Kafka timestamp's day and the partition: a file never mixes two
    # (Delta: values in the add actions; Iceberg: from the file's column statistics).
    today = datetime.datetime.now(datetime.UTC).date()
    parts = table.files_partitions()
    assert parts and all(p["day"] == today for p in parts)
    assert {p["_kafka_partition"] for p in parts} == set(range(PARTITIONS))
    if kind == "delta":
        for add in pa.table(DeltaTable(str(table.root)).get_add_actions(flatten=True)).to_pylist():
            assert f"_kafka_partition={add['partition._kafka_partition']}/" in add["path"]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_errors_stop_names_the_bad_record_and_commits_nothing_after_it(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    topic = JsonTopic(kafka_broker.bootstrap_servers, "typed-stop")
    topic.send([good(i) for i in range(20)])
    table = tmp_path / "t"
    pipeline = sink_checks.pipeline(
        "typed-stop",
        kafka_broker.bootstrap_servers,
        topic.topic,
        table,
        source={"value_format": "json", "value_schema": {"id": "long", "name": "string"}},
        commit_interval_s=2,
    )
    handle = pipeline.start()
    try:
        handle.wait_for(topic.caught_up(), timeout_s=120)
        topic.send([b"not json"] + [good(i) for i in range(21, 40)])  # lands on partition 0
        bad_key, other = f"{CLUSTER}/{topic.topic}/0", f"{CLUSTER}/{topic.topic}/1"
        # Only the bad record's partition stops: the other one commits all it has.
        status = handle.wait_for(
            lambda s: (
                "bad record at" in (s.get("last_error") or "") and s["offsets"].get(other) == 20
            ),
            timeout_s=120,
        )
        time.sleep(5)  # rounds keep failing: nothing is committed past the bad record
        status = handle.status()
    finally:
        handle.stop(commit=False)
    assert f"bad record at {bad_key} offset 10" in status["last_error"]
    assert status["offsets"][bad_key] <= 10
    assert status["offsets"][other] == 20
    main = pl.read_delta(str(table))
    assert main.columns[5:] == ["id", "name"]
    assert main.filter(pl.col("_kafka_partition") == 0)["_kafka_offset"].max() < 10


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_avro_values_from_an_avsc_into_an_hour_partitioned_table(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    from rayconnect.formats.avro import _varint

    def text(s: str) -> bytes:
        return _varint(len(s.encode())) + s.encode()

    schema = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "sensor", "type": "string"},
            {"name": "value", "type": "double"},
            {"name": "flags", "type": {"type": "array", "items": "string"}},
        ],
    }
    avsc = tmp_path / "reading.avsc"
    avsc.write_text(json.dumps(schema))
    topic = JsonTopic(kafka_broker.bootstrap_servers, "typed-avro")
    datums = [
        text(f"s{i % 3}") + struct.pack("<d", i / 4) + _varint(1) + text("ok") + _varint(0)
        for i in range(300)
    ]
    topic.send([*datums[:150], b"\xff\xff", *datums[150:]])
    table = tmp_path / "t"
    meta = rc.StaticMetadataService(
        (
            rc.KafkaStream(
                "s", {CLUSTER: rc.ClusterMetadata(kafka_broker.bootstrap_servers, (topic.topic,))}
            ),
        )
    )
    pipeline = rc.SinkPipeline(
        "typed-avro",
        rc.KafkaSource(
            meta, value_format="avro", value_avro_schema=str(avsc), errors="dead_letter"
        ),
        rc.DeltaSink(str(table), partition_by=("hour=hour(_kafka_timestamp)", "sensor")),
        commit_interval_s=2,
    )
    handle = pipeline.start()
    try:
        status = handle.wait_for(topic.caught_up(), timeout_s=180)
    finally:
        handle.stop(commit=False)
    main = pl.read_delta(str(table))
    assert sorted(main["value"].to_list()) == [i / 4 for i in range(300)]
    assert set(main["sensor"]) == {"s0", "s1", "s2"} and set(main["hour"].str.len_chars()) == {13}
    dead = pl.read_delta(str(table / DEAD_LETTER_DIR))
    assert dead["value"].to_list() == [b"\xff\xff"]
    assert sum(status["dead_letters"].values()) == 1


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_transform_filters_derives_and_partitions_exactly_once_through_a_kill(
    ray_session, kafka_broker, tmp_path: Path, kill, kind: str
) -> None:
    """Spark SQL over each write's decoded rows: a filter, a derived column and a date to
    partition by, in the round's one Spark job; garbage bytes go to the dead-letter table
    (they never reach the statement); the coordinator killed mid-round changes nothing."""
    topic = JsonTopic(kafka_broker.bootstrap_servers, f"typed-transform-{kind}")
    values = [b"\x00garbage" if i % 53 == 0 else good(i) for i in range(900)]
    topic.send(values[:300])
    table = TypedTable(kind, tmp_path, partition_by=("day",))
    meta = rc.StaticMetadataService(
        (
            rc.KafkaStream(
                "s", {CLUSTER: rc.ClusterMetadata(kafka_broker.bootstrap_servers, (topic.topic,))}
            ),
        )
    )
    source = rc.KafkaSource(
        meta,
        value_format="json",
        value_schema={"id": "long", "name": "string", "at": "timestamp"},
        errors="dead_letter",
    )
    transform = (
        "SELECT _kafka_cluster, _kafka_topic, _kafka_partition, _kafka_offset, id, "
        "upper(name) AS name_upper, to_date(at) AS day FROM records WHERE id % 2 = 0"
    )
    pipeline = rc.SinkPipeline(
        "typed-sql",
        source,
        table.sink,
        commit_interval_s=2,
        transform=transform,
    )
    handle = pipeline.start()
    try:
        handle.wait_for(topic.caught_up(), timeout_s=120)
        feed = Feed(topic, values[300:])
        produce_into_an_open_round(handle, feed, 100, attempts=5, wait_s=8)
        kill(names.coordinator("typed-sql"), "sigkill")
        feed.more(len(feed.rest))
        handle.wait_for(topic.caught_up(), timeout_s=240)
        status = handle.status()
    finally:
        handle.stop(commit=False)

    main, dead = table.rows(), table.rows(dead=True)
    coords = lambda df: list(zip(df["_kafka_partition"], df["_kafka_offset"], strict=True))  # noqa: E731
    produced = {(p, o): v for p, vs in topic.values.items() for o, v in enumerate(vs)}
    kept = {c for c, v in produced.items() if is_good(v) and json.loads(v)["id"] % 2 == 0}
    assert sorted(coords(main)) == sorted(kept)  # each kept record once, nothing else
    assert sorted(coords(dead)) == sorted(c for c, v in produced.items() if not is_good(v))
    assert main.columns == [
        "_kafka_cluster",
        "_kafka_topic",
        "_kafka_partition",
        "_kafka_offset",
        "id",
        "name_upper",
        "day",
    ]
    assert all(r["name_upper"] == f"N{r['id']}" for r in main.to_dicts())
    assert set(main["day"].to_list()) == {datetime.date(2026, 11, 23)}
    assert status["offsets"] == topic.offsets()
    files = table.files_partitions()
    assert files and all(f["day"] == datetime.date(2026, 11, 23) for f in files)
    if kind == "delta":  # Hive folders (Iceberg's files need none: the manifest says)
        adds = pa.table(DeltaTable(str(table.root)).get_add_actions(flatten=True)).to_pylist()
        assert all("day=2026-11-23/" in a["path"] for a in adds)
