"""Per-route table settings (``config.routes``): each rule's tables get their own format,
key and write mode, partitions and declared schema; what a rule leaves unset is the
sink's. Checked before start: a ``ConfigError`` names the rule and the setting. Pure."""

from __future__ import annotations

import msgspec
import pytest

import rayconnect as rc
from rayconnect.config.routes import Route, Routes
from rayconnect.config.sink import DeltaSink, IcebergSink, SinkPipelineConfig
from rayconnect.formats.route_split import Routed

META = rc.StaticMetadataService(
    streams=(rc.KafkaStream("s", {"c": rc.ClusterMetadata("b:9092", ("a",))}),)
)


def _config(*rules: Route, source: dict | None = None, **sink: object) -> SinkPipelineConfig:
    settings = {"value_format": "json", **(source or {})}
    return SinkPipelineConfig(
        name="p",
        source=rc.KafkaSource(META, **settings),
        sink=DeltaSink("/lake", routes=Routes(rules), **sink),
    )


def test_each_rule_gives_its_tables_their_own_settings_and_inherits_the_rest() -> None:
    cfg = _config(
        Route("users", topic="db.users", write_mode="upsert", key_columns=("id",)),
        Route(
            "lines",
            topic="db.lines",
            write_mode="upsert",
            value_schema={"order_id": "long", "line": "long", "qty": "long"},
            key_columns=("order_id", "line"),
            partition_by=("order_id",),
        ),
        Route("ev_{1}", topic_pattern=r"events\.(.*)"),
        source={"envelope": "none"},
        partition_by=("_kafka_partition",),
    )
    formats = cfg.route_formats()
    users, lines, events = formats("users"), formats("lines"), formats("ev_click")
    assert (users.upsert_keys, users.value_schema, users.partition_by) == (
        ("id",),
        None,
        ("_kafka_partition",),
    )
    assert (lines.upsert_keys, lines.partition_by) == (("order_id", "line"), ("order_id",))
    assert lines.value_schema == {"order_id": "long", "line": "long", "qty": "long"}
    assert events == cfg.record_format()  # no settings: the sink's
    assert formats("no_rule_makes_this") == cfg.record_format()
    # the formats travel to the writer's Spark tasks and back
    assert (
        msgspec.msgpack.decode(msgspec.msgpack.encode(formats), type=type(formats)).by_rule
        == formats.by_rule
    )


def test_an_upsert_sinks_routes_may_append_and_key_by_the_record_keys_fields() -> None:
    cfg = _config(
        Route("log", topic="log", write_mode="append"),
        Route("keyed", topic="k", key_schema={"order_id": "long", "line": "long"}),
        Route("rest", topic_pattern=".*"),
        source={"key_format": "json", "key_schema": {"id": "long"}, "include_key": True},
        write_mode="upsert",
    )
    formats = cfg.route_formats()
    assert formats("log").upsert_keys == ()  # the sink's key is not inherited by append
    assert formats("keyed").upsert_keys == ("order_id", "line")  # the rule's record key
    assert formats("rest").upsert_keys == ("id",)  # the sink's: the source's record key
    assert formats("keyed").key_schema == {"order_id": "long", "line": "long"}


def test_a_value_format_of_its_own_does_not_take_the_sources_declared_columns() -> None:
    cfg = _config(
        Route("texts", topic="t", value_format="string"),
        source={"value_schema": {"id": "long"}},
    )
    assert (
        cfg.route_formats()("texts").value_format,
        cfg.route_formats()("texts").value_schema,
    ) == (
        "string",
        None,
    )


@pytest.mark.parametrize(
    "rule,sink,error",
    [
        (
            Route("t", topic="a", write_mode="upsert"),
            {},
            r"sink\.routes\.rules\[1\] \(table 't'\): sink\.write_mode upsert needs "
            r"sink\.key_columns",
        ),
        (
            Route("t", topic="a", key_columns=("id",)),
            {},
            r"rules\[1\] \(table 't'\): sink\.key_columns are for write_mode upsert",
        ),
        (
            Route("t", topic="a", value_schema={"id": "long"}, partition_by=("day",)),
            {},
            r"rules\[1\] \(table 't'\): sink\.partition_by: 'day': no column 'day'",
        ),
        (
            Route("t", topic="a", envelope="debezium"),
            {},
            r"rules\[1\] \(table 't'\): source\.envelope debezium needs sink\.write_mode upsert",
        ),
        (
            Route("t", topic="a", write_mode="append"),
            {"write_mode": "upsert", "key_columns": ("id",), "partition_by": ()},
            None,
        ),
        (
            Route(
                "t",
                topic="a",
                write_mode="upsert",
                value_schema={"id": "long"},
                key_columns=("order_id",),
            ),
            {},
            r"rules\[1\] \(table 't'\): sink\.key_columns: \['order_id'\] are in neither",
        ),
        (
            Route("t", topic="a", value_format="raw", partition_by=("x",)),
            {},
            r"rules\[1\] \(table 't'\): sink\.partition_by needs a typed",
        ),
    ],
)
def test_a_rules_bad_setting_is_a_config_error_naming_the_rule_and_setting(
    rule: Route, sink: dict, error: str | None
) -> None:
    if error is None:
        _config(rule, **sink)
        return
    with pytest.raises(rc.ConfigError, match=error):
        _config(Route("first", topic="first"), rule, **sink)


def test_the_rules_index_is_named_and_the_setting_checked_in_a_pipeline_file() -> None:
    doc = {
        "type": "delta",
        "path": "/lake",
        "routes": {
            "rules": [
                {"topic": "a", "table": "a"},
                {"topic": "b", "table": "b", "write_mode": "upsert"},
            ]
        },
    }
    sink = msgspec.convert(doc, DeltaSink)
    with pytest.raises(rc.ConfigError, match=r"sink\.routes\.rules\[1\] \(table 'b'\)"):
        SinkPipelineConfig("p", rc.KafkaSource(META, value_format="json"), sink)
    with pytest.raises(msgspec.ValidationError, match="write_mode"):
        msgspec.convert(
            {**doc, "routes": {"rules": [{"topic": "a", "table": "a", "write_mode": "merge"}]}},
            DeltaSink,
        )


def test_a_tables_settings_are_the_first_rule_that_can_make_its_name() -> None:
    routes = Routes(
        (
            Route("lake_{1}", topic_pattern=r"db\.(.*)", write_mode="upsert", key_columns=("id",)),
            Route("lake_orders", topic="orders"),
            Route("lake_{value}", field="kind", write_mode="upsert", key_columns=("id",)),
            Route("other_{topic}", topic="x"),
        )
    )
    assert [routes.rule_of(n) for n in ("lake_a", "lake_orders", "other_x", "other_y")] == [
        0,
        0,
        3,
        None,
    ]
    # rule 1 would make a table whose settings are rule 0's: its records are unrouted
    assert routes.route("orders") == Routed(
        None,
        "route 'lake_orders' makes table 'lake_orders', which the earlier route 'lake_{1}' "
        "can make too, with other settings",
    )
    # the same settings: fine
    assert routes.route("events", {"kind": "click"}) == Routed("lake_click")
    assert routes.route("db.users") == Routed("lake_users")


def test_iceberg_route_tables_keep_their_partition_values_in_files() -> None:
    cfg = SinkPipelineConfig(
        "p",
        rc.KafkaSource(META, value_format="json", value_schema={"id": "long", "ts": "timestamp"}),
        IcebergSink(
            "ns.own",
            warehouse="/wh",
            routes=Routes((Route("t", topic="a", partition_by=("d=day(ts)",)),)),
        ),
    )
    fmt = cfg.route_formats()("t")
    assert (fmt.partition_by, fmt.partition_values_in_files) == (("d=day(ts)",), True)


def test_a_rules_compact_and_log_are_its_delta_tables_upkeep_thresholds() -> None:
    """A rule's ``compact``/``log`` (from a pipeline file's mapping too) are its tables';
    other rules' tables keep the sink's."""
    rule = msgspec.convert(
        {
            "table": "lake_{1}",
            "topic_pattern": r"shop\.public\.(.*)",
            "compact": {"min_files": 16, "every_s": 600},
            "log": {"tidy_every_s": 60, "log_retention_hours": 1},
        },
        Route,
    )
    sink = DeltaSink("/lake", routes=Routes((rule, Route("{value}", field="source.table"))))
    shop, other = sink.route_table("lake_a"), sink.route_table("c_users")
    assert (shop.compact.min_files, shop.compact.every_s, shop.log.tidy_every_s) == (16, 600, 60)
    assert (other.compact, other.log) == (sink.compact, sink.log)
    assert shop.routes is None and shop.path == "/lake/lake_a"


def test_truncate_applies_by_default_and_a_rule_may_dead_letter_it() -> None:
    cfg = _config(
        Route("kept", topic="a", truncate="dead_letter"),
        Route("rest", topic_pattern=".*"),
        source={"key_format": "json", "key_schema": {"id": "long"}, "include_key": True,
                "envelope": "debezium"},
        write_mode="upsert",
    )  # fmt: skip
    formats = cfg.route_formats()
    assert (formats("kept").truncate, formats("rest").truncate) == ("dead_letter", "apply")
    sink = msgspec.structs.replace(cfg.sink, truncate="dead_letter")
    assert msgspec.structs.replace(cfg, sink=sink).route_formats()("rest").truncate == (
        "dead_letter"
    )


def test_a_table_whose_rule_gives_no_key_takes_the_key_published_for_its_topic() -> None:
    """``published_keys`` (``rayconnect.route_keys``): a table made by a rule without a
    ``key_schema`` of its own is keyed by its topic's published key; a rule's own key, an
    append table and a topic no rule takes are left as they are."""

    def config(published: bool) -> SinkPipelineConfig:
        return SinkPipelineConfig(
            name="p",
            source=rc.KafkaSource(
                META, value_format="json", key_format="json", key_schema={"id": "long"},
                include_key=True,
            ),
            sink=DeltaSink(
                "/lake",
                routes=Routes(
                    (
                        Route("own", topic="db.own", key_schema={"k": "string"}),
                        Route("log", topic="db.log", write_mode="append"),
                        Route("{1}", topic_pattern=r"db\.(\w+)"),
                    ),
                    published_keys=published,
                ),
                write_mode="upsert",
            ),
        )  # fmt: skip

    published = {
        "db.later": {"region": "string", "n": "int"},
        "db.own": {"x": "long"},
        "db.log": {"x": "long"},
        "elsewhere.t": {"x": "long"},
    }
    formats = config(True).route_formats().with_published(published)
    later = formats("later")
    assert (later.upsert_keys, later.key_schema) == (("region", "n"), published["db.later"])
    assert formats("own").upsert_keys == ("k",)
    assert formats("log").upsert_keys == ()
    assert formats("other").upsert_keys == ("id",)  # nothing published: the rule's
    assert set(formats.keys) == {"later"}
    # the keys travel to the writer's Spark tasks with the formats
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(formats), type=type(formats)) == formats
    plain = config(False).route_formats()
    assert plain.with_published(published) is plain
