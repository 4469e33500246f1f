"""Pipeline files: every example decodes; every error names file, line, path and expectation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import rayconnect as rc
from rayconnect.cli.pipeline_file import PipelineFileError, load_pipeline_file, loads_pipeline
from rayconnect.config.mirror import MirrorConfig
from rayconnect.config.sink import SinkPipelineConfig
from rayconnect.config.source import (
    DeltaTask,
    FilesTask,
    GeneratorTask,
    PythonTask,
    SourcePipelineConfig,
)
from rayconnect.errors import ConfigError

pytestmark = [pytest.mark.timeout(30)]

EXAMPLES = sorted((Path(__file__).parents[3] / "examples").glob("*.yaml"))
EXAMPLE_ENV = {
    "KAFKA_EAST": "east:9093",
    "KAFKA_WEST": "west:9093",
    "KAFKA_USER": "rayconnect",
    "KAFKA_PASSWORD": "s3cr3t-pw",
}

GOOD = """\
kind: sink
name: orders
source:
  metadata:
    streams:
      - stream_id: orders
        clusters:
          local:
            bootstrap_servers: "127.0.0.1:9092"
            topics: [orders]
  starting_offsets: earliest
sink: {path: /data/orders}
commit: {commit_interval_s: 5}
"""


def test_there_are_examples():
    assert any(p.name == "orders-sink.yaml" for p in EXAMPLES)
    assert any(p.name == "numbers-source.yaml" for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_decodes(path):
    config = load_pipeline_file(path, env=EXAMPLE_ENV)
    assert isinstance(config, SinkPipelineConfig | SourcePipelineConfig | MirrorConfig)
    assert "s3cr3t-pw" not in repr(config)


def test_file_and_python_api_build_the_same_config():
    config = loads_pipeline(GOOD, env={})
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("orders", {"local": rc.ClusterMetadata("127.0.0.1:9092", ("orders",))}),)
    )
    api = rc.SinkPipeline(
        "orders", rc.KafkaSource(meta), rc.DeltaSink("/data/orders"), commit_interval_s=5
    )
    assert config == api.config


def _error(text: str, env=None) -> PipelineFileError:
    with pytest.raises(PipelineFileError) as info:
        loads_pipeline(textwrap.dedent(text), "p.yaml", env or {})
    assert isinstance(info.value, ConfigError)
    return info.value


def test_wrong_type_names_file_line_path_and_expectation():
    e = _error(GOOD.replace("commit_interval_s: 5", "commit_interval_s: soon"))
    assert e.file == "p.yaml" and e.path == "$.commit.commit_interval_s" and e.line == 13
    assert "expected `float`, got `str`" in str(e)
    assert str(e).startswith("p.yaml:13: $.commit.commit_interval_s: ")


def test_bad_value_inside_a_dict_names_the_key():
    e = _error(GOOD.replace('"127.0.0.1:9092"', "9092"))
    assert e.path == "$.source.metadata.streams[0].clusters.local.bootstrap_servers"
    assert e.line == 9


def test_unknown_field_suggests_the_closest_name():
    e = _error(GOOD.replace("commit_interval_s: 5", "comit_interval_s: 5"))
    assert e.path == "$.commit.comit_interval_s"
    assert "did you mean 'commit_interval_s'" in e.message


def test_missing_field_and_failed_check():
    assert "missing required field `sink`" in str(
        _error(GOOD.replace("sink: {path: /data/orders}\n", ""))
    )
    e = _error(GOOD.replace("commit_interval_s: 5", "commit_interval_s: -1"))
    assert e.path == "$.commit" and "commit_interval_s must be > 0" in e.message
    e = _error(GOOD.replace("topics: [orders]", "topics: [a/b]"))
    assert e.path == "$.source.metadata" and "invalid topic 'a/b'" in e.message
    e = _error(GOOD.replace("starting_offsets: earliest", "starting_offsets: middle"))
    assert e.path == "$.source.starting_offsets"


def test_iceberg_sink_decodes_and_its_errors_name_the_field():
    config = loads_pipeline(
        GOOD.replace(
            "sink: {path: /data/orders}",
            "sink: {type: iceberg, table: db.orders, warehouse: /data/lake}",
        ),
        env={},
    )
    assert config.sink == rc.IcebergSink("db.orders", warehouse="/data/lake")
    assert config.sink.location().uri == "/data/lake/db/orders"
    assert config.sink.catalog_properties() == {
        "type": "sql",
        "uri": "sqlite:////data/lake/catalog.db",
        "warehouse": "/data/lake",
    }
    e = _error(GOOD.replace("sink: {path: /data/orders}", "sink: {type: iceberg, table: t}"))
    assert e.path == "$.sink" and "sink.table 't' must be 'namespace.name'" in e.message
    e = _error(GOOD.replace("sink: {path: /data/orders}", "sink: {type: iceberg, table: d.t}"))
    assert "sink.warehouse is empty" in e.message
    e = _error(GOOD.replace("{path: /data/orders}", "{type: iceberg, table: d.t, warehous: /x}"))
    assert e.path == "$.sink.warehous" and "did you mean 'warehouse'" in e.message
    e = _error(GOOD.replace("sink: {path: /data/orders}", "sink: {type: hudi, path: /x}"))
    assert e.path == "$.sink.type" and "delta, iceberg" in e.message


def test_kind_and_metadata_type():
    assert "missing; expected one of: mirror, sink, source" in str(_error(GOOD.replace("kind: sink\n", "")))
    assert _error(GOOD.replace("kind: sink", "kind: sideways")).path == "$.kind"
    # type: static is the default, and may be written
    loads_pipeline(GOOD.replace("    streams:", "    type: static\n    streams:", 1), env={})
    e = _error(GOOD.replace("    streams:", "    type: kafka-rest\n    streams:", 1))
    assert e.path == "$.source.metadata.type"
    assert "expected one of: static, file, single_cluster (default static)" in e.message
    # another service: its own fields, and the static one's are refused
    e = _error(GOOD.replace("    streams:", "    type: file\n    streams:", 1))
    assert e.path == "$.source.metadata.streams" and "expected one of: path" in e.message
    from rayconnect.metadata import FileMetadataService, SingleClusterMetadataService

    file_meta = "source:\n  metadata: {type: file, path: /etc/streams.yaml}\n"
    config = loads_pipeline("kind: sink\nname: f\n" + file_meta + "sink: {path: /t}\n", env={})
    assert isinstance(config.source.metadata, FileMetadataService)
    single = "source:\n  metadata: {type: single_cluster, bootstrap_servers: 'h:9092'}\n"
    config = loads_pipeline("kind: sink\nname: s\n" + single + "sink: {path: /t}\n", env={})
    assert isinstance(config.source.metadata, SingleClusterMetadataService)


def test_not_yaml_and_not_a_mapping(tmp_path):
    assert "not valid YAML" in str(_error("kind: [sink\n"))
    assert "expected a mapping" in str(_error("- a\n- b\n"))
    with pytest.raises(PipelineFileError, match="cannot read the file"):
        load_pipeline_file(tmp_path / "missing.yaml")


def test_environment_interpolation_and_secrets_stay_out_of_errors():
    text = GOOD.replace(
        "topics: [orders]",
        "topics: [orders]\n            properties:\n"
        "              sasl.plain.password: ${PW}\n"
        "              metadata.max.age.ms: 30000\n"
        "              client.id: cost$$center",
    ).replace('"127.0.0.1:9092"', "${BOOT:-127.0.0.1:9092}")
    config = loads_pipeline(text, env={"PW": "hunter2"})
    cluster = config.source.clusters()["local"]
    assert cluster.bootstrap_servers == "127.0.0.1:9092"
    assert cluster.properties == {
        "sasl.plain.password": "hunter2",
        "metadata.max.age.ms": "30000",  # YAML number -> the string Kafka clients expect
        "client.id": "cost$center",
    }
    e = _error(text)
    assert "environment variable PW is not set" in e.message
    assert e.path == "$.source.metadata.streams[0].clusters.local.properties['sasl.plain.password']"
    # a bad value next to a secret: the secret is not echoed
    e = _error(text.replace("30000", "soon"), env={"PW": "hunter2"})
    assert "metadata.max.age.ms" in str(e) and "hunter2" not in str(e)


def test_unsupported_kafka_property_is_refused_before_start():
    text = GOOD.replace(
        "topics: [orders]", "topics: [orders]\n            properties: {sasl.mechanizm: PLAIN}"
    )
    e = _error(text)
    assert "sasl.mechanizm: not a supported Kafka client property" in e.message


# -- kind: source --------------------------------------------------------------------------

SOURCE = """\
kind: source
name: numbers
task:
  type: generator
  topic: numbers
  partitions: 3
  batch_size: 50
target:
  bootstrap_servers: "127.0.0.1:9092"
  properties: {security.protocol: PLAINTEXT}
tasks: 2
transaction_boundary: interval
transaction_boundary_interval_s: 0.5
exactly_once: required
"""


def test_source_file_builds_the_same_pipeline_as_the_python_api():
    config = loads_pipeline(SOURCE, env={})
    assert isinstance(config, SourcePipelineConfig)
    assert config.task == GeneratorTask("numbers", partitions=3, batch_size=50)
    api = rc.SourcePipeline(
        "numbers",
        task=rc.GeneratorSource("numbers", partitions=3, batch_size=50),
        target=rc.KafkaTarget("127.0.0.1:9092", {"security.protocol": "PLAINTEXT"}),
        tasks=2,
        transaction_boundary="interval",
        transaction_boundary_interval_s=0.5,
        exactly_once="required",
    )
    built = rc.SourcePipeline.from_config(config)
    assert built.settings == api.settings
    assert type(built.task) is rc.GeneratorSource and vars(built.task) == vars(api.task)
    assert config.task.topics() == ("numbers",)


def test_every_builtin_task_type_decodes_to_its_source():
    text = SOURCE.replace("  partitions: 3\n", "")
    files = loads_pipeline(
        text.replace("type: generator", "type: files\n  path: /in\n  pattern: '*.json'"), env={}
    )
    assert files.task == FilesTask("/in", "numbers", pattern="*.json", batch_size=50)
    source = files.task.build()
    assert isinstance(source, rc.FileSource) and source.pattern == "*.json"
    text = text.replace("type: generator", "type: delta\n  path: /t\n  key_column: id")
    text = text.replace("batch_size: 50", "storage_options: {AWS_SECRET_ACCESS_KEY: k3y, n: 1}")
    delta = loads_pipeline(text, env={})
    assert isinstance(delta.task, DeltaTask) and delta.task.key_column == "id"
    assert delta.task.storage_options == {"AWS_SECRET_ACCESS_KEY": "k3y", "n": "1"}
    assert "k3y" not in repr(delta)
    source = delta.task.build()
    assert isinstance(source, rc.DeltaTableSource) and source.key_column == "id"


# (replace this, by that) -> path, line, part of the message
SOURCE_ERRORS = [
    ("  batch_size: 50", "  batch_sise: 50", "$.task.batch_sise", 7, "did you mean 'batch_size'"),
    ("  type: generator\n", "", "$.task.type", 3, "missing; expected one of: files, delta"),
    ("type: generator", "type: kafka", "$.task.type", 4, "got 'kafka'; expected one of"),
    ("partitions: 3", "partitions: 0", "$.task.partitions", 6, "expected `int` >= 1"),
    ("partitions: 3", "partitions: many", "$.task.partitions", 6, "expected `int`, got `str`"),
    ("topic: numbers", "topic: a/b", "$.task.topic", 5, "invalid topic 'a/b'"),
    ("name: numbers", "name: a/b", "$.name", 2, "invalid pipeline name 'a/b'"),
    ("tasks: 2", "tasks: 0", "$.tasks", 11, "expected `int` >= 1"),
    ("tasks: 2", "taks: 2", "$.taks", 11, "did you mean 'tasks'"),
    ("boundary: interval", "boundary: never", "$.transaction_boundary", 12, "poll, interval"),
    ("once: required", "once: maybe", "$.exactly_once", 14, "requested, required, got 'maybe'"),
    ("interval_s: 0.5", "interval_s: 0", "$.transaction_boundary_interval_s", 13, "> 0.0"),
    ('"127.0.0.1:9092"', '""', "$.target", 8, "bootstrap_servers is empty"),
    ("security.protocol: PLAINTEXT", "sasl.mechanizm: PLAIN", "$.target.properties", 10, "not a"),
    ("tasks: 2", "producer_properties: {retry.backoff.ms: x}", "$.producer_properties", 11, "ms:"),
    ("tasks: 2", "group: ''", "$.group", 11, "must not be empty"),
    ("target:\n", "targets:\n", "$.targets", 8, "did you mean 'target'"),
]


@pytest.mark.parametrize("old, new, path, line, message", SOURCE_ERRORS)
def test_source_errors_name_file_line_path_and_expectation(old, new, path, line, message):
    assert old in SOURCE
    e = _error(SOURCE.replace(old, new))
    assert (e.path, e.line) == (path, line), str(e)
    assert message in e.message
    assert str(e).startswith(f"p.yaml:{line}: {path}: ")


def test_source_missing_fields_and_kinds():
    assert "missing required field `target`" in str(_error(SOURCE.split("target:")[0]))
    e = _error(SOURCE.replace("  topic: numbers\n", ""))
    assert e.path == "$.task" and "missing required field `topic`" in e.message
    assert "expected one of: mirror, sink, source" in str(
        _error(GOOD.replace("kind: sink", "kind: x"))
    )


def test_source_environment_interpolation_and_secrets():
    text = SOURCE.replace(
        "properties: {security.protocol: PLAINTEXT}",
        "properties:\n    security.protocol: SASL_PLAINTEXT\n    sasl.mechanism: PLAIN\n"
        "    sasl.plain.password: ${PW}",
    ).replace('"127.0.0.1:9092"', "${BOOT:-127.0.0.1:9093}")
    config = loads_pipeline(text, env={"PW": "hunter2"})
    assert config.target.bootstrap_servers == "127.0.0.1:9093"
    assert config.target.properties["sasl.plain.password"] == "hunter2"
    assert "hunter2" not in repr(config)
    e = _error(text)
    assert e.path == "$.target.properties['sasl.plain.password']" and e.line == 13
    assert "environment variable PW is not set" in e.message


# -- type: python ----------------------------------------------------------------------------

TASKS_MODULE = """\
import rayconnect as rc


class Counter(rc.SourceTask):
    def __init__(self, topic, step=1):
        self.topic, self.step = topic, step

    async def poll(self):
        return []


class Broken(rc.SourceTask):
    def __init__(self, topic):
        raise RuntimeError("no connection")


class NotATask:
    pass


def function():
    pass
"""


def _python_task(cls: str, args: str = "{topic: numbers, step: 2}") -> str:
    return (
        "kind: source\nname: p\ntask:\n  type: python\n"
        f"  class: {cls}\n  args: {args}\ntarget: {{bootstrap_servers: 'h:9092'}}\n"
    )


@pytest.fixture
def tasks_module(tmp_path, monkeypatch):
    import sys

    name = f"rc_tasks_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TASKS_MODULE)
    monkeypatch.setattr(sys, "path", list(sys.path))  # restored afterwards
    monkeypatch.chdir(tmp_path)  # found in the current folder, as `rayconnect run` would
    yield name
    sys.modules.pop(name, None)


def test_python_task_is_imported_and_built(tasks_module):
    config = loads_pipeline(_python_task(f"{tasks_module}:Counter"), env={})
    assert config.task == PythonTask(f"{tasks_module}:Counter", {"topic": "numbers", "step": 2})
    assert config.task.topics() == ("numbers",)
    task = config.task.build()
    assert isinstance(task, rc.SourceTask) and (task.topic, task.step) == ("numbers", 2)
    # a built-in by import path works too
    text = _python_task("rayconnect.source_tasks:GeneratorSource", "{topic: t, partitions: 2}")
    assert isinstance(loads_pipeline(text, env={}).task.build(), rc.GeneratorSource)


@pytest.mark.parametrize(
    "cls, args, message",
    [
        ("nope_no_such_module:X", None, "cannot import 'nope_no_such_module'"),
        ("{m}", None, "class must be written 'package.module:ClassName'"),
        ("{m}:Missing", None, "has no 'Missing'"),
        ("{m}:NotATask", None, "not a rayconnect.SourceTask subclass (it is 'NotATask')"),
        ("{m}:function", None, "not a rayconnect.SourceTask subclass (it is 'function')"),
        ("{m}:Counter", "{topik: numbers}", "no argument 'topik'; did you mean 'topic'?"),
        ("{m}:Counter", "{}", "missing a required argument: 'topic'"),
    ],
)
def test_python_task_errors_before_anything_starts(tasks_module, cls, args, message):
    e = _error(_python_task(cls.format(m=tasks_module), *([args] if args else [])))
    assert e.path.startswith("$.task") and e.line in (3, 6), str(e)
    assert message in e.message


def test_python_task_whose_constructor_fails_is_a_config_error(tasks_module):
    config = loads_pipeline(_python_task(f"{tasks_module}:Broken", "{topic: t}"), env={})
    with pytest.raises(ConfigError, match="Broken.*RuntimeError: no connection"):
        config.task.build()


def test_python_task_class_field_is_spelled_class():
    e = _error(_python_task("x:Y").replace("class:", "klass:"))
    assert e.path == "$.task.klass" and "expected one of: class, args" in e.message


def test_give_up_after_s_in_files_and_the_api_with_its_checks():
    """The give-up time of an outage: default 900 s, a number of seconds or null (never);
    a bad one names the field, before anything starts."""
    assert loads_pipeline(GOOD, env={}).give_up_after_s == 900
    config = loads_pipeline(GOOD + "give_up_after_s: 120\n", env={})
    assert config.give_up_after_s == 120
    assert loads_pipeline(GOOD + "give_up_after_s: null\n", env={}).give_up_after_s is None
    e = _error(GOOD + "give_up_after_s: 0\n")
    assert "give_up_after_s must be > 0" in e.message
    source = loads_pipeline(SOURCE + "give_up_after_s: 60\n", env={})
    assert rc.SourcePipeline.from_config(source).settings.give_up_after_s == 60
    with pytest.raises(ConfigError, match="give_up_after_s: must be > 0"):
        loads_pipeline(SOURCE + "give_up_after_s: -5\n", env={})
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("s", {"c": rc.ClusterMetadata("127.0.0.1:9092", ("t",))}),)
    )
    api = rc.SinkPipeline("p", rc.KafkaSource(meta), rc.DeltaSink("/t"), give_up_after_s=30)
    assert api.config.give_up_after_s == 30
    with pytest.raises(ConfigError, match="give_up_after_s"):
        rc.SinkPipeline("p", rc.KafkaSource(meta), rc.DeltaSink("/t"), give_up_after_s=-1)


def test_an_upsert_sinks_truncate_setting_is_checked_before_start():
    e = _error(GOOD.replace("sink: {path: /data/orders}", "sink: {path: /data/o, truncate: drop}"))
    assert e.path == "$.sink.truncate"
    assert str(e) == "p.yaml:12: $.sink.truncate: expected one of: apply, dead_letter, got 'drop'"
