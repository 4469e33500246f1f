"""A whole Postgres database mirrored into the lake, end to end, exactly once (issue 27.5).

20 tables under a steady write load (rayconnect.mirror_database) -> the Postgres change
source (one topic per table, Debezium events, exactly once) -> Kafka -> ONE sink pipeline
whose topic-pattern route gives every topic its own upsert table, made on the fly. Roles of
both pipelines are killed (ray.kill and SIGKILL) and Postgres is restarted during the load,
and two tables are truncated mid-stream (one alone, one followed by inserts in the same
transaction); at the end every lake table equals ``SELECT *`` of its Postgres table, row for
row - the truncated ones emptied in the lake too, not dead letters.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rayconnect.actors import names
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.local_postgres import PostgresServer
from rayconnect.mirror_database import MirrorDatabase, mirror_sink, mirror_source, wait_mirrored

pytestmark = [pytest.mark.usefixtures("ray_session")]


@pytest.mark.timeout(900)
def test_a_database_of_20_tables_mirrored_through_kills_of_both_sides(
    postgres: PostgresServer, kafka_broker, tmp_path: Path, kill: Any
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    db = MirrorDatabase(postgres, tables=20)
    db.create(rows_per_table=100)
    lake = tmp_path / "lake"
    src = mirror_source("mirror-src", postgres, bootstrap, db.names, "db").start()
    sink = mirror_sink("mirror", bootstrap, lake, "db", commit_interval_s=2).start()
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
        for n, (victim, how) in enumerate(victims):
            time.sleep(4.0)
            kill(victim, how)
            if n == 1:  # mid-stream, the load running: table changes on both partitions
                db.truncate("t03")
                db.truncate("t07", then_insert=5)
        db.pause()
        postgres.restart()
        db.resume()
        time.sleep(5.0)
        db.stop()
        assert db.changes > 1000
        assert wait_mirrored(db, lake, timeout_s=240) is None
        # the truncates were applied, not dead-lettered: no dead letter at all
        assert not any((lake / t / DEAD_LETTER_DIR / "_delta_log").exists() for t in db.names)
    finally:
        db.stop()
        sink.stop(commit=False)
        src.stop(release=True)
