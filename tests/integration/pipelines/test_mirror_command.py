"""``rc.Mirror`` and ``rayconnect status/stop NAME`` of a mirror (issue 42.1), on a real
Postgres, a real broker, Ray and Spark: the two pipelines of a database mirror started,
watched and stopped as one.

One test, three acts (a Spark pipeline start is the cost; each act reuses what the one before
left): the mirror on its own embedded broker, every table of schema public listed at start,
under writes, stopped by ``rayconnect stop NAME`` - every lake table equal to ``SELECT *`` and
the slot kept; started again on that broker given as ``kafka`` (resumes from the slot and
the tables), more writes, ``stop NAME --drop-slot`` - equal again, slot and the mirror's
publication gone.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import polars as pl
import psycopg2
import pytest

import rayconnect as rc
from rayconnect.cli import main
from rayconnect.demo.local_postgres import PostgresServer
from rayconnect.demo.mirror_database import MirrorDatabase, difference
from rayconnect.pipelines.mirror import find_mirror

pytestmark = [pytest.mark.usefixtures("ray_session")]


def _catalog(server: PostgresServer, sql: str) -> list[tuple[object, ...]]:
    conn = psycopg2.connect(server.password_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def _execute(server: PostgresServer, *statements: str) -> None:
    conn = psycopg2.connect(server.password_dsn)
    try:
        with conn, conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def _lines(lake: Path) -> set[tuple[object, ...]]:
    """The lake's ``lines`` table as (order_id, line, qty) rows (each key once)."""
    import polars as pl

    rows = pl.read_delta(str(lake / "lines")).select("order_id", "line", "qty").rows()
    assert len(rows) == len({r[:2] for r in rows}), "a key is in the table twice"
    return set(rows)


def _caught_up_lags(
    capsys: pytest.CaptureFixture[str], timeout_s: float, count: int = 0
) -> dict[str, object]:
    """Each sink partition's and lake table's lag as ``rayconnect status pgm --json`` prints
    them, once every one is 0 (the last print when ``timeout_s`` ran out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert main(["status", "pgm", "--json"]) == 0
        out = capsys.readouterr().out  # the JSON line (Ray's worker logs may precede it)
        sink = json.loads(out.strip().splitlines()[-1])["sink"] or {}
        lags = {k: p.get("lag") for k, p in sink.get("partition_status", {}).items()}
        # each lake table's too: its partitions end in commit markers, which no file holds
        lags |= {name: t.get("lag") for name, t in sink.get("tables", {}).items()}
        caught_up = lags and set(lags.values()) == {0} and len(lags) >= count
        if caught_up or time.monotonic() > deadline:
            return lags
        time.sleep(1.0)


@pytest.mark.timeout(420)
def test_a_mirror_starts_stops_resumes_and_drops_its_slot_as_one(
    postgres: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = MirrorDatabase(postgres, tables=3)
    db.create(rows_per_table=50)
    lake = tmp_path / "lake"
    settings = {
        "to": str(lake),
        "password_file": postgres.password_file,
        "commit": rc.CommitSettings(commit_interval_s=1.0, write_timeout_s=10),
        "discovery_interval_s": 1.0,  # a table added mid-run: found by both pipelines soon
    }
    with pytest.raises(rc.ConfigError, match=r"tables: public.nope does not exist"):
        rc.Mirror("pgm", postgres.url, tables=["nope"], **settings).check()
    # each table is keyed by its own primary key (a composite one here); one without a
    # primary key is refused before anything starts, naming it
    _execute(
        postgres,
        "CREATE TABLE lines (order_id int, line smallint, qty int, PRIMARY KEY (order_id, line))",
        "INSERT INTO lines SELECT g / 3, g % 3, g FROM generate_series(0, 89) g",
        "CREATE TABLE keyless (a int)",
    )
    with pytest.raises(rc.ConfigError, match=r"tables: public.keyless has no primary key"):
        rc.Mirror("pgm", postgres.url, **settings).check()
    _execute(postgres, "DROP TABLE keyless")

    handle = rc.Mirror("pgm", postgres.url, **settings).start()  # embedded broker
    broker = handle.broker
    assert broker is not None
    try:
        db.start(changes_per_s=150)
        handle.sink.wait_for(lambda s: s.records_committed_since_start > 0, 120, 0.5)
        _execute(
            postgres,
            "UPDATE lines SET qty = -qty WHERE line = 1",
            "DELETE FROM lines WHERE order_id < 5",
            "INSERT INTO lines VALUES (100, 0, 7)",
        )
        # a table created mid-run (the mirror's publication holds schema public: no ALTER
        # PUBLICATION), keyed by its own composite text key, and one re-snapshotted on
        # request, the source task SIGKILLed right after (its snapshots while streaming
        # redone after it); a keyless table created mid-run is refused, named in status
        _execute(
            postgres,
            "CREATE TABLE added (region text, n int, label text, PRIMARY KEY (region, n))",
            "INSERT INTO added SELECT 'r' || g % 4, g, 'v' || g FROM generate_series(1, 400) g",
            "CREATE TABLE loose (a int)",
            "INSERT INTO loose VALUES (1), (2)",
        )
        assert main(["snapshot", "pgm", "lines"]) == 0
        assert main(["snapshot", "pgm", "nope"]) == 2
        capsys.readouterr()
        (task,) = handle.source.status().tasks.values()
        assert task.pid is not None
        os.kill(task.pid, signal.SIGKILL)
        _execute(
            postgres,
            "UPDATE added SET label = 'u' || n WHERE n % 3 = 0",
            "DELETE FROM added WHERE n > 390",
            "UPDATE added SET region = 'moved' WHERE n = 7",
            "UPDATE lines SET qty = qty + 1 WHERE line = 2",
        )
        time.sleep(3)
        db.stop()
        # caught up, `rayconnect status` shows lag 0 on every partition of every table's
        # topic (made by the source with the mirror's 2 partitions): the commit markers that
        # end the source's transactions are not records
        lags = _caught_up_lags(capsys, 90, count=3 * (len(db.names) + 2))
        assert lags and set(lags.values()) == {0}, lags
        assert len(lags) == 3 * (len(db.names) + 2), lags  # 2 partitions, 1 table each
        assert main(["status", "pgm"]) == 0
        out = capsys.readouterr().out
        assert "mirror pgm: source pipeline pgm-source, sink pipeline pgm" in out, out
        for table in db.names:
            assert table in out, out
        (task,) = handle.source.status().tasks.values()
        assert task.source is not None and list(task.source["tables_refused"]) == ["public.loose"]
        assert "public.loose is not captured: it has no primary key" in out, out
        # given a primary key, it is found again: mirrored, its rows snapshotted
        _execute(
            postgres, "ALTER TABLE loose ADD PRIMARY KEY (a)", "UPDATE loose SET a = 5 WHERE a = 2"
        )
        lags = _caught_up_lags(capsys, 90, count=3 * (len(db.names) + 3))
        assert len(lags) == 3 * (len(db.names) + 3), lags

        assert main(["stop", "pgm"]) == 0
        out = capsys.readouterr().out
        assert "stopped mirror pgm" in out and "slot dropped" not in out, out
        assert find_mirror("pgm") is None
        assert difference(db, lake) is None
        assert _lines(lake) == set(_catalog(postgres, "SELECT order_id, line, qty FROM lines"))
        added = pl.read_delta(str(lake / "added")).select("region", "n", "label").rows()
        assert sorted(added) == _catalog(postgres, "SELECT * FROM added ORDER BY region, n")
        loose = pl.read_delta(str(lake / "loose")).select("a").rows()
        assert sorted(loose) == _catalog(postgres, "SELECT a FROM loose ORDER BY a")
        assert _catalog(postgres, "SELECT slot_name FROM pg_replication_slots") == [("pgm",)]

        # its broker lives on here (the test holds it), but a new embedded one would not
        # have the tables' offsets: refused before anything starts
        with pytest.raises(rc.ConfigError, match=r"already holds mirrored tables"):
            rc.Mirror("pgm", postgres.url, **settings).check()
        # again, on the same broker given as Kafka: resumes where it stopped
        again = rc.Mirror("pgm", postgres.url, kafka=broker.bootstrap_servers, **settings).start()
        assert again.broker is None
        db.start(changes_per_s=150)
        time.sleep(4)
        db.stop()
        assert main(["stop", "pgm", "--drop-slot"]) == 0
        out = capsys.readouterr().out
        assert "replication slot dropped" in out, out
        assert difference(db, lake) is None
        assert _catalog(postgres, "SELECT slot_name FROM pg_replication_slots") == []
        assert _catalog(postgres, "SELECT pubname FROM pg_publication") == []
    finally:
        if find_mirror("pgm") is not None:
            rc.MirrorHandle.attach("pgm").stop(commit=False, drain_timeout_s=0)
        broker.stop()
