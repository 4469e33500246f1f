"""Credentials in Kafka properties reach aiokafka unchanged, and nowhere else: not in the
repr of a configuration, not in status output (text or JSON), not in metric tags."""

from __future__ import annotations

import json
import ssl

import msgspec
import pytest
from status_sample import pipeline_status

import rayconnect as rc
from rayconnect.cli.status import render_status
from rayconnect.kafka.discovery import client_properties
from rayconnect.metrics import PARTITION_TAGS, PIPELINE_TAGS
from rayconnect.protocol.status import PipelineStatus
from rayconnect.redact import MASK, is_secret_key, redact, redact_properties

pytestmark = [pytest.mark.timeout(30)]

PASSWORD = "pa55-w0rd-xyz"
JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required password="{PASSWORD}";'
PROPS = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.plain.username": "rayconnect",
    "sasl.plain.password": PASSWORD,
    "client.id": "orders",
    "metadata.max.age.ms": "60000",
}


def test_sasl_properties_reach_aiokafka_unchanged():
    kwargs = client_properties(PROPS)
    assert kwargs == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "rayconnect",
        "sasl_plain_password": PASSWORD,
        "client_id": "orders",
        "metadata_max_age_ms": 60000,
    }
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    # every key is a keyword both clients accept
    for cls in (AIOKafkaConsumer, AIOKafkaProducer):
        import inspect

        assert set(kwargs) <= set(inspect.signature(cls.__init__).parameters)


def test_tls_properties_become_one_ssl_context(tmp_path):
    import certifi  # shipped with the stack (requests); a real CA bundle

    kwargs = client_properties(
        {"security.protocol": "SSL", "ssl.cafile": certifi.where(), "ssl.check.hostname": "false"}
    )
    assert kwargs["security_protocol"] == "SSL"
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname is False
    assert context.cert_store_stats()["x509_ca"] > 0


@pytest.mark.parametrize(
    "key",
    [
        "sasl.plain.password",
        "sasl.jaas.config",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.password",
        "sasl_plain_password",
        "basic.auth.user.info.secret",
        "oauth.token",
        "ssl.keyfile.password",
        "api_key",
        # object-store storage_options (delta-rs / object_store names and env vars)
        "AWS_ACCESS_KEY_ID",
        "aws_secret_access_key",
        "AWS_SESSION_TOKEN",
        "token",
        "azure_storage_account_key",
        "AZURE_STORAGE_ACCESS_KEY",
        "azure_storage_sas_key",
        "azure_client_secret",
        "google_service_account_key",
        "google_service_account",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ],
)
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "security.protocol",
        "sasl.mechanism",
        "sasl.plain.username",
        "client.id",
        "ssl.cafile",
        "bootstrap_servers",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ALLOW_HTTP",
        "conditional_put",
        "azure_storage_account_name",
        "google_bucket",
    ],
)
def test_not_secret_keys(key):
    assert not is_secret_key(key)


def _config():
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("orders", {"east": rc.ClusterMetadata("h:9093", ("orders",), PROPS)}),)
    )
    return rc.SinkPipeline("orders", rc.KafkaSource(meta), rc.DeltaSink("/t")).config


def test_repr_and_str_of_configs_mask_credentials():
    config = _config()
    for shown in (repr(config), str(config), repr(config.source), repr(config.source.metadata)):
        assert PASSWORD not in shown
        assert "'sasl.plain.password': '***'" in shown
        assert "SCRAM-SHA-512" in shown  # the rest is still there
    # the real value is still what the pipeline uses
    assert config.source.clusters()["east"].properties["sasl.plain.password"] == PASSWORD


def test_redact_any_depth():
    data = {"a": [{"properties": {**PROPS, "sasl.jaas.config": JAAS}}], "sasl_plain_password": "x"}
    out = redact(data)
    text = json.dumps(out)
    assert PASSWORD not in text and '"x"' not in text
    assert out["a"][0]["properties"]["sasl.mechanism"] == "SCRAM-SHA-512"
    assert redact_properties(PROPS)["sasl.plain.password"] == MASK
    assert (
        redact(_config())["source"]["metadata"]["streams"][0]["clusters"]["east"]["properties"][
            "sasl.plain.password"
        ]
        == MASK
    )


def test_status_text_and_json_never_show_credentials():
    from rayconnect.cli.status import status_json

    status = pipeline_status(
        last_round_duration_s=1.5,
        rounds={"committed": 2},
        records_committed_since_start=10,
        # a reader's report that (wrongly) carried its config must still not leak it
        readers={
            "orders/reader/east/0": {
                "config": {"sasl.plain.password": PASSWORD, "sasl.jaas.config": JAAS}
            }
        },
        partition_status={
            "east/orders/0": {"committed_offset": 5, "high_watermark": 7, "lag": 2, "host": None}
        },
        actors=[
            {"name": "orders/coordinator", "state": "ALIVE", "pid": 1, "node": None, "restarts": 0}
        ],
    )
    safe = msgspec.convert(redact(status), PipelineStatus)
    assert PASSWORD not in status_json(safe) and JAAS not in status_json(safe)
    text = render_status(safe)
    assert PASSWORD not in text and "east/orders/0" in text and "ALIVE" in text


def test_metric_tags_are_names_only():
    assert set(PARTITION_TAGS) == {"pipeline", "cluster", "topic", "partition"}
    assert set(PIPELINE_TAGS) == {"pipeline"}


S3_SECRET = "s3-s3cr3t-value"
S3_KEY_ID = "AKIAEXAMPLEKEYID"
STORAGE = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
    "AWS_ACCESS_KEY_ID": S3_KEY_ID,
    "AWS_SECRET_ACCESS_KEY": S3_SECRET,
    "AWS_SESSION_TOKEN": "sess-tok-123",
    "azure_storage_account_key": "az-acct-key",
    "google_service_account_key": '{"private_key": "-----BEGIN PRIVATE KEY-----"}',
}
STORAGE_SECRETS = [S3_SECRET, S3_KEY_ID, "sess-tok-123", "az-acct-key", "BEGIN PRIVATE KEY"]


def _s3_config():
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("orders", {"east": rc.ClusterMetadata("h:9093", ("orders",))}),)
    )
    sink = rc.DeltaSink("s3://lake/orders", storage_options=STORAGE)
    return rc.SinkPipeline("orders", rc.KafkaSource(meta), sink).config


def test_storage_options_never_shown_but_reach_delta_rs():
    config = _s3_config()
    location = config.sink.location()
    shown = [repr(config), str(config), repr(config.sink), repr(location), str(location)]
    shown.append(json.dumps(redact(config)))
    shown.append(json.dumps(redact({"status": {"config": config, "table": location.uri}})))
    for text in shown:
        for secret in STORAGE_SECRETS:
            assert secret not in text, (secret, text)
    assert "http://127.0.0.1:8333" in repr(config.sink)  # the endpoint is not a secret
    # the real values still reach delta-rs and pyarrow, with the S3 defaults added
    options = location.delta_options(env={})
    assert options["AWS_SECRET_ACCESS_KEY"] == S3_SECRET
    assert options["AWS_ACCESS_KEY_ID"] == S3_KEY_ID
    assert options["conditional_put"] == "etag" and options["AWS_ALLOW_HTTP"] == "true"
    assert location.s3_settings(env={})["session_token"] == "sess-tok-123"


def test_storage_credentials_from_the_environment_when_not_given():
    location = rc.DeltaSink("s3://lake/t").location()
    env = {"AWS_ACCESS_KEY_ID": "env-id", "AWS_SECRET_ACCESS_KEY": "env-secret"}
    options = location.delta_options(env=env)
    assert options["AWS_ACCESS_KEY_ID"] == "env-id"
    assert options["AWS_SECRET_ACCESS_KEY"] == "env-secret"
    assert options["AWS_REGION"] == "us-east-1"
    assert "AWS_ALLOW_HTTP" not in options  # no http:// endpoint: https only
    # given options win over the environment, whatever their spelling
    given = rc.DeltaSink("s3://lake/t", storage_options={"aws_access_key_id": "mine"})
    assert given.location().s3_settings(env=env)["access_key_id"] == "mine"
    # a locking provider chosen by the user: no conditional-put default on top
    locked = rc.DeltaSink("s3://lake/t", storage_options={"AWS_S3_LOCKING_PROVIDER": "dynamodb"})
    assert "conditional_put" not in locked.location().delta_options(env={})


def test_storage_credentials_from_var_in_a_pipeline_file():
    from test_pipeline_file import GOOD

    from rayconnect.cli.pipeline_file import loads_pipeline

    text = GOOD.replace(
        "sink: {path: /data/orders}\n",
        "sink:\n  path: s3://lake/orders\n  storage_options:\n"
        "    AWS_ACCESS_KEY_ID: ${S3_KEY}\n    AWS_SECRET_ACCESS_KEY: ${S3_SECRET}\n",
    )
    assert "s3://lake" in text
    config = loads_pipeline(text, env={"S3_KEY": S3_KEY_ID, "S3_SECRET": S3_SECRET})
    assert S3_SECRET not in repr(config) and S3_KEY_ID not in repr(config)
    options = config.sink.location().delta_options(env={})
    assert options["AWS_SECRET_ACCESS_KEY"] == S3_SECRET
    assert options["AWS_ACCESS_KEY_ID"] == S3_KEY_ID
