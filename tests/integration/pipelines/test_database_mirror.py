"""A whole Postgres database mirrored into the lake, end to end, exactly once (issue 27.5).

20 tables under a steady write load (rayconnect.demo.mirror_database) -> the Postgres change
source (one topic per table, Debezium events, exactly once) -> Kafka -> ONE sink pipeline
whose topic-pattern route gives every topic its own upsert table, made on the fly. Every
role of both pipelines is killed during the load (ray.kill and SIGKILL: the source task; the
sink's coordinator, writer, a participant host and a reader), two tables are truncated
mid-stream (one alone, one followed by inserts in the same transaction), the broker between
the pipelines is restarted (tansu on S3 storage, SIGTERM and start: the source commits only
what the broker confirmed it stored, see test_source_outages) and so is Postgres; at the end
every lake table equals ``SELECT *`` of its Postgres table, row for row - the truncated ones
emptied in the lake too, not dead letters - and each truncated table's topic holds exactly
one marked truncate event in each of its partitions, through the source's kills. Into Delta tables in the default run; into
Iceberg tables (the embedded SQL catalog: commits one table at a time) in the ``slow``
group.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from rayconnect.actors import names
from rayconnect.demo.local_postgres import PostgresServer
from rayconnect.demo.mirror_database import (
    MirrorDatabase,
    mirror_sink,
    mirror_source,
    wait_mirrored,
)
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.kafka.read_back import read_to_high_watermarks

pytestmark = [pytest.mark.usefixtures("ray_session")]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "lake_format",
    ["delta", "delta-merge-on-read", pytest.param("iceberg", marks=pytest.mark.slow)],
)
def test_a_database_of_20_tables_mirrored_through_kills_of_both_sides(
    postgres: PostgresServer,
    durable_broker: EmbeddedBroker,
    tmp_path: Path,
    kill: Any,
    lake_format: str,
) -> None:
    bootstrap = durable_broker.bootstrap_servers
    db = MirrorDatabase(postgres, tables=20)
    db.create(rows_per_table=100)
    lake = tmp_path / "lake"
    src = mirror_source("mirror-src", postgres, bootstrap, db.names, "db").start()
    iceberg = lake_format == "iceberg"  # merge-on-read, Iceberg's default
    mode = "merge_on_read" if lake_format == "delta-merge-on-read" else None
    pipeline = mirror_sink("mirror", bootstrap, lake, "db", iceberg, mode, commit_interval_s=2)
    sink = pipeline.start()
    try:
        db.start(changes_per_s=300)
        sink.wait_for(lambda s: s["records_committed_since_start"] > 0, 240, 0.5)
        victims = [
            (names.task("mirror-src", 0), "ray.kill"),
            (names.coordinator("mirror"), "sigkill"),
            (_one_of("mirror/participants/"), "sigkill"),
            (names.writer("mirror"), "sigkill"),
            (_one_of("mirror/reader/"), "ray.kill"),
            (names.task("mirror-src", 0), "sigkill"),
            (names.coordinator("mirror"), "ray.kill"),
        ]
        for n, (victim, how) in enumerate(victims):
            time.sleep(3.0)
            kill(victim, how)
            if n == 1:  # mid-stream, the load running: table changes on both partitions
                db.truncate("t03")
                db.truncate("t07", then_insert=5)
        durable_broker.restart(grace=5.0)  # under both: the source writing, the sink reading
        time.sleep(3.0)
        db.pause()
        postgres.restart()
        db.resume()
        time.sleep(5.0)
        db.stop()
        assert db.changes > 1000
        assert wait_mirrored(db, pipeline.config.sink if iceberg else lake, 240) is None
        # caught up, every partition shows lag 0: the commit markers that end the
        # source's transactions are not records (the sink's offsets pass them)
        status = sink.wait_for(
            lambda s: s.partition_status
            and all(p.lag == 0 and p.state == "ok" for p in s.partition_status.values()),
            60,
            1.0,
        )
        assert len(status.partition_status) == 2 * len(db.names)
        if not iceberg:  # the truncates were applied, not dead-lettered: no dead letter at all
            assert not any((lake / t / DEAD_LETTER_DIR / "_delta_log").exists() for t in db.names)
        marker = [("rayconnect.truncate", b"partition")]
        for table in ("t03", "t07"):  # one copy per partition, exactly once
            assert asyncio.run(_truncates(bootstrap, f"db.public.{table}")) == {
                0: [marker],
                1: [marker],
            }
    finally:
        db.stop()
        sink.stop(commit=False)
        src.stop(release=True)


async def _truncates(bootstrap: str, topic: str) -> dict[int, list[list]]:
    """Partition -> the headers of each truncate event (op t) it holds, read_committed."""
    found: dict[int, list[list]] = {}
    async for r in read_to_high_watermarks(bootstrap, topic):
        if r.value is not None and b'"op":"t"' in r.value:
            found.setdefault(r.partition, []).append(list(r.headers))
    return found


def _one_of(prefix: str) -> str:
    """The name of one live actor whose name starts with ``prefix`` (the mirror's 20 topics
    share participant hosts by topic group: which host holds which topic is the
    pipeline's choice at start, so the test picks a live one)."""
    found = sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix)
    )
    assert found, f"no actor named {prefix}*"
    return found[0]
