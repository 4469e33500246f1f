"""Pipeline files: every example decodes; every error names file, line, path and expectation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import rayconnect as rc
from rayconnect.config import ConfigError, SinkPipelineConfig
from rayconnect.pipeline_file import PipelineFileError, load_pipeline_file, loads_pipeline

pytestmark = [pytest.mark.timeout(30)]

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
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


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_decodes(path):
    config = load_pipeline_file(path, env=EXAMPLE_ENV)
    assert isinstance(config, SinkPipelineConfig)
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


def test_kind_and_metadata_type():
    assert "missing; expected one of: sink" in str(_error(GOOD.replace("kind: sink\n", "")))
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
