"""The REST catalog's settings (``config.rest_catalog``): checked when built, the credential
read from where it is named (never held in the configuration), the tables' files placed
where SeaweedFS's table buckets take them."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

import rayconnect as rc
from rayconnect.redact import redact

URI = "http://127.0.0.1:8181"


def test_a_sink_in_a_rest_catalog_places_its_tables_under_data(tmp_path: Path) -> None:
    catalog = rc.RestCatalog(URI, "s3://lake/")
    sink = rc.IcebergSink("db.orders", rest_catalog=catalog)
    assert sink.location().uri == "s3://lake/db/orders/data"
    assert sink.route_table("users").location().uri == "s3://lake/db/users/data"
    assert sink.catalog_config() is catalog
    placed = rc.IcebergSink("db.orders", rest_catalog=catalog, table_location="s3://b/t")
    assert placed.location().uri == "s3://b/t"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"uri": "127.0.0.1:8181"}, "sink.rest_catalog.uri '127.0.0.1:8181' is not an http(s)://"),
        ({"warehouse": ""}, "sink.rest_catalog.warehouse is empty"),
        ({"credential_env": "A", "credential_file": "/f"}, "not both"),
        ({"s3": {"endpoint": "x"}}, "['endpoint'] are not s3.* properties"),
        ({"properties": {"credential": "a:b"}}, "['credential'] have settings of their own"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings: dict, message: str) -> None:
    given = {"uri": URI, "warehouse": "s3://lake/"} | settings
    with pytest.raises(rc.ConfigError, match=re.escape(message)):
        rc.RestCatalog(**given)


def test_a_warehouse_name_needs_a_table_location_and_one_catalog_is_given() -> None:
    by_name = rc.RestCatalog(URI, "lake")
    with pytest.raises(rc.ConfigError, match="say where the table's files go"):
        rc.IcebergSink("db.orders", rest_catalog=by_name)
    with pytest.raises(rc.ConfigError, match="two catalogs"):
        rc.IcebergSink("db.orders", rest_catalog=by_name, catalog={"type": "sql", "uri": "x"})


def test_the_credential_is_read_where_it_is_named_and_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RC_TEST_ICEBERG_CREDENTIAL", "id:s3cr3t")
    by_env = rc.RestCatalog(URI, "s3://lake/", credential_env="RC_TEST_ICEBERG_CREDENTIAL")
    properties = by_env.catalog_properties({"s3.region": "eu-west-1"})
    assert properties == {
        "type": "rest",
        "uri": URI,
        "warehouse": "s3://lake/",
        "s3.region": "eu-west-1",
        "credential": "id:s3cr3t",
    }
    sink = rc.IcebergSink("db.orders", rest_catalog=by_env)
    assert "s3cr3t" not in repr(sink) + str(redact(sink)) + msgspec.json.encode(sink).decode()
    secret = tmp_path / "credential"
    secret.write_text("id:fromfile\n")
    by_file = rc.RestCatalog(URI, "s3://lake/", credential_file=str(secret), s3={"s3.region": "x"})
    assert by_file.catalog_properties({"s3.region": "y"})["s3.region"] == "x"
    assert by_file.credential() == "id:fromfile"
    monkeypatch.delenv("RC_TEST_ICEBERG_CREDENTIAL")
    with pytest.raises(rc.ConfigError, match="RC_TEST_ICEBERG_CREDENTIAL is not set"):
        by_env.credential()
    missing = rc.RestCatalog(URI, "s3://lake/", credential_file=str(tmp_path / "none"))
    with pytest.raises(rc.ConfigError, match="credential_file: cannot read"):
        missing.credential()
