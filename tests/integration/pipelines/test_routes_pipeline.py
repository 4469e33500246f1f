"""Routes on real parts (broker, Ray, Spark, Delta and Iceberg tables): one sink pipeline
writing many tables made on the fly - by topic pattern, and by a field of the value (one
partition feeding several tables) - exactly once per table, also when the coordinator dies
after committing some of a round's tables (``tables.table_set``'s fault point)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import ray
import sink_checks
from aiokafka import AIOKafkaProducer
from deltalake import DeltaTable
from fault_points import ray_with_fault_points
from iceberg_reads import load_table

import rayconnect as rc
from rayconnect.actors import names as actor_names
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.kafka.admin import create_topic
from rayconnect.tables.factory import open_committer

CLUSTER = sink_checks.CLUSTER
PARTITIONS = 2
# The coordinator's process dies between the tables of a round while this file exists
# (fault_points.die_between_tables, installed in the module's Ray workers).
FAULT_MARKER = Path(f"/tmp/rayconnect-routes-fault-{os.getpid()}")


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """This module's Ray: the shared fixture's, with the fault points in its workers."""
    with ray_with_fault_points(FAULT_MARKER):
        yield


class Topics:
    """JSON values produced per (topic, partition), in offset order (fresh topics)."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.values: dict[tuple[str, int], list[dict]] = {
            (t, p): [] for t in topics for p in range(PARTITIONS)
        }
        for t in topics:
            asyncio.run(create_topic(bootstrap, t, PARTITIONS))

    def send(self, topic: str, records: list[dict | None], keys: list[dict] | None = None) -> None:
        """``records`` (None: a tombstone) round-robin over the partitions; with ``keys``,
        each keyed, and a key's records all in one partition."""

        async def go() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await producer.start()
            try:
                futures = []
                for i, record in enumerate(records):
                    p = i % PARTITIONS if keys is None else sum(keys[i].values()) % PARTITIONS
                    value = None if record is None else json.dumps(record).encode()
                    key = None if keys is None else json.dumps(keys[i]).encode()
                    futures.append(await producer.send(topic, value, key=key, partition=p))
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
    return open_committer(route, cfg.name, cfg.route_formats()(name)).committed_offsets(None)


class Mirrored:
    """Two upsert routes keyed differently, and the state their tables must end in: one
    keyed by the value's ``id``, one by the record key's ``(order_id, line)`` (tombstones
    delete), with a declared schema and partitions of its own."""

    def __init__(self, topics: Topics, suffix: str = "") -> None:
        """``suffix``: topics of their own (a test run twice on one broker)."""
        self.topics = topics
        self.customers_topic, self.lines_topic = f"crm.customers{suffix}", f"crm.lines{suffix}"
        self.customers: dict[int, str] = {}
        self.lines: dict[tuple[int, int], int] = {}

    @staticmethod
    def topic_names(suffix: str = "") -> list[str]:
        return [f"crm.customers{suffix}", f"crm.lines{suffix}"]

    @property
    def routes(self) -> tuple[rc.Route, ...]:
        return (
            rc.Route(
                "customers", topic=self.customers_topic, write_mode="upsert", key_columns=("id",)
            ),
            rc.Route(
                "order_lines",
                topic=self.lines_topic,
                write_mode="upsert",
                key_schema={"order_id": "long", "line": "long"},
                value_schema={"order_id": "long", "line": "long", "qty": "long"},
                partition_by=("order_id",),
            ),
        )

    def customers_named(self, prefix: str, ids: range) -> None:
        rows = [{"id": i, "name": f"{prefix}{i}"} for i in ids]
        self.topics.send(self.customers_topic, rows)  # (round-robin: keyed by the value's id)
        self.customers.update({r["id"]: r["name"] for r in rows})

    def lines_changed(self, changes: list[tuple[tuple[int, int], int | None]]) -> None:
        """Each ``((order_id, line), qty)`` in order; a None qty deletes the line."""
        keys = [{"order_id": o, "line": n} for (o, n), _ in changes]
        values = [
            None if qty is None else {"order_id": o, "line": n, "qty": qty}
            for (o, n), qty in changes
        ]
        self.topics.send(self.lines_topic, values, keys)
        for key, qty in changes:
            if qty is None:
                self.lines.pop(key, None)
            else:
                self.lines[key] = qty

    def check(self, sink: rc.DeltaSink | rc.IcebergSink) -> None:
        customers = _rows(sink, "customers")
        assert sorted(customers.select("id", "name").rows()) == sorted(self.customers.items())
        lines = _rows(sink, "order_lines")
        assert sorted(lines.select("order_id", "line", "qty").rows()) == sorted(
            (o, n, q) for (o, n), q in self.lines.items()
        )
        assert [_partition_columns(sink, t) for t in ("order_lines", "customers")] == [
            ["order_id"],
            [],
        ]


def _partition_columns(sink: rc.DeltaSink | rc.IcebergSink, name: str) -> list[str]:
    route = sink.route_table(name)
    if isinstance(route, rc.IcebergSink):
        return [f.name for f in load_table(route).spec().fields]
    return DeltaTable(route.path).metadata().partition_columns


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
            # the version its last round committed; the route table's upkeep (OPTIMIZE, its
            # table properties, VACUUM) may have committed after it - never rows
            path = pipeline.config.sink.route_table(name).path
            history = DeltaTable(path).history()
            assert table.version in {h["version"] for h in history}
            later = {h["operation"] for h in history if h["version"] > table.version}
            assert not later & {"WRITE", "MERGE", "CREATE TABLE", "DELETE"}, (name, later)
    extra = status.tables["lake_extra"]
    assert extra.rows_since_start == 25 and extra.last_commit_at is not None


#: a rule's own compaction thresholds: at 2 files, as soon as they are there
EAGER = rc.CompactSettings(min_files=2, every_s=0.0)


def _compacted(tables: list[str]):  # noqa: ANN202 - a wait_for predicate
    """Each of ``tables`` compacted at least once by the pipeline's upkeep."""

    def done(s) -> bool:  # noqa: ANN001
        upkeep = s["upkeep_by_table"]
        return all(t in upkeep and upkeep[t].compactions >= 1 for t in tables)

    return done


def _lag_gauges(pipeline: str) -> dict[str, float]:
    """Table -> the ``rayconnect_table_lag`` the coordinator's process last set."""

    def read(_actor: object) -> dict[str, float]:
        from rayconnect import metrics

        return {
            dict(tags)["table"]: value
            for (metric, tags), value in metrics._gauges.items()
            if metric == "table_lag"
        }

    coordinator = ray.get_actor(actor_names.coordinator(pipeline), namespace=actor_names.NAMESPACE)
    return ray.get(coordinator.__ray_call__.remote(read), timeout=30)


def _until(read, want, timeout_s: float):  # noqa: ANN001, ANN202
    """``read()`` polled every second until it returns ``want`` or ``timeout_s`` passed: the
    last value read."""
    deadline = time.monotonic() + timeout_s
    while (got := read()) != want and time.monotonic() < deadline:
        time.sleep(1.0)
    return got


def _check_compacted(sink: rc.DeltaSink, name: str) -> None:
    """The route table ``name`` was compacted (an OPTIMIZE in its log), and the compaction
    changed no row: the table's rows just before it and just after it are the same."""
    path = sink.route_table(name).path
    history = DeltaTable(path).history()
    optimized = sorted(h["version"] for h in history if h["operation"] == "OPTIMIZE")
    assert optimized, f"{name}: no OPTIMIZE in {[h['operation'] for h in history]}"
    v = optimized[0]
    metrics = next(h for h in history if h["version"] == v)["operationMetrics"]
    assert metrics["numFilesRemoved"] > metrics["numFilesAdded"] >= 1

    def rows(version: int) -> pl.DataFrame:
        df = pl.from_arrow(DeltaTable(path, version=version).to_pyarrow_table())
        return df.select(sorted(df.columns)).sort("_kafka_partition", "_kafka_offset")

    before, after = rows(v - 1), rows(v)
    assert after.height == before.height > 0 and after.equals(before)


@pytest.mark.timeout(420)
async def _aborted_transaction(bootstrap: str, topic: str) -> None:
    """Records into every partition of ``topic`` in a transaction that is aborted."""
    from rayconnect.kafka import clients

    producer = clients.producer(bootstrap, transactional_id=f"abort-{topic}")
    await producer.start()
    try:
        await producer.begin_transaction()
        for p in sorted(await producer.partitions_for(topic)):
            await producer.send(topic, b'{"id": -1}', partition=p)
        await producer.flush()
        await producer.abort_transaction()
    finally:
        await producer.stop()


def test_topic_pattern_and_field_routes_into_delta_tables_made_on_the_fly_through_a_death(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    """Three topics by pattern into three tables, a fourth unrouted, and one topic's
    partitions by ``source.table`` into three more; two more topics into upsert tables of
    their own settings (``Mirrored``); the coordinator dies after committing the first
    table of a round."""
    shop = ["shop.public.users", "shop.public.orders", "shop.public.items"]
    shop_short = ("users", "orders", "items", "extra")
    names = [*shop, "misc", "cdc"]
    topics = Topics(kafka_broker.bootstrap_servers, [*names, *Mirrored.topic_names()])
    cdc_tables = ["c_users", "c_orders", "c_items"]
    for n, t in enumerate(names[:-1]):
        topics.send(t, [{"id": i, "n": n} for i in range(30 + 10 * n)])
    topics.send("cdc", _events(cdc_tables, 0, 60))
    mirrored = Mirrored(topics)
    mirrored.customers_named("a", range(20))
    mirrored.lines_changed([((o, n), 10 * o + n) for o in range(5) for n in range(4)])
    routes = rc.Routes(
        (
            *mirrored.routes,  # (before the field rule: "{value}" can make any name)
            # its tables compact at 2 files (the sink's 64: the field route's never do here)
            rc.Route("lake_{1}", topic_pattern=r"shop\.public\.(.*)", compact=EAGER),
            rc.Route("{value}", field="source.table"),
        )
    )
    sink = rc.DeltaSink(str(tmp_path / "lake"), routes=routes)
    streams = tmp_path / "streams.json"
    _streams_file(streams, kafka_broker.bootstrap_servers, [*names, *Mirrored.topic_names()])
    source = rc.KafkaSource(
        rc.FileMetadataService(str(streams)), value_format="json", discovery_interval_s=0.5
    )
    pipeline = rc.SinkPipeline("routed", source, sink, commit_interval_s=1)
    handle = pipeline.start()
    try:
        handle.wait_for(topics.caught_up(), timeout_s=120)
        before = handle.status()
        # the first rounds committed while Spark started: written in the writer's process
        writer = ray.get_actor(actor_names.writer("routed"), namespace=actor_names.NAMESPACE)
        assert ray.get(writer.stats.remote()).writes_here > 0
        FAULT_MARKER.touch()  # the next round of several tables dies after the first
        for n, t in enumerate(shop):  # rounds into tables that exist now
            topics.send(t, [{"id": i, "n": n, "more": True} for i in range(100, 120)])
        topics.send("cdc", _events(cdc_tables, 60, 90))
        mirrored.customers_named("b", range(10, 30))  # updates and inserts
        mirrored.lines_changed(
            [((o, 0), 100 + o) for o in range(5)]  # updates
            + [((o, 3), None) for o in range(0, 5, 2)]  # deletes
            + [((5, 0), 50), ((5, 1), 51), ((5, 0), 55)]  # inserts, one updated at once
        )
        handle.wait_for(lambda s: not FAULT_MARKER.exists(), timeout_s=60)
        topics.send("cdc", _events(cdc_tables, 150, 30))
        mirrored.lines_changed([((1, 1), None), ((1, 1), 7), ((2, 2), None)])
        # a new topic the pattern takes flows into a new table, without a restart
        extra = Topics(kafka_broker.bootstrap_servers, ["shop.public.extra"])
        extra.send("shop.public.extra", [{"id": i, "n": 9} for i in range(25)])
        topics.values.update(extra.values)
        _streams_file(
            streams,
            kafka_broker.bootstrap_servers,
            [*names, *Mirrored.topic_names(), "shop.public.extra"],
        )
        status = handle.wait_for(topics.caught_up(), timeout_s=120)
        # two more rounds into the shop tables: their files count from the coordinator's
        # restart, and at 2 each is compacted (on the sink's 64 the cdc tables never are)
        for first in (200, 210):
            for n, t in enumerate(shop):
                topics.send(t, [{"id": i, "n": n} for i in range(first, first + 4)])
            status = handle.wait_for(topics.caught_up(), timeout_s=120)
        upkept = handle.wait_for(_compacted([f"lake_{t}" for t in shop_short[:3]]), 120)
        # a topic whose log ends in an aborted transaction: nothing of it reaches a table,
        # and the table holding its partitions moves past it all the same (issue 38: no
        # file holds them - a caught-up table's lag is 0, not the aborted records)
        asyncio.run(_aborted_transaction(kafka_broker.bootstrap_servers, shop[0]))
        # (a record and a marker a partition: the round's offsets move past both)
        aborted = {k: v + 2 for k, v in topics.offsets().items() if f"/{shop[0]}/" in k}
        ends = handle.wait_for(
            lambda s: aborted.items() <= s["offsets"].items()
            and s["tables"]["lake_users"].lag == 0,
            60,
            0.5,
        )
        assert all(t.lag == 0 for t in ends["tables"].values()), ends["tables"]
        # every table's lag gauge, as the coordinator last set it (every 10 s): caught up
        lags = _until(lambda: _lag_gauges("routed"), dict.fromkeys(upkept["tables"], 0), 40)
        assert lags == dict.fromkeys(upkept["tables"], 0)
    finally:
        FAULT_MARKER.unlink(missing_ok=True)
        handle.stop(commit=False)

    assert status["epoch"] > before["epoch"]  # the coordinator did die and came back
    assert status["offsets"] == topics.offsets()
    for short in shop_short[:3]:
        _check_compacted(sink, f"lake_{short}")
    # the field route's tables (the sink's 64 files) have schedules of their own, not due
    cdc_upkeep = {t: u.compactions for t, u in upkept["upkeep_by_table"].items() if t in cdc_tables}
    assert cdc_upkeep and set(cdc_upkeep.values()) == {0}
    for short in shop_short:
        topic = f"shop.public.{short}"
        rows = _rows(sink, f"lake_{short}")
        want = topics.where(lambda t, _, topic=topic: t == topic)
        assert sorted(_coordinates(rows)) == sorted(want)
        assert sorted(rows["id"].to_list()) == sorted(r["id"] for r in want.values())
        if short != "extra":  # a table of its own: its schema has no "more"
            assert rows["more"].sum() == 20
        assert _table_offsets(pipeline, f"lake_{short}") == {
            k: aborted.get(k, v) for k, v in topics.offsets().items() if f"/{topic}/" in k
        }  # (users': past the aborted transaction - a record and a marker a partition)
    _check_field_routed(sink, topics, "cdc", cdc_tables)
    mirrored.check(sink)
    _check_table_status(  # (the last status: after the aborted transaction)
        pipeline, ends, [f"lake_{s}" for s in shop_short] + cdc_tables + ["customers", "order_lines"]
    )
    unrouted = pl.read_delta(str(tmp_path / "lake" / DEAD_LETTER_DIR))
    assert sorted(_coordinates(unrouted)) == sorted(topics.where(lambda t, _: t == "misc"))
    assert set(unrouted["reason"]) == {"no route takes topic 'misc' with source.table=None"}


@pytest.mark.slow  # the Delta test above has field routes and the death too (~4 min here)
@pytest.mark.timeout(600)  # (375 s at a load average of 118 on 2 cores)
@pytest.mark.parametrize("catalog", ["sql", "rest"])
def test_field_routes_into_iceberg_tables_exactly_once_through_a_death_between_tables(
    ray_session, kafka_broker, tmp_path: Path, catalog: str, request
) -> None:
    """As the Delta test's field routes, and its upsert routes of their own settings; in
    the SQL catalog (sqlite), or SeaweedFS's REST catalog: its namespace and tables made on
    the fly in a table bucket."""
    topic = f"cdc-iceberg-{catalog}"
    crm = Mirrored.topic_names(f"-{catalog}")
    topics = Topics(kafka_broker.bootstrap_servers, [topic, *crm])
    tables = ["users", "orders", "items"]
    topics.send(topic, _events(tables, 0, 60))
    mirrored = Mirrored(topics, f"-{catalog}")
    mirrored.customers_named("a", range(20))
    mirrored.lines_changed([((o, n), 10 * o + n) for o in range(5) for n in range(4)])
    routes = rc.Routes((*mirrored.routes, rc.Route("{value}", field="source.table")))
    sink = rc.IcebergSink("shop.cdc", warehouse=str(tmp_path / "wh"), routes=routes)
    if catalog == "rest":
        s3 = request.getfixturevalue("embedded_s3")
        sink = rc.IcebergSink(
            f"{request.getfixturevalue('rest_namespace')}.cdc",
            rest_catalog=request.getfixturevalue("rest_catalog"),
            storage_options=s3.storage_options,
            routes=routes,
        )
    pipeline = rc.SinkPipeline(
        f"field-iceberg-{catalog}",
        rc.KafkaSource(
            sink_checks.static_meta(kafka_broker.bootstrap_servers, [topic, *crm]),
            value_format="json",
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
        mirrored.customers_named("b", range(10, 30))
        mirrored.lines_changed([((o, 0), 100 + o) for o in range(5)] + [((1, 3), None)])
        handle.wait_for(lambda s: not FAULT_MARKER.exists(), timeout_s=60)
        topics.send(topic, _events(tables, 150, 30))
        mirrored.lines_changed([((2, 2), None), ((6, 0), 60)])
        status = handle.wait_for(topics.caught_up(), timeout_s=180)
    finally:
        FAULT_MARKER.unlink(missing_ok=True)
        handle.stop(commit=False)

    assert status["epoch"] > before["epoch"]
    assert status["offsets"] == topics.offsets()
    _check_field_routed(sink, topics, topic, tables)
    mirrored.check(sink)
