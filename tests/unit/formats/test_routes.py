"""Routes: which table a record goes to (``config.routes``) and a raw block split by
table (``formats.route_split``) - pure, no IO."""

from __future__ import annotations

import json
import re

import msgspec
import pyarrow as pa
import pytest

import rayconnect as rc
from rayconnect.config.routes import Route, Routes
from rayconnect.config.sink import DeltaSink, IcebergSink, SinkPipelineConfig
from rayconnect.formats.route_split import Routed, field_reader, split_block
from rayconnect.schema import RAW_RECORD_SCHEMA


def _raw(rows: list[tuple[str, int, bytes | None]]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "cluster": "c",
                "topic": topic,
                "partition": 0,
                "offset": offset,
                "timestamp": 0,
                "key": None,
                "value": value,
                "headers": [],
            }
            for topic, offset, value in rows
        ],
        schema=RAW_RECORD_SCHEMA,
    )


def test_static_pattern_and_field_rules_in_order() -> None:
    routes = Routes(
        rules=(
            Route("all_orders", topic="orders"),
            Route("lake_{1}", topic_pattern=r"db\.public\.(.*)"),
            Route("ev_{value}", field="type"),
        )
    )
    assert routes.route("orders") == Routed("all_orders")
    assert routes.route("db.public.users") == Routed("lake_users")
    assert routes.route("events", {"type": "click"}) == Routed("ev_click")
    assert routes.route("events", {"type": None}) == Routed(
        None, "no route takes topic 'events' with type=None"
    )
    # a pattern that makes a bad name leaves the record unrouted, saying why
    bad = routes.route("db.public.a-b")
    assert bad.table is None and "'lake_a-b' is not letters" in bad.reason


@pytest.mark.parametrize(
    "fields,error",
    [
        ({"table": "t"}, "exactly one of topic, topic_pattern, field"),
        ({"table": "t", "topic": "a", "field": "f"}, "exactly one of"),
        ({"table": "t_{2}", "topic_pattern": "a(.*)"}, "uses ['2']"),
        ({"table": "t_{value}", "topic": "a"}, "uses ['value']"),
        ({"table": "_t", "topic": "a"}, "not starting with '_'"),
        ({"table": "staging", "topic": "a"}, "reserved"),
        ({"table": "t", "topic_pattern": "a("}, "topic_pattern 'a('"),
        ({"table": "t", "field": "a..b"}, "empty part"),
    ],
)
def test_a_bad_rule_is_a_config_error_naming_it(fields: dict, error: str) -> None:
    with pytest.raises(rc.ConfigError, match=re.escape(error)):
        Route(**fields)


def test_routes_come_from_a_pipeline_file_and_need_a_rule() -> None:
    sink = msgspec.convert(
        {
            "type": "delta",
            "path": "/tmp/lake",
            "routes": {
                "rules": [{"topic_pattern": "orders\\.(.*)", "table": "o_{1}"}],
                "unrouted": "stop",
            },
        },
        DeltaSink | IcebergSink,
    )
    assert sink.routes == Routes((Route("o_{1}", topic_pattern="orders\\.(.*)"),), "stop")
    with pytest.raises(rc.ConfigError, match="routes.rules is empty"):
        Routes(rules=())


def test_route_tables_live_beside_the_sinks_own() -> None:
    delta = DeltaSink("/lake", routes=Routes((Route("t", topic="a"),)))
    assert delta.route_table("users") == DeltaSink("/lake/users")
    ice = IcebergSink("db.pipe", warehouse="/wh", routes=Routes((Route("t", topic="a"),)))
    assert ice.route_table("users") == IcebergSink("db.users", warehouse="/wh")
    assert ice.route_table("users").location().uri == "/wh/db/users"
    placed = IcebergSink("db.pipe", warehouse="/wh", table_location="/data/p")
    assert placed.route_table("u").table_location == "/data/p/u"


def test_routes_with_a_transform_are_refused() -> None:
    meta = rc.StaticMetadataService(
        streams=(rc.KafkaStream("s", {"c": rc.ClusterMetadata("b:9092", ("a",))}),)
    )
    with pytest.raises(rc.ConfigError, match="routes with a transform"):
        SinkPipelineConfig(
            name="p",
            source=rc.KafkaSource(meta, value_format="json"),
            sink=DeltaSink("/lake", routes=Routes((Route("t", topic="a"),))),
            transform="SELECT * FROM records",
        )


def test_a_block_splits_by_topic_keeping_order_and_dead_letters_the_rest() -> None:
    routes = Routes((Route("t_{1}", topic_pattern="db\\.(.*)"),))
    raw = _raw([("db.a", 0, b"1"), ("db.b", 1, b"2"), ("x", 2, b"3"), ("db.a", 3, b"4")])
    block = split_block(raw, routes)
    assert {n: t.column("offset").to_pylist() for n, t in block.tables.items()} == {
        "t_a": [0, 3],
        "t_b": [1],
    }
    assert block.unrouted is not None
    assert block.unrouted.column("_kafka_offset").to_pylist() == [2]
    assert block.unrouted.column("reason").to_pylist() == ["no route takes topic 'x'"]
    assert block.first_unrouted == (2, "no route takes topic 'x'")


def test_a_block_splits_by_a_debezium_events_source_table() -> None:
    def event(table: str, wrapped: bool = False) -> bytes:
        body = {"op": "c", "after": {"id": 1}, "source": {"db": "shop", "table": table}}
        return json.dumps({"schema": {}, "payload": body} if wrapped else body).encode()

    routes = Routes((Route("lake_{value}", field="source.table"),), unrouted="dead_letter")
    raw = _raw(
        [
            ("cdc", 0, event("users")),
            ("cdc", 1, event("orders", wrapped=True)),
            ("cdc", 2, b"not json"),
            ("cdc", 3, event("users")),
            ("cdc", 4, None),
        ]
    )
    block = split_block(raw, routes)
    assert {n: t.column("offset").to_pylist() for n, t in block.tables.items()} == {
        "lake_users": [0, 3],
        "lake_orders": [1],
    }
    assert block.unrouted is not None
    assert block.unrouted.column("_kafka_offset").to_pylist() == [2, 4]


def test_a_field_reader_takes_text_and_numbers_only() -> None:
    read = field_reader("a.b")
    assert read(b'{"a": {"b": "x", "c": [1, 2]}, "z": {}}') == "x"
    assert read(b'{"a": {"b": 7}}') == "7"
    assert read(b'{"a": {"b": {"deep": 1}}}') is None
    assert read(b'{"a": null}') is None
    assert read(b'{"a": 3}') is None
    assert read(b"[1]") is None
