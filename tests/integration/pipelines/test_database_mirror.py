"""A whole Postgres database mirrored into the lake, end to end, exactly once (issue 27.5).

20 tables under a steady write load (tests/fixtures/pg_mirror.py) -> the Postgres change
source (one topic per table, Debezium events, exactly once) -> Kafka -> ONE sink pipeline
whose topic-pattern route gives every topic its own upsert table, made on the fly. Roles of
both pipelines are killed (ray.kill and SIGKILL) and Postgres is restarted during the load;
at the end every lake table equals ``SELECT *`` of its Postgres table, row for row.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from fixtures.pg_mirror import MirrorDatabase, Row, normalized
from fixtures.postgres import PostgresServer

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.kafka.admin import create_topic

pytestmark = [pytest.mark.usefixtures("ray_session")]

PATTERN = r"db\.public\.(.*)"


def _source(server: PostgresServer, bootstrap: str, tables: list[str]) -> rc.SourcePipeline:
    for t in tables:
        asyncio.run(create_topic(bootstrap, f"db.public.{t}", 2, exist_ok=True))
    task = rc.PostgresSource(
        dsn=server.dsn,
        slot="mirror",
        tables=tables,
        topic_prefix="db",
        password_file=server.password_file,
    )
    return rc.SourcePipeline(
        "mirror-src",
        task=task,
        target=rc.KafkaTarget(bootstrap),
        transaction_boundary="connector",
        exactly_once="required",
    )


def _sink(bootstrap: str, lake: Path) -> rc.SinkPipeline:
    source = rc.KafkaSource(
        rc.SingleClusterMetadataService(bootstrap, topic_pattern=PATTERN),
        value_format="json",
        key_format="json",
        key_schema={"id": "long"},
        include_key=True,
        envelope="debezium",
        errors="dead_letter",
        discovery_interval_s=2.0,
    )
    routes = rc.Routes(rules=(rc.Route(table="{1}", topic_pattern=PATTERN),))
    sink = rc.DeltaSink(str(lake), write_mode="upsert", key_columns=("id",), routes=routes)
    return rc.SinkPipeline("mirror", source, sink, commit_interval_s=2)


def _lake_rows(lake: Path, table: str) -> list[Row]:
    path = lake / table
    if not (path / "_delta_log").exists():
        return []
    data: pa.Table = DeltaTable(str(path)).to_pyarrow_table()
    return data.to_pylist()


def _difference(db: MirrorDatabase, lake: Path) -> str | None:
    """None once every lake table equals its Postgres table; else the first difference."""
    cols = db.columns()
    for table in db.names:
        want = normalized(db.rows_of(table), cols)
        rows = _lake_rows(lake, table)
        got = normalized(rows, cols)
        if len(rows) != len(got):
            return f"{table}: {len(rows) - len(got)} keys twice in the lake"
        if got != want:
            missing = sorted(set(want) - set(got))[:5]
            extra = sorted(set(got) - set(want))[:5]
            changed = [k for k in want if k in got and got[k] != want[k]][:3]
            detail = [(want[k], got[k]) for k in changed[:1]]
            return (
                f"{table}: {len(got)} rows in the lake, {len(want)} in Postgres; missing "
                f"{missing}, extra {extra}, changed {changed} {detail}"
            )
    return None


def _wait_mirrored(db: MirrorDatabase, lake: Path, timeout_s: float) -> None:
    deadline, problem = time.monotonic() + timeout_s, "never checked"
    while time.monotonic() < deadline:
        problem = _difference(db, lake)
        if problem is None:
            return
        time.sleep(2.0)
    raise AssertionError(problem)


@pytest.mark.timeout(900)
def test_a_database_of_20_tables_mirrored_through_kills_of_both_sides(
    postgres: PostgresServer, kafka_broker, tmp_path: Path, kill: Any
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    db = MirrorDatabase(postgres, tables=20)
    db.create(rows_per_table=100)
    lake = tmp_path / "lake"
    src = _source(postgres, bootstrap, db.names).start()
    sink = _sink(bootstrap, lake).start()
    try:
        db.start(changes_per_s=300)
        sink.wait_for(lambda s: s["records_committed_since_start"] > 0, 240, 0.5)
        victims = [
            (names.task("mirror-src", 0), "ray.kill"),
            (names.coordinator("mirror"), "sigkill"),
            (names.writer("mirror"), "sigkill"),
            (names.task("mirror-src", 0), "sigkill"),
            (names.coordinator("mirror"), "ray.kill"),
        ]
        for victim, how in victims:
            time.sleep(4.0)
            kill(victim, how)
        db.pause()
        postgres.restart()
        db.resume()
        time.sleep(5.0)
        db.stop()
        assert db.changes > 1000
        _wait_mirrored(db, lake, timeout_s=240)
    finally:
        db.stop()
        sink.stop(commit=False)
        src.stop(release=True)
