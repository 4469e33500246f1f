"""IcebergCommitter against SeaweedFS's Iceberg REST catalog (the session's embedded S3 serves
it): the same round commit as with the SQL catalog - namespace and table made on the fly,
fenced, offsets read back from the table alone - and a configuration the catalog cannot
take refused with the setting to fix. Files staged on the store as the writer would."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from iceberg_reads import iceberg_rows, load_table
from table_files import K0, K1, PIPELINE, records, stage
from typed_files import UPSERT_BY_ID, raw, stage_records

import rayconnect as rc
from rayconnect.pipelines.sink import check_sink
from rayconnect.storage.embedded_s3 import EmbeddedS3
from rayconnect.tables.base import StaleEpochError
from rayconnect.tables.factory import open_committer, route_tables
from rayconnect.tables.iceberg import NUM_RETRIES, IcebergCommitter

pytestmark = [pytest.mark.timeout(120)]


def rest_sink(
    catalog: rc.RestCatalog, s3: EmbeddedS3, table: str, **settings: object
) -> rc.IcebergSink:
    return rc.IcebergSink(
        table, rest_catalog=catalog, storage_options=s3.storage_options, **settings
    )


def new_committer(sink: rc.IcebergSink) -> IcebergCommitter:
    committer = open_committer(sink, PIPELINE)
    assert isinstance(committer, IcebergCommitter)
    return committer


def test_a_table_made_on_the_fly_in_the_rest_catalog_is_fenced_and_recovers(
    rest_catalog: rc.RestCatalog, rest_namespace: str, embedded_s3: EmbeddedS3
) -> None:
    sink = rest_sink(rest_catalog, embedded_s3, f"{rest_namespace}.orders")
    location = sink.location()
    assert location.uri == f"s3://rc-lake/{rest_namespace}/orders/data"
    check_sink(sink)  # the driver's check: the catalog opens, the warehouse is there
    old, new = new_committer(sink), new_committer(sink)
    table = old.ensure_table()  # the namespace too
    assert table.location() == location.uri and table.properties[NUM_RETRIES] == "0"
    assert old.claim_epoch() == 1
    old.commit([stage(location, records(K0, 0, 4))], {K0: 4}, {K0: None}, epoch=1)
    old.commit([stage(location, records(K1, 0, 3))], {K1: 3}, {K1: None}, epoch=1)
    assert new.claim_epoch() == 2
    with pytest.raises(StaleEpochError):
        old.commit([stage(location, records(K0, 4, 4))], {K0: 8}, {K0: 4}, epoch=1)
    new.commit([stage(location, records(K0, 4, 4))], {K0: 8}, {K0: 4}, epoch=2)
    want = [("c1", "orders", 0, o) for o in range(8)] + [("c1", "orders", 1, o) for o in range(3)]
    assert sorted(iceberg_rows(sink)) == want
    fresh = new_committer(sink)  # a new coordinator: everything from the table alone
    assert fresh.committed_offsets() == {K0: 8, K1: 3}
    assert fresh.epoch() == 2
    assert route_tables(sink, PIPELINE) == []  # its own table is no route table


UPSERT = UPSERT_BY_ID


@pytest.mark.slow  # ~4 s on a loaded machine; the default run has the SQL catalog's upserts
def test_upsert_rounds_in_the_rest_catalog_leave_one_row_per_key(
    rest_catalog: rc.RestCatalog, rest_namespace: str, embedded_s3: EmbeddedS3
) -> None:
    """``write_mode: upsert`` through the REST catalog: updates replace, a tombstone
    deletes, the offsets land in the same commit."""
    sink = rest_sink(rest_catalog, embedded_s3, f"{rest_namespace}.users", write_mode="upsert")
    committer = open_committer(sink, PIPELINE, UPSERT)
    committer.ensure_table()
    epoch = committer.claim_epoch()
    rounds = [[(1, "a"), (2, "b"), (3, "c")], [(2, "B"), (1, None), (4, "d"), (2, "BB")]]
    start = 0
    for changes in rounds:
        values = [None if v is None else json.dumps({"id": k, "v": v}).encode() for k, v in changes]
        keys = pa.array([json.dumps({"id": k}).encode() for k, _ in changes], pa.binary())
        batch = raw(values, start)  # type: ignore[arg-type] - None: a tombstone
        batch = batch.set_column(batch.column_names.index("key"), "key", keys)
        files = stage_records(sink.location(), batch, UPSERT, committer.current_schema())
        end = start + len(changes)
        committer.commit(files, {"c/t/0": end}, {"c/t/0": start or None}, epoch=epoch)
        start = end
    rows = load_table(sink).scan(selected_fields=("id", "v")).to_arrow().to_pylist()
    assert sorted((r["id"], r["v"]) for r in rows) == [(2, "BB"), (3, "c"), (4, "d")]
    assert open_committer(sink, PIPELINE, UPSERT).committed_offsets() == {"c/t/0": 7}


def test_a_catalog_it_cannot_use_is_refused_before_anything_starts(
    rest_catalog: rc.RestCatalog, embedded_s3: EmbeddedS3, s3_bucket: str, tmp_path: Path
) -> None:
    def refused(catalog: rc.RestCatalog) -> str:
        with pytest.raises(rc.ConfigError) as caught:
            check_sink(rest_sink(catalog, embedded_s3, "db.orders"))
        assert embedded_s3.secret_key not in str(caught.value)
        return str(caught.value)

    assert "bucket 'no-such-lake' does not exist" in refused(
        msgspec.structs.replace(rest_catalog, warehouse="s3://no-such-lake/")
    )
    plain = f"s3://{s3_bucket}/"  # a bucket, but no table bucket: not a catalog
    assert f"sink.rest_catalog.warehouse {plain!r} cannot be used" in refused(
        msgspec.structs.replace(rest_catalog, warehouse=plain)
    )
    wrong = tmp_path / "wrong"
    wrong.write_text(f"{embedded_s3.access_key}:not-the-secret")
    message = refused(msgspec.structs.replace(rest_catalog, credential_file=str(wrong)))
    assert f"refused the file {wrong}" in message
    message = refused(msgspec.structs.replace(rest_catalog, uri="http://127.0.0.1:9"))
    assert "sink.rest_catalog.uri: cannot reach http://127.0.0.1:9" in message
    unset = msgspec.structs.replace(
        rest_catalog, credential_file="", credential_env="RAYCONNECT_TEST_UNSET_CREDENTIAL"
    )
    assert "RAYCONNECT_TEST_UNSET_CREDENTIAL is not set" in refused(unset)
