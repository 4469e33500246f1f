"""TableLocation: URIs, the two views of a table (delta-rs options, pyarrow filesystem and
paths), without a store (the S3 behaviour is tested on SeaweedFS in tests/integration)."""

from __future__ import annotations

import os

import pytest

import rayconnect as rc
from rayconnect.config.sink import ConfigError
from rayconnect.storage.location import StorageError, TableLocation

pytestmark = [pytest.mark.timeout(30)]


@pytest.mark.parametrize(
    ("uri", "normalised", "store"),
    [
        ("s3://lake/a/b/", "s3://lake/a/b", "s3"),
        ("s3a://lake/t", "s3a://lake/t", "s3"),
        ("gs://bucket/t", "gs://bucket/t", "gs"),
        ("az://container/t", "az://container/t", "az"),
        ("abfss://container/t", "abfss://container/t", "az"),
        ("/data/t", "/data/t", "file"),
        ("file:///data/t", "/data/t", "file"),
    ],
)
def test_uris(uri: str, normalised: str, store: str) -> None:
    location = TableLocation.parse(uri)
    assert (location.uri, location.store) == (normalised, store)


def test_relative_local_path_becomes_absolute_and_paths_join() -> None:
    local = TableLocation.parse("rel/t")
    assert local.uri == os.path.join(os.getcwd(), "rel/t") and local.is_local
    assert local.path("staging/x.parquet") == f"{local.uri}/staging/x.parquet"
    s3 = TableLocation.parse("s3://lake/orders")
    assert s3.path("staging/x.parquet") == "lake/orders/staging/x.parquet"
    assert s3.join("_delta_log") == "s3://lake/orders/_delta_log"
    assert s3.bucket == "lake" and s3.path() == "lake/orders"


@pytest.mark.parametrize("bad", ["hdfs://nn/t", "s3://", "s3:///t", "ftp://x/y"])
def test_bad_uris_are_config_errors_naming_the_path(bad: str) -> None:
    with pytest.raises(StorageError):
        TableLocation.parse(bad)
    with pytest.raises(ConfigError, match="sink.path"):
        rc.DeltaSink(bad)


def test_locations_are_hashable_and_equal_by_value() -> None:
    a = rc.DeltaSink("s3://lake/t", storage_options={"AWS_REGION": "eu-west-1"}).location()
    b = TableLocation.parse("s3://lake/t/", {"AWS_REGION": "eu-west-1"})
    assert a == b and len({a, b}) == 1
    assert a.delta_options(env={})["AWS_REGION"] == "eu-west-1"
    assert TableLocation.parse("/t").delta_options(env={}) is None


def test_gs_and_az_filesystems_from_the_options() -> None:
    az = TableLocation.parse(
        "az://cont/t", {"azure_storage_account_name": "acct", "azure_storage_account_key": "a2V5"}
    )
    assert type(az.filesystem()).__name__ == "AzureFileSystem" and az.path("x") == "cont/t/x"
    with pytest.raises(StorageError, match="azure_storage_account_name"):
        TableLocation.parse("az://cont/t").filesystem()
    gs = TableLocation.parse("gs://b/t", {"google_endpoint_url": "http://127.0.0.1:4443"})
    assert type(gs.filesystem()).__name__ == "GcsFileSystem"
