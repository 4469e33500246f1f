"""A Postgres database under a steady write load, and what "the lake mirrors it" means:
the database mirror's demo (``rayconnect demo --database``), benchmark and test share it.

``MirrorDatabase`` makes tables of a few column types (int, bigint, text, double, bool,
timestamptz, timestamp, numeric(12,2), date, text[], jsonb, int[]; every table keyed by
``id``; a ``note`` and ``marks`` TOASTed in some rows, which updates leave unchanged),
fills them, and runs random transactions of
inserts, updates and deletes at a paced rate on one connection in a thread
(``start``/``pause``/``resume``/``stop``: a Postgres restart must not cut a transaction
whose outcome the caller then cannot know). ``changed_ms`` in every row is the writer's
clock at the change: commit -> visible freshness is the time a reader sees the row minus it.

``rows_of(table)`` is ``SELECT *`` of a table and ``lake_rows`` reads a lake table back (a
Delta table under a folder, or an Iceberg route table of an ``IcebergSink``'s catalog);
``difference`` compares the two through ``normalize`` (timestamps as UTC ISO strings,
whichever type each side gave them), and each lake column's type with ``LAKE_TYPES`` (the
types the source's ``rayconnect.value_schema`` header gives them), and says the first table
that differs, or None.
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import json
import random
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extras
import pyarrow as pa

from rayconnect.config.mirror import CHANGE_FORMAT as MIRROR_CHANGE_FORMAT
from rayconnect.config.mirror import topic_pattern
from rayconnect.demo.local_postgres import PostgresServer

Row = dict[str, Any]
#: where the mirror's tables are: a folder of Delta tables, or the routed Iceberg sink (its
#: catalog's namespace)
Lake = Any  # Path | rc.IcebergSink (not imported here: the demo imports this module early)

COLUMNS = (
    "id int PRIMARY KEY, name text, qty int, total bigint, price double precision, ok boolean, "
    "at timestamptz, changed_ms bigint, amount numeric(12,2), day date, local_at timestamp, "
    "tags text[], doc jsonb, note text, marks int[]"
)
#: each column's type in the lake (Delta and Iceberg read back as Arrow; list item names and
#: a timestamp's UTC spelling aside): the types the source's header gives them
LAKE_TYPES: dict[str, pa.DataType] = {
    "id": pa.int32(),
    "name": pa.string(),
    "qty": pa.int32(),
    "total": pa.int64(),
    "price": pa.float64(),
    "ok": pa.bool_(),
    "at": pa.timestamp("us", tz="UTC"),
    "changed_ms": pa.int64(),
    "amount": pa.decimal128(12, 2),
    "day": pa.date32(),
    "local_at": pa.timestamp("us"),
    "tags": pa.list_(pa.string()),
    "doc": pa.string(),
    "note": pa.string(),
    "marks": pa.list_(pa.int32()),
}
#: a share of the rows with a ``note`` and ``marks`` big enough to be TOASTed out of line
#: (incompressible, over Postgres's ~2 kB): updates leave them unchanged, so the change
#: events do not carry them (default replica identity) and the sink must keep the table's
BIG_SHARE = 0.2
#: array elements that need quoting and escaping in Postgres's text form
_TAGS = ["a", "b c", "x,y", 'q"t', "{brace}", "back\\slash", "NULL", "é"]
KEYS = 400  # per table: inserts, updates and deletes keep hitting the same keys


def table_name(i: int) -> str:
    return f"t{i:02d}"


def normalize(value: Any) -> Any:
    """One value as both sides compare it: a timestamp (a datetime, or the ISO string the
    change events carry) as ``YYYY-MM-DDTHH:MM:SS.ffffff`` in UTC; the rest as is."""
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(timespec="microseconds")
    return value


def normalized(rows: Iterable[Row], columns: Iterable[str]) -> dict[Any, Row]:
    cols = tuple(columns)
    return {r["id"]: {c: normalize(r.get(c)) for c in cols} for r in rows}


class MirrorDatabase:
    """Tables under a paced random write load (see the module docstring): ``tables`` of
    them named t00, t01..., or the ``names`` given."""

    def __init__(
        self,
        server: PostgresServer,
        tables: int = 20,
        seed: int = 11,
        names: Sequence[str] | None = None,
    ) -> None:
        self.server = server
        self.names = list(names) if names is not None else [table_name(i) for i in range(tables)]
        self.rng = random.Random(seed)
        self.changes = 0
        self.transactions = 0
        #: table -> statements committed on it by the load (``create``'s rows not counted)
        self.changes_by_table: collections.Counter[str] = collections.Counter()
        self._run = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _connect(self) -> Any:
        conn = psycopg2.connect(self.server.password_dsn, options="-c TimeZone=UTC")
        conn.autocommit = False
        return conn

    def create(self, rows_per_table: int = 100) -> None:
        conn = self._connect()
        with conn, conn.cursor() as cur:
            for name in self.names:
                cur.execute(f"CREATE TABLE {name} ({COLUMNS})")
                for key in range(rows_per_table):
                    self._insert(cur, name, key)
        conn.close()

    def _values(self, key: int) -> tuple[Any, ...]:
        rng = self.rng
        at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            microseconds=rng.randrange(10**13)
        )
        tags = [rng.choice([*_TAGS, None]) for _ in range(rng.randrange(0, 4))]
        doc = {"k": rng.randrange(100), "s": rng.choice(_TAGS), "n": [1, None, 2.5]}
        return (
            key,
            rng.choice(["a", "b", "héllo", "x" * rng.randrange(1, 40), None]),
            rng.randrange(-1000, 1000),
            rng.randrange(-(2**40), 2**40),
            rng.choice([rng.uniform(-1e6, 1e6), 0.5, None]),
            rng.choice([True, False, None]),
            rng.choice([at, None]),
            int(time.time() * 1000),
            rng.choice([decimal.Decimal(rng.randrange(-(10**11), 10**11)) / 100, None]),
            rng.choice([dt.date(2026, 1, 1) + dt.timedelta(days=rng.randrange(-9999, 9999)), None]),
            rng.choice([at.replace(tzinfo=None), None]),
            rng.choice([tags if any(t is not None for t in tags) else [], None]),
            rng.choice([json.dumps(doc), None]),
            *self._big(),
        )

    def _big(self) -> tuple[str | None, list[int | None] | None]:
        """(note, marks): TOASTed values for ``BIG_SHARE`` of the rows, else small ones."""
        rng = self.rng
        if rng.random() < BIG_SHARE:
            letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/"
            note = "".join(rng.choice(letters) for _ in range(6000))
            return note, [rng.randrange(-(2**31), 2**31) for _ in range(1500)]
        return rng.choice(["short", None]), rng.choice([[1, None, 3], None])

    def _insert(self, cur: Any, name: str, key: int) -> None:
        cur.execute(
            f"INSERT INTO {name} VALUES ({', '.join(['%s'] * 15)}) "
            "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, qty = EXCLUDED.qty, "
            "total = EXCLUDED.total, price = EXCLUDED.price, ok = EXCLUDED.ok, "
            "at = EXCLUDED.at, changed_ms = EXCLUDED.changed_ms, amount = EXCLUDED.amount, "
            "day = EXCLUDED.day, local_at = EXCLUDED.local_at, tags = EXCLUDED.tags, "
            "doc = EXCLUDED.doc",  # note and marks: kept (an unchanged TOAST value)
            self._values(key),
        )

    def _one_transaction(self, cur: Any) -> list[str]:
        """Run one transaction's statements; the table of each."""
        rng = self.rng
        touched = []
        for _ in range(rng.randrange(1, 6)):
            name, key = rng.choice(self.names), rng.randrange(KEYS)
            roll = rng.random()
            if roll < 0.55:
                self._insert(cur, name, key)
            elif roll < 0.85:
                cur.execute(
                    f"UPDATE {name} SET qty = qty + 1, changed_ms = %s WHERE id = %s",
                    (int(time.time() * 1000), key),
                )
            else:
                cur.execute(f"DELETE FROM {name} WHERE id = %s", (key,))
            touched.append(name)
        return touched

    def start(self, changes_per_s: float) -> None:
        """Run transactions at about ``changes_per_s`` statements a second until ``stop``
        (again after a ``stop``: ``changes`` counts on)."""
        self._stop.clear()

        def loop() -> None:
            conn = None  # dropped while paused: a Postgres restart ends it
            try:
                next_at = time.monotonic()
                while not self._stop.is_set():
                    if not self._run.is_set():
                        if conn is not None:
                            conn.close()
                            conn = None
                        self._idle.set()
                        self._run.wait(0.1)
                        next_at = time.monotonic()
                        continue
                    self._idle.clear()
                    if conn is None:
                        conn = self._connect()
                    with conn.cursor() as cur:
                        touched = self._one_transaction(cur)
                    conn.commit()
                    self.changes += len(touched)
                    self.changes_by_table.update(touched)
                    self.transactions += 1
                    next_at += len(touched) / changes_per_s
                    time.sleep(max(0.0, next_at - time.monotonic()))
            except BaseException as e:  # the caller asserts none happened
                self.error = e
            finally:
                self._idle.set()
                if conn is not None:
                    conn.close()

        self._run.set()
        self._thread = threading.Thread(target=loop, name="pg-mirror-load", daemon=True)
        self._thread.start()

    def truncate(self, name: str, then_insert: int = 0) -> None:
        """``TRUNCATE name`` while the load runs, then ``then_insert`` rows in the same
        transaction (changes after the truncate that share its commit)."""
        conn = self._connect()
        try:
            with conn, conn.cursor() as cur:
                cur.execute(f"TRUNCATE {name}")
                for key in range(then_insert):
                    cur.execute(
                        f"INSERT INTO {name} (id, name, changed_ms) VALUES (%s, %s, %s)",
                        (KEYS + key, "after the truncate", int(time.time() * 1000)),
                    )
        finally:
            conn.close()

    def pause(self) -> None:
        """No transaction open when this returns (a Postgres restart may follow)."""
        self._run.clear()
        if not self._idle.wait(30):
            raise TimeoutError("the write load did not pause")

    def resume(self) -> None:
        self._run.set()

    def stop(self) -> None:
        """End the load; raises the error that ended it early, if one did."""
        self._stop.set()
        self._run.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.error is not None:
            raise RuntimeError(f"the write load failed: {self.error!r}") from self.error

    def rows_of(self, name: str) -> list[Row]:
        """``SELECT *`` of one table (jsonb as its text, as the lake holds it)."""
        conn = self._connect()
        psycopg2.extras.register_default_jsonb(conn, loads=lambda text: text)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM {name} ORDER BY id")
                cols = [d.name for d in cur.description]
                return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        finally:
            conn.close()

    def columns(self) -> list[str]:
        return list(LAKE_TYPES)


def lake_rows(lake: Lake, table: str) -> list[Row]:
    """The rows of the Delta table ``lake/table``, or of route table ``table`` of the
    Iceberg sink ``lake`` ([] before its first commit)."""
    return lake_table(lake, table).to_pylist()


def lake_table(lake: Lake, table: str) -> pa.Table:
    """The Delta table ``lake/table``, or route table ``table`` of the Iceberg sink
    ``lake``, as Arrow (an empty table before its first commit)."""
    from deltalake import DeltaTable

    from rayconnect.config.sink import IcebergSink
    from rayconnect.storage.delta_reads import delta_dataset
    from rayconnect.storage.location import TableLocation

    if isinstance(lake, IcebergSink):
        return _iceberg_table(lake, table)
    path = lake / table
    if not (path / "_delta_log").exists():
        return pa.table({})
    location = TableLocation.parse(str(path))
    return delta_dataset(DeltaTable(str(path)), location).to_table()


def _iceberg_table(sink: Any, table: str) -> pa.Table:
    from pyiceberg.exceptions import NoSuchTableError

    from rayconnect.tables.factory import iceberg_committer

    route = sink.route_table(table)
    try:
        found = iceberg_committer(route, "mirror-check", None).catalog().load_table(route.table)
    except NoSuchTableError:
        return pa.table({})
    return found.scan().to_arrow()


def type_difference(schema: pa.Schema) -> str | None:
    """None if every column of ``LAKE_TYPES`` the lake table has is of its type (Iceberg's
    ``+00:00`` is UTC); else the columns that are not."""
    from rayconnect.formats.evolution import normalize_type

    def spelled(t: pa.DataType) -> pa.DataType:
        t = normalize_type(t)
        if pa.types.is_timestamp(t) and t.tz in ("+00:00", "UTC"):
            return pa.timestamp(t.unit, tz="UTC")
        return t

    wrong = {
        name: f"{schema.field(name).type} (want {want})"
        for name, want in LAKE_TYPES.items()
        if name in schema.names and spelled(schema.field(name).type) != want
    }
    return f"column types: {wrong}" if wrong else None


def table_difference(db: MirrorDatabase, lake: Lake, table: str) -> str | None:
    """None if the lake table equals ``SELECT *`` of its Postgres table, values and
    types; else how not."""
    cols = db.columns()
    want = normalized(db.rows_of(table), cols)
    read = lake_table(lake, table)
    if read.num_rows and (problem := type_difference(read.schema)) is not None:
        return f"{table}: {problem}"
    rows = read.to_pylist()
    got = normalized(rows, cols)
    if len(rows) != len(got):
        return f"{table}: {len(rows) - len(got)} keys twice in the lake"
    if got == want:
        return None
    missing = sorted(set(want) - set(got))[:5]
    extra = sorted(set(got) - set(want))[:5]
    changed = [k for k in want if k in got and got[k] != want[k]][:3]
    detail = [(want[k], got[k]) for k in changed[:1]]
    return (
        f"{table}: {len(got)} rows in the lake, {len(want)} in Postgres; missing "
        f"{missing}, extra {extra}, changed {changed} {detail}"
    )


def difference(db: MirrorDatabase, lake: Lake) -> str | None:
    """None once every lake table equals its Postgres table; else the first difference."""
    for table in db.names:
        if (problem := table_difference(db, lake, table)) is not None:
            return problem
    return None


def wait_mirrored(db: MirrorDatabase, lake: Lake, timeout_s: float) -> str | None:
    """Check every 2 s until the lake mirrors the database: None, or the last difference
    seen when ``timeout_s`` ran out."""
    deadline = time.monotonic() + timeout_s
    problem: str | None = "never checked"
    while time.monotonic() < deadline:
        problem = difference(db, lake)
        if problem is None:
            return None
        time.sleep(2.0)
    return problem


#: how the mirror's sink decodes the source's records (``KafkaSource`` settings): the
#: mirror's (``config.mirror``), keyed by the JSON key's ``id``
CHANGE_FORMAT: dict[str, Any] = {**MIRROR_CHANGE_FORMAT, "key_schema": {"id": "long"}}


def mirror_source(
    name: str, server: PostgresServer, bootstrap: str, tables: Sequence[str], prefix: str
) -> Any:
    """The source half of a mirror: every change of ``tables`` into ``<prefix>.public.<t>``
    (2 partitions each, created here), exactly once."""
    import asyncio

    import rayconnect as rc
    from rayconnect.kafka.admin import create_topic

    async def topics() -> None:
        for t in tables:
            await create_topic(bootstrap, f"{prefix}.public.{t}", 2, exist_ok=True)

    asyncio.run(topics())
    task = rc.PostgresSource(
        dsn=server.dsn,
        slot=name.replace("-", "_"),
        tables=list(tables),
        topic_prefix=prefix,
        password_file=server.password_file,
    )
    return rc.SourcePipeline(
        name,
        task=task,
        target=rc.KafkaTarget(bootstrap),
        transaction_boundary="connector",
        exactly_once="required",
    )


def mirror_sink(
    name: str,
    bootstrap: str,
    lake: Path,
    prefix: str,
    iceberg: bool = False,
    upsert_mode: str | None = None,
    **settings: Any,
) -> Any:
    """The sink half: ONE pipeline whose topic-pattern route upserts each table's change
    events into ``lake/<table>`` (Delta), or with ``iceberg`` into ``<prefix>.<table>`` of
    the embedded SQL catalog in the warehouse ``lake``; each made at its first record.
    ``upsert_mode``: the sink's (None: the table kind's default); ``settings``: the
    SinkPipeline's (commit_interval_s, spark...)."""
    import rayconnect as rc

    pattern = topic_pattern(prefix)
    source = rc.KafkaSource(
        rc.SingleClusterMetadataService(bootstrap, topic_pattern=pattern),
        **CHANGE_FORMAT,
        discovery_interval_s=2.0,
    )
    routes = rc.Routes(rules=(rc.Route(table="{1}", topic_pattern=pattern),))
    upsert: dict[str, Any] = {"write_mode": "upsert", "key_columns": ("id",), "routes": routes}
    if upsert_mode is not None:
        upsert["upsert_mode"] = upsert_mode
    if iceberg:
        sink: Any = rc.IcebergSink(f"{prefix}.unrouted", warehouse=str(lake), **upsert)
    else:
        sink = rc.DeltaSink(str(lake), **upsert)
    return rc.SinkPipeline(name, source, sink, **settings)
