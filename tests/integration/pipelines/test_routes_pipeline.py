"""Routes on real parts (broker, Ray, Spark, Delta and Iceberg tables): one sink pipeline
writing many tables made on the fly - by topic pattern, and by a field of the value (one
partition feeding several tables) - exactly once per table, also when the coordinator dies
after committing some of a round's tables (``tables.table_set``'s fault point)."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import sink_checks
from aiokafka import AIOKafkaProducer
from deltalake import DeltaTable
from iceberg_reads import load_table

import rayconnect as rc
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.kafka.admin import create_topic
from rayconnect.tables.factory import open_committer
from rayconnect.tables.table_set import FAULT_ENV

CLUSTER = sink_checks.CLUSTER
PARTITIONS = 2
# Read by the coordinator's process (Ray's workers inherit the driver's environment when the
# module's Ray starts); the fault fires only while the marker file exists.
FAULT_MARKER = Path(f"/tmp/rayconnect-routes-fault-{os.getpid()}")
os.environ[FAULT_ENV] = str(FAULT_MARKER)


class Topics:
    """JSON values produced per (topic, partition), in offset order (fresh topics)."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.values: dict[tuple[str, int], list[dict]] = {
            (t, p): [] for t in topics for p in range(PARTITIONS)
        }
        for t in topics:
            asyncio.run(create_topic(bootstrap, t, PARTITIONS))

    def send(self, topic: str, records: list[dict]) -> None:
        async def go() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await producer.start()
            try:
                futures = []
                for i, record in enumerate(records):
                    p = i % PARTITIONS
                    futures.append(
                        await producer.send(topic, json.dumps(record).encode(), partition=p)
                    )
                    self.values[(topic, p)].append(record)
                await asyncio.gather(*futures)
            finally:
                await producer.stop()

        asyncio.run(go())

    def offsets(self) -> dict[str, int]:
        return {f"{CLUSTER}/{t}/{p}": len(v) for (t, p), v in self.values.items() if v}

    def caught_up(self):  # noqa: ANN201 - a wait_for predicate
        want = self.offsets()
        return lambda s: s["offsets"] == want

    def where(self, keep) -> dict[tuple[str, int, int], dict]:  # noqa: ANN001
        """(topic, partition, offset) -> record, of the records ``keep`` takes."""
        return {
            (t, p, o): r
            for (t, p), records in self.values.items()
            for o, r in enumerate(records)
            if keep(t, r)
        }


def _streams_file(path: Path, bootstrap: str, topics: list[str]) -> None:
    """The streams of a ``FileMetadataService``, written atomically (read while it runs)."""
    doc = {
        "streams": [
            {
                "stream_id": "s",
                "clusters": {CLUSTER: {"bootstrap_servers": bootstrap, "topics": topics}},
            }
        ]
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _rows(sink: rc.DeltaSink | rc.IcebergSink, name: str) -> pl.DataFrame:
    route = sink.route_table(name)
    if isinstance(route, rc.IcebergSink):
        return pl.from_arrow(load_table(route).scan().to_arrow())
    return pl.read_delta(route.path)


def _coordinates(df: pl.DataFrame) -> list[tuple[str, int, int]]:
    return list(zip(df["_kafka_topic"], df["_kafka_partition"], df["_kafka_offset"], strict=True))


def _table_offsets(pipeline: rc.SinkPipeline, name: str) -> dict:
    cfg = pipeline.config
    route = cfg.sink.route_table(name)
    return open_committer(route, cfg.name, cfg.record_format()).committed_offsets(None)


def _events(tables: list[str], first: int, n: int) -> list[dict]:
    """Change events of one topic for several tables, by ``source.table``."""
    return [
        {"id": i, "source": {"db": "shop", "table": tables[i % len(tables)]}}
        for i in range(first, first + n)
    ]


def _check_field_routed(sink, topics: Topics, topic: str, tables: list[str]) -> None:  # noqa: ANN001
    for name in tables:
        rows = _rows(sink, name)
        coords = _coordinates(rows)
        assert [c for c, n in Counter(coords).items() if n > 1] == []
        want = topics.where(lambda t, r, name=name: t == topic and r["source"]["table"] == name)
        assert set(coords) == set(want)
        assert sorted(rows["id"].to_list()) == sorted(r["id"] for r in want.values())


def _check_table_status(pipeline: rc.SinkPipeline, status: rc.PipelineStatus, names) -> None:  # noqa: ANN001
    """Each route table in the status: its own offsets, no lag, and - once this coordinator
    committed it - the table's version; the table made after the death has every row."""
    assert sorted(status.tables) == sorted(names)
    for name, table in status.tables.items():
        assert table.offsets == _table_offsets(pipeline, name)
        assert table.lag == 0
        if table.last_commit_at is not None:
            path = pipeline.config.sink.route_table(name).path
            assert table.version == DeltaTable(path).version()
    extra = status.tables["lake_extra"]
    assert extra.rows_since_start == 25 and extra.last_commit_at is not None


@pytest.mark.timeout(420)
def test_topic_pattern_and_field_routes_into_delta_tables_made_on_the_fly_through_a_death(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    """Three topics by pattern into three tables, a fourth unrouted, and one topic's
    partitions by ``source.table`` into three more; the coordinator dies after committing
    the first table of a round."""
    shop = ["shop.public.users", "shop.public.orders", "shop.public.items"]
    names = [*shop, "misc", "cdc"]
    topics = Topics(kafka_broker.bootstrap_servers, names)
    cdc_tables = ["c_users", "c_orders", "c_items"]
    for n, t in enumerate(names[:-1]):
        topics.send(t, [{"id": i, "n": n} for i in range(30 + 10 * n)])
    topics.send("cdc", _events(cdc_tables, 0, 60))
    routes = rc.Routes(
        (
            rc.Route("lake_{1}", topic_pattern=r"shop\.public\.(.*)"),
            rc.Route("{value}", field="source.table"),
        )
    )
    sink = rc.DeltaSink(str(tmp_path / "lake"), routes=routes)
    streams = tmp_path / "streams.json"
    _streams_file(streams, kafka_broker.bootstrap_servers, names)
    source = rc.KafkaSource(
        rc.FileMetadataService(str(streams)), value_format="json", discovery_interval_s=0.5
    )
    pipeline = rc.SinkPipeline("routed", source, sink, commit_interval_s=1)
    handle = pipeline.start()
    try:
        handle.wait_for(topics.caught_up(), timeout_s=120)
        before = handle.status()
        FAULT_MARKER.touch()  # the next round of several tables dies after the first
        for n, t in enumerate(shop):  # rounds into tables that exist now
            topics.send(t, [{"id": i, "n": n, "more": True} for i in range(100, 120)])
        topics.send("cdc", _events(cdc_tables, 60, 90))
        handle.wait_for(lambda s: not FAULT_MARKER.exists(), timeout_s=60)
        topics.send("cdc", _events(cdc_tables, 150, 30))
        # a new topic the pattern takes flows into a new table, without a restart
        extra = Topics(kafka_broker.bootstrap_servers, ["shop.public.extra"])
        extra.send("shop.public.extra", [{"id": i, "n": 9} for i in range(25)])
        topics.values.update(extra.values)
        _streams_file(streams, kafka_broker.bootstrap_servers, [*names, "shop.public.extra"])
        status = handle.wait_for(topics.caught_up(), timeout_s=120)
    finally:
        FAULT_MARKER.unlink(missing_ok=True)
        handle.stop(commit=False)

    assert status["epoch"] > before["epoch"]  # the coordinator did die and came back
    assert status["offsets"] == topics.offsets()
    shop_short = ("users", "orders", "items", "extra")
    for short in shop_short:
        topic = f"shop.public.{short}"
        rows = _rows(sink, f"lake_{short}")
        want = topics.where(lambda t, _, topic=topic: t == topic)
        assert sorted(_coordinates(rows)) == sorted(want)
        assert sorted(rows["id"].to_list()) == sorted(r["id"] for r in want.values())
        if short != "extra":  # a table of its own: its schema has no "more"
            assert rows["more"].sum() == 20
        assert _table_offsets(pipeline, f"lake_{short}") == {
            k: v for k, v in topics.offsets().items() if f"/{topic}/" in k
        }
    _check_field_routed(sink, topics, "cdc", cdc_tables)
    _check_table_status(pipeline, status, [f"lake_{s}" for s in shop_short] + cdc_tables)
    unrouted = pl.read_delta(str(tmp_path / "lake" / DEAD_LETTER_DIR))
    assert sorted(_coordinates(unrouted)) == sorted(topics.where(lambda t, _: t == "misc"))
    assert set(unrouted["reason"]) == {"no route takes topic 'misc' with source.table=None"}


@pytest.mark.slow  # the Delta test above has field routes and the death too (~4 min here)
@pytest.mark.timeout(420)
def test_field_routes_into_iceberg_tables_exactly_once_through_a_death_between_tables(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    topic = "cdc-iceberg"
    topics = Topics(kafka_broker.bootstrap_servers, [topic])
    tables = ["users", "orders", "items"]
    topics.send(topic, _events(tables, 0, 60))
    routes = rc.Routes((rc.Route("{value}", field="source.table"),))
    sink = rc.IcebergSink("shop.cdc", warehouse=str(tmp_path / "wh"), routes=routes)
    pipeline = rc.SinkPipeline(
        "field-iceberg",
        rc.KafkaSource(
            sink_checks.static_meta(kafka_broker.bootstrap_servers, [topic]), value_format="json"
        ),
        sink,
        commit_interval_s=1,
    )
    handle = pipeline.start()
    try:
        handle.wait_for(topics.caught_up(), timeout_s=120)
        before = handle.status()
        FAULT_MARKER.touch()
        topics.send(topic, _events(tables, 60, 90))
        handle.wait_for(lambda s: not FAULT_MARKER.exists(), timeout_s=60)
        topics.send(topic, _events(tables, 150, 30))
        status = handle.wait_for(topics.caught_up(), timeout_s=180)
    finally:
        FAULT_MARKER.unlink(missing_ok=True)
        handle.stop(commit=False)

    assert status["epoch"] > before["epoch"]
    assert status["offsets"] == topics.offsets()
    _check_field_routed(sink, topics, topic, tables)
