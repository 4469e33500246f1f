"""A database mirror's config (``config.mirror``): the two pipelines it stands for, derived
purely, and every bad setting refused with a clear error - no IO, no Ray."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

import rayconnect as rc
from rayconnect.cli import main
from rayconnect.cli.pipeline_file import PipelineFileError, load_pipeline_file, loads_pipeline
from rayconnect.config.mirror import MirrorConfig
from rayconnect.config.sink import DeltaSink, IcebergSink
from rayconnect.config.source import PostgresTask

URL = "postgresql://cdc@db.internal:5432/shop"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "shop-mirror.yaml"


def _config(**fields: object) -> MirrorConfig:
    return MirrorConfig(**{"name": "shop-mirror", "database": URL, "to": "/data/lake", **fields})


def test_names_are_derived_from_the_mirror_name() -> None:
    c = _config()
    source = c.source_config(["customers", "sales.orders"])
    task = source.task
    assert isinstance(task, PostgresTask)
    assert (source.name, task.slot, task.publication_name) == (
        "shop-mirror-source",
        "shop_mirror",
        "shop_mirror_pub",
    )
    assert task.own_publication and task.dsn == URL
    assert task.topics() == ("shop-mirror.public.customers", "shop-mirror.sales.orders")
    assert (source.transaction_boundary, source.exactly_once) == ("connector", "required")
    # a publication named by the user is the user's: not dropped with the slot
    theirs = _config(publication="shop_all").source_config([]).task
    assert isinstance(theirs, PostgresTask) and not theirs.own_publication


def test_the_sink_routes_each_topic_to_its_upsert_table() -> None:
    sink = _config(topic_prefix="shop").sink_config()
    assert sink.name == "shop-mirror"
    assert isinstance(sink.sink, DeltaSink)
    assert (sink.sink.path, sink.sink.write_mode, sink.sink.key_columns) == (
        "/data/lake",
        "upsert",
        ("id",),
    )
    routes = sink.sink.routes
    assert routes is not None

    def table_for(topic: str) -> str | None:
        return next(filter(None, (rule.table_for(topic) for rule in routes.rules)), None)

    assert table_for("shop.public.orders") == "orders"
    assert table_for("shop.sales.orders") == "sales_orders"
    assert table_for("other.public.orders") is None
    meta = sink.source.metadata
    assert re.fullmatch(meta.topic_pattern or "", "shop.public.orders")
    assert not re.fullmatch(meta.topic_pattern or "", "rayconnect-offsets-shop-mirror-source")
    assert (sink.source.envelope, sink.source.key_schema) == ("debezium", {"id": "long"})
    assert sink.source.metadata.bootstrap_servers == "127.0.0.1:9092"
    assert (
        _config(kafka="k:9092").with_kafka("b:1").sink_config().source.metadata.bootstrap_servers
        == "b:1"
    )


def test_iceberg_tables_in_a_namespace_of_the_prefix() -> None:
    sink = _config(format="iceberg", upsert_mode="copy_on_write").sink_config().sink
    assert isinstance(sink, IcebergSink)
    assert sink.route_table("orders").table == "shop_mirror.orders"
    assert sink.upsert_mode == "copy_on_write"


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"database": "mysql://cdc@db/shop"}, "database: expected postgresql://"),
        ({"database": "db.internal:5432"}, "database: expected postgresql://"),
        ({"database": "postgresql://cdc@db:5432"}, "database: the URL names no database"),
        ({"database": "postgresql://cdc@db:5432/"}, "database: the URL names no database"),
        ({"tables": ["a.b.c"]}, "tables: 'a.b.c' is not 'schema.table'"),
        ({"tables": ["public."]}, "tables: 'public.' is not"),
        ({"slot": "Bad-Slot"}, "slot: 'Bad-Slot' is no replication slot name"),
        ({"name": "a/b"}, "name: invalid mirror name"),
        ({"to": ""}, "to: say where the tables go"),
        ({"kafka": " "}, "kafka: empty"),
        ({"catalog": {"uri": "x"}}, "catalog, rest_catalog: for format: iceberg only"),
        ({"password_env": "PW", "password_file": "/pw"}, "password_env, password_file"),
        ({"key_schema": {}}, "key_schema: name the key column"),
    ],
)
def test_bad_settings_are_refused_before_anything_starts(fields: dict, error: str) -> None:
    with pytest.raises(rc.ConfigError, match=re.escape(error)):
        _config(**fields)


def test_a_password_in_the_url_is_refused_and_never_repeated() -> None:
    with pytest.raises(rc.ConfigError) as e:
        _config(database="postgresql://cdc:s3cret@db/shop")
    assert "password" in str(e.value) and "s3cret" not in str(e.value)


def test_an_unknown_keyword_names_the_closest() -> None:
    with pytest.raises(rc.ConfigError, match="did you mean 'tables'"):
        rc.Mirror("m", URL, to="/lake", tabels=["a"])


def test_a_mirror_file_is_checked_like_any_pipeline_file() -> None:
    text = f"kind: mirror\nname: m\ndatabase: {URL}\nto: /lake\npartitons: 3\n"
    with pytest.raises(
        PipelineFileError, match=r"m.yaml:5: \$.partitons: .*did you mean 'partitions'"
    ):
        loads_pipeline(text, "m.yaml")
    bad = f"kind: mirror\nname: m\ndatabase: {URL}\nto: /lake\ntables: [x.y.z]\n"
    with pytest.raises(PipelineFileError, match=r"tables: 'x.y.z'"):
        loads_pipeline(bad, "m.yaml")


def test_the_example_file_loads() -> None:
    config = load_pipeline_file(EXAMPLE, env={})
    assert isinstance(config, MirrorConfig)
    assert config.sink_config().name == config.name


def test_the_command_refuses_a_bad_url_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mirror", "mysql://x@y/z", "--to", "/tmp/lake"]) == 2
    assert "database: expected postgresql://" in capsys.readouterr().err
    # an embedded broker lives in the command: it cannot detach
    assert main(["mirror", URL, "--to", "/tmp/lake", "--detach"]) == 2
    assert "--detach needs a Kafka" in capsys.readouterr().err


def test_each_table_is_keyed_by_its_own_primary_key() -> None:
    """``table_keys`` (read at start): a rule of its own per table, before the patterns."""
    from rayconnect.config.mirror import MirrorConfig, lake_table

    config = MirrorConfig(
        name="shop",
        database="postgresql://cdc@db:5432/shop",
        to="/lake",
        table_keys={"public.lines": {"order_id": "int", "line": "int"}, "sales.q": {"k": "long"}},
    )
    sink = config.sink_config()
    rules = sink.sink.routes.rules
    own = [(r.topic, r.table, r.key_columns, r.key_schema) for r in rules[:2]]
    assert own == [
        ("shop.public.lines", "lines", ("order_id", "line"), {"order_id": "int", "line": "int"}),
        ("shop.sales.q", "sales_q", ("k",), {"k": "long"}),
    ]
    assert [r.topic_pattern is not None for r in rules[2:]] == [True, True]
    assert sink.record_format(rules[0]).upsert_keys == ("order_id", "line")
    assert lake_table("public.t") == "t" and lake_table("s.t") == "s_t"


def test_a_table_found_later_is_keyed_by_the_key_its_source_publishes() -> None:
    """A whole-schema mirror's publication takes tables created later (``schemas``); its
    source publishes each table's key for the sink (``route_keys_for``), whose pattern rules
    key a table by its topic's published key - a table of ``table_keys`` keeps its rule."""
    config = MirrorConfig(
        name="shop",
        database="postgresql://cdc@db:5432/shop",
        to="/lake",
        table_keys={"public.lines": {"order_id": "int", "line": "int"}},
    )
    task = config.source_config(["public.lines"]).task
    assert isinstance(task, PostgresTask)
    assert (task.schemas, task.route_keys_for) == (["public"], "shop")
    named = MirrorConfig(name="shop", database=config.database, to="/lake", tables=["a"])
    assert named.source_config(["a"]).task.schemas == []  # type: ignore[union-attr]
    formats = (
        config.sink_config()
        .route_formats()
        .with_published(
            {
                "shop.public.added": {"region": "string", "n": "int"},
                "shop.sales.later": {"k": "decimal(10,2)"},
                "shop.public.lines": {"other": "long"},  # its own rule's key wins
            }
        )
    )
    added = formats("added")
    assert added.upsert_keys == ("region", "n")
    assert added.key_schema == {"region": "string", "n": "int"}
    assert formats("sales_later").upsert_keys == ("k",)
    assert formats("lines").upsert_keys == ("order_id", "line")
    assert formats("unpublished").upsert_keys == ("id",)  # nothing published: the fallback
    shared = MirrorConfig(
        name="shop", database=config.database, to="/lake", key_schema={"id": "long"}
    )
    assert shared.source_config(["a"]).task.route_keys_for is None  # type: ignore[union-attr]
    plain = shared.sink_config().route_formats()
    assert plain.with_published({"shop.public.added": {"region": "string"}}) is plain


def test_the_read_back_command_of_an_iceberg_mirror_opens_its_embedded_catalog() -> None:
    """The printed command names the catalog as the sink opens it (a SQL catalog keeps its
    tables under its name: another name finds none) and the mirror's namespace."""
    from rayconnect.cli.mirror import read_back_lines
    from rayconnect.pipelines.mirror import MirrorRecord

    record = MirrorRecord("m", "m-source", "m", "/lake", "iceberg", True, "shop")
    lines = read_back_lines(record, ["orders", "users"])
    assert "load_catalog('rayconnect', **{'type': 'sql'" in lines[1]
    assert "'uri': 'sqlite:////lake/catalog.db'" in lines[1]
    assert "c.load_table('shop.orders')" in lines[1]
    theirs = MirrorRecord("m", "m-source", "m", "/lake", "iceberg", False, None)
    assert "your Iceberg catalog" in read_back_lines(theirs, [])[0]


def test_the_live_lines_name_the_tables_not_mirrored() -> None:
    """A table the source found but does not capture (no primary key) is named under the
    tables, with why, until it is captured."""
    from rayconnect.cli.mirror import mirror_lines
    from rayconnect.pipelines.mirror import MirrorStatus
    from rayconnect.protocol.source_status import SourcePipelineStatus, SourceTaskReport

    why = "public.loose is not captured: it has no primary key, and sink pipeline m keeps..."
    task = SourceTaskReport(
        task=0,
        state="polling",
        records_committed=5,
        source={"tables_refused": {"public.loose": why}},
    )
    source = SourcePipelineStatus(pipeline="m-source", tasks={0: task})
    lines = mirror_lines(MirrorStatus(name="m", source=source, sink=None))
    assert lines[-1] == f"  not mirrored: {why}"
    healthy = msgspec.structs.replace(task, source={"tables_refused": {}})
    lines = mirror_lines(MirrorStatus(name="m", source=msgspec.structs.replace(
        source, tasks={0: healthy}), sink=None))  # fmt: skip
    assert not any("not mirrored" in line for line in lines)
