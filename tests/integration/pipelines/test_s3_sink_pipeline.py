"""A sink pipeline on real parts into a Delta table on the embedded S3 (SeaweedFS) - and
(slow) into an Iceberg table of SeaweedFS's Iceberg REST catalog.

Real tansu broker, real Ray actors, Spark on Ray writing Parquet straight to S3, delta-rs
(pyiceberg through the REST catalog) committing there. Exactly once is checked the strict
way (see test_sink_pipeline.py), then again after the coordinator is SIGKILLed in the
middle of a round; Polars (pyiceberg) reads the table.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import polars as pl
import pytest
from deltalake import DeltaTable
from pyarrow import fs
from sink_checks import (
    CLUSTER,
    Produced,
    assert_exactly_once,
    caught_up,
    kill_landed_in_round,
    open_round_with_data,
    pipeline,
)

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.kafka.admin import high_watermarks
from rayconnect.storage.embedded_s3 import EmbeddedS3
from rayconnect.storage.location import TableLocation
from rayconnect.tables.factory import open_committer


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "kind",
    # the REST catalog's committer is tested in the default run (test_iceberg_rest.py)
    ["delta", pytest.param("iceberg-rest", marks=pytest.mark.slow)],
)
def test_pipeline_into_s3_exactly_once_through_a_coordinator_kill(
    ray_session, kafka_broker, embedded_s3: EmbeddedS3, s3_bucket: str, kill, kind, request
) -> None:
    bootstrap, options = kafka_broker.bootstrap_servers, embedded_s3.storage_options
    uri = f"s3://{s3_bucket}/orders"
    topic = f"s3orders-{kind}"
    produced = Produced(bootstrap, topic, 3)
    produced.more(3000)
    sink: rc.DeltaSink | rc.IcebergSink = rc.DeltaSink(uri, storage_options=options)
    if kind == "iceberg-rest":
        namespace = request.getfixturevalue("rest_namespace")
        catalog = request.getfixturevalue("rest_catalog")
        sink = rc.IcebergSink(f"{namespace}.orders", rest_catalog=catalog, storage_options=options)
    handle = pipeline(
        "s3sink",
        bootstrap,
        topic,
        sink,
        commit_interval_s=2,
        write_timeout_s=30,
        flush_max_records=1500,
        commit_when_drained=False,  # rounds stay open for the interval: kills land in them
    ).start()
    try:
        status = handle.wait_for(caught_up(produced), timeout_s=180)
        assert_exactly_once(sink, produced, status)
        first_epoch = status["epoch"]

        produced.more(3000)
        before = handle.wait_for(open_round_with_data, timeout_s=60, poll_s=0.05)
        killed_at = time.time()
        kill(names.coordinator("s3sink"), "sigkill")
        produced.more(2000)
        status = handle.wait_for(caught_up(produced), timeout_s=300)
        recovered_s = time.time() - killed_at
        assert kill_landed_in_round(sink, before, killed_at)
        assert_exactly_once(sink, produced, status)
        assert status["epoch"] > first_epoch  # the new incarnation fenced the old one
        hw = asyncio.run(high_watermarks(bootstrap, topic))
        assert status["offsets"] == {f"{CLUSTER}/{topic}/{p}": n for p, n in hw.items() if n}
        assert embedded_s3.secret_key not in msgspec.json.encode(handle.status()).decode()
        print(f"\ncoordinator SIGKILL -> all committed again: {recovered_s:.1f} s")
        if isinstance(sink, rc.IcebergSink):
            assert status["table"] == f"{sink.table} at {sink.location().uri}"
            # a new coordinator's offsets, from the table in the catalog alone
            committed = open_committer(sink, "s3sink").committed_offsets(None)
            assert committed == status["offsets"]
            return
        assert status["table"] == uri

        frame = pl.read_delta(uri, storage_options=options)
        assert frame.height == sum(produced.counts.values())
        # every committed file is an object in the bucket, under the table
        location = TableLocation.parse(uri, options)
        store = location.filesystem()
        added = DeltaTable(uri, storage_options=options).file_uris()
        assert added and all(u.startswith(f"{uri}/staging/") for u in added)
        assert all(
            store.get_file_info(u.split("://", 1)[1]).type == fs.FileType.File for u in added
        )
    finally:
        handle.stop(commit=False)
