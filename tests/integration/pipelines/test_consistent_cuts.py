"""Consistent cuts end to end (``commit.consistent_cuts``): a mirror of two tables that every
Postgres transaction changes together, read the way the guide says (``pick_cut``: each
table at its version of the newest cut every table reached), is one database state at
every read - the same value per key in both tables - while the load runs; and equal to
``SELECT *`` at the end. Real Postgres, broker, Ray actors, Delta tables (Iceberg tables in
the slow group). And a sink with cuts over a topic without markers says so in its status."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl
import psycopg2
import pytest
from sink_checks import CLUSTER, Produced, pipeline

import rayconnect as rc
from rayconnect.demo.local_postgres import PostgresServer
from rayconnect.protocol.status import PipelineStatus
from rayconnect.tables.consistent_cut import (
    Cut,
    NoCutError,
    delta_history,
    iceberg_history,
    pick_cut,
)

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(420)]

TABLES = ("pair_a", "pair_b")


def _connect(server: PostgresServer) -> psycopg2.extensions.connection:
    return psycopg2.connect(server.url, password=Path(server.password_file).read_text().strip())


def _write_pairs(server: PostgresServer, stop: threading.Event, counts: list[int]) -> None:
    """Transactions that change both tables alike: the same key's value bumped in each,
    now and then a new key in both."""
    rng = random.Random(7)
    conn = _connect(server)
    try:
        with conn.cursor() as cur:
            next_id = 50
            while not stop.is_set():
                if rng.random() < 0.1:
                    for t in TABLES:
                        cur.execute(f"INSERT INTO {t} VALUES (%s, 0)", (next_id,))
                    next_id += 1
                else:
                    key = rng.randrange(next_id)
                    for t in TABLES:
                        cur.execute(f"UPDATE {t} SET v = v + 1 WHERE id = %s", (key,))
                conn.commit()
                counts[0] += 1
                time.sleep(0.002)
    finally:
        conn.close()


class _Lake:
    """The mirror's two tables, as a reader of cuts sees them (a Delta folder or the
    embedded Iceberg catalog)."""

    def __init__(self, mirror: rc.Mirror, lake: Path) -> None:
        self.lake, self.iceberg = lake, mirror.config.format == "iceberg"
        self.sink = mirror.config.sink_config().sink

    def _table(self, name: str) -> object:
        from rayconnect.tables.factory import iceberg_committer

        route = self.sink.route_table(name)
        return iceberg_committer(route, "cuts-check", None).catalog().load_table(route.table)

    def cut(self) -> Cut | None:
        try:
            if self.iceberg:
                return pick_cut({t: iceberg_history(self._table(t)) for t in TABLES})
            if not all((self.lake / t / "_delta_log").exists() for t in TABLES):
                return None  # a table not made yet
            return pick_cut({t: delta_history(str(self.lake / t)) for t in TABLES})
        except NoCutError:
            return None
        except Exception as e:  # an Iceberg table not made yet
            if self.iceberg and type(e).__name__ == "NoSuchTableError":
                return None
            raise

    def rows(self, table: str, version: int) -> dict[int, int]:
        if self.iceberg:
            frame = pl.from_arrow(self._table(table).scan(snapshot_id=version).to_arrow())
        else:
            frame = pl.read_delta(str(self.lake / table), version=version)
        assert isinstance(frame, pl.DataFrame)
        return dict(frame.select("id", "v").rows())


def _database(server: PostgresServer, table: str) -> dict[int, int]:
    conn = _connect(server)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, v FROM {table}")
            return dict(cur.fetchall())
    finally:
        conn.close()


def _diagnosis(handle: Any, lake: Path) -> str:
    """What a stalled run looked like: the sink's cut and partitions, the source's tasks, the
    lake's newest versions and their cuts (a rare CI failure saw no cut at all)."""
    parts: list[str] = []
    for name, look in (
        ("sink", lambda: _sink_state(handle.sink.status())),
        ("source", lambda: handle.source.status()),
        ("lake", lambda: {t: delta_history(str(lake / t))[-5:] for t in TABLES}),
    ):
        try:
            parts.append(f"{name}: {look()}")
        except Exception as e:  # the diagnosis must not hide the failure
            parts.append(f"{name}: ({e!r})")
    return "; ".join(parts)[:6000]


def _sink_state(status: Any) -> str:
    each = {
        k: (p.committed_offset, p.high_watermark, p.state)
        for k, p in status.partition_status.items()
    }
    return f"committed_cut={status.committed_cut} records={status.records_committed_since_start} {each}"


# The Delta run is in the slow group too, until the known stall of cuts under load is fixed
# (docs/guides/database-mirror.md, "Known problem"): a partial commit leaves partitions
# paused and no cut is taken again. The failure message carries the diagnosis.
@pytest.mark.parametrize(
    "lake_format",
    [
        pytest.param("delta", marks=pytest.mark.slow),
        pytest.param("iceberg", marks=pytest.mark.slow),
    ],
)
def test_every_cut_a_reader_picks_is_one_state_of_the_database(
    postgres: PostgresServer, tmp_path: Path, lake_format: str
) -> None:
    conn = _connect(postgres)
    with conn.cursor() as cur:
        for t in TABLES:
            cur.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v bigint NOT NULL)")
            cur.execute(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(0, 49) g")
    conn.commit()
    conn.close()
    lake = tmp_path / "lake"
    mirror = rc.Mirror(
        "cuts",
        postgres.url,
        to=str(lake),
        format=lake_format,
        tables=list(TABLES),
        password_file=postgres.password_file,
        commit=rc.CommitSettings(commit_interval_s=1.0, write_timeout_s=30, consistent_cuts=True),
    )
    reader = _Lake(mirror, lake)
    handle = mirror.start()
    stop, counts = threading.Event(), [0]
    writer = threading.Thread(target=_write_pairs, args=(postgres, stop, counts), daemon=True)
    try:
        writer.start()
        seen: dict[int, int] = {}  # cut LSN -> keys in it
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline or len(seen) < 3:
            if time.monotonic() > deadline + 120:
                pytest.fail(f"only {len(seen)} cuts in 135 s; {_diagnosis(handle, lake)}")
            cut = reader.cut()
            if cut is not None and cut.lsn not in seen:
                a = reader.rows("pair_a", cut.versions["pair_a"])
                b = reader.rows("pair_b", cut.versions["pair_b"])
                assert a == b, f"cut {cut}: tables differ on {set(a.items()) ^ set(b.items())}"
                seen[cut.lsn] = len(a)
            time.sleep(0.3)
        stop.set()
        writer.join(30)
        assert counts[0] > 1000, counts
        assert sum(seen.values()) > 0 and max(seen.values()) >= 50, seen
        # caught up: the newest cut is the database
        want = {t: _database(postgres, t) for t in TABLES}
        end = time.monotonic() + 120
        while True:
            cut = reader.cut()
            got = {t: reader.rows(t, cut.versions[t]) for t in TABLES} if cut is not None else None
            if got == want:
                break
            assert time.monotonic() < end, "the newest cut never reached the database"
            time.sleep(1)
        status = handle.sink.status()
        assert status.records_committed_since_start >= 2 * counts[0]
        # the coordinator's last cut (once it heard the round's commit landed): the reader's
        lsn = cut.lsn if cut is not None else 0
        handle.sink.wait_for(lambda s: (s.committed_cut or -1) >= lsn, timeout_s=30)
    finally:
        stop.set()
        handle.stop()


@pytest.mark.timeout(150)
def test_a_topic_without_cut_markers_is_said_in_the_status(kafka_broker, tmp_path: Path) -> None:
    """Consistent cuts over a topic whose producer writes no cut markers: the records are
    held round after round and never committed - the partition's status says why."""
    topic = "no-markers"
    produced = Produced(kafka_broker.bootstrap_servers, topic, 1)
    produced.more(20)
    key = f"{CLUSTER}/{topic}/0"
    sink = pipeline(
        "no-markers",
        kafka_broker.bootstrap_servers,
        topic,
        tmp_path / "t",
        commit_interval_s=1.0,
        consistent_cuts=True,
    )
    handle = sink.start()

    def said(status: PipelineStatus) -> bool:
        part = status.partition_status.get(key)
        return part is not None and part.state == "no_cut_markers"

    try:
        status = handle.wait_for(said, timeout_s=90)
        reason = status.partition_status[key].reason or ""
        assert "20 records held" in reason and "does the source write cut markers" in reason
        assert status.offsets.get(key) is None  # nothing of it committed
        assert status.committed_cut is None
    finally:
        handle.stop(commit=False)
