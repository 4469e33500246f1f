"""The object-store put-if-absent's store settings and refusals, without a store (the race
itself is tested on SeaweedFS: tests/integration/tables/test_merge_on_read_s3.py)."""

from __future__ import annotations

import pytest

import rayconnect as rc
from rayconnect.config.sink import ConfigError
from rayconnect.storage.location import StorageError, TableLocation
from rayconnect.storage.put_if_absent import object_store, problem

pytestmark = [pytest.mark.timeout(30)]

S3 = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    "AWS_ACCESS_KEY_ID": "key",
    "AWS_SECRET_ACCESS_KEY": "secret",
}


def test_s3_store_from_the_locations_settings() -> None:
    store = object_store(TableLocation.parse("s3://lake/db/t", {**S3, "AWS_REGION": "eu-west-1"}))
    assert store.prefix == "db/t"
    assert str(store.client_options["allow_http"]).lower() == "true"  # an http:// endpoint
    config = store.config
    assert config["bucket"] == "lake" and config["endpoint"] == "http://127.0.0.1:9"
    assert (config["access_key_id"], config["region"]) == ("key", "eu-west-1")
    assert config["conditional_put"] == "etag"


def test_credentials_and_endpoint_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in S3.items():
        monkeypatch.setenv(name, value)
    store = object_store(TableLocation.parse("s3://lake/t"))
    assert store.config["endpoint"] == "http://127.0.0.1:9"
    assert store.config["region"] == "us-east-1"


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({}, None),
        ({"conditional_put": "etag"}, None),
        ({"AWS_CONDITIONAL_PUT": "disabled"}, "conditional_put='disabled'"),
        ({"AWS_S3_LOCKING_PROVIDER": "dynamodb"}, "aws_s3_locking_provider"),
    ],
)
def test_what_cannot_put_if_absent_is_refused(options: dict, refused: str | None) -> None:
    location = TableLocation.parse("s3://lake/t", {**S3, **options})
    if refused is None:
        assert problem(location) is None
        return
    assert refused in (problem(location) or "")
    with pytest.raises(StorageError, match=refused):
        object_store(location)
    with pytest.raises(ConfigError, match="merge_on_read"):
        rc.DeltaSink(
            "s3://lake/t",
            storage_options={**S3, **options},
            write_mode="upsert",
            key_columns=("id",),
            upsert_mode="merge_on_read",
        )
    rc.DeltaSink(  # copy-on-write commits through delta-rs: its own locking is fine
        "s3://lake/t",
        storage_options={**S3, **options},
        write_mode="upsert",
        key_columns=("id",),
    )


def test_merge_on_read_on_s3_and_local_is_accepted(tmp_path) -> None:
    for path in ("s3://lake/t", str(tmp_path / "t")):
        sink = rc.DeltaSink(
            path, write_mode="upsert", key_columns=("id",), upsert_mode="merge_on_read"
        )
        assert sink.upsert_mode == "merge_on_read"
    assert problem(TableLocation.parse(str(tmp_path / "t"))) is None
