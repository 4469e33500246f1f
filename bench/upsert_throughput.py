"""Upsert tables (issue 26): change events into a keyed Delta table, rayconnect vs a
one-process baseline, and the cost of one round by table size and files touched.

    .venv/bin/python bench/upsert_throughput.py [--keys 1000000] [--events 2000000]
                                                [--round-rows 1000000,10000000] [--only stream,round]
    .venv/bin/python bench/upsert_throughput.py --only iceberg [--iceberg-events 100000]
                                                [--slow-events 200000]
    .venv/bin/python bench/upsert_throughput.py --only delta-mor [--delta-keys 10000000]

**stream**: a table of ``--keys`` keys (loaded by a rayconnect upsert pipeline from a topic of
inserts, not measured), then ``--events`` change events - 70% updates of a live key, 20%
inserts of a new key, 10% deletes (tombstones) of a live key - JSON values of 10 fields,
JSON keys ``{"id": k}``, partition = key % ``--partitions``, already in the broker. Each
contender upserts them into its own copy of the loaded table, back to back in one run:

- baseline: one process (``baseline`` sub-command of this script): aiokafka -> ``json.loads``
  of key and value -> ``rayconnect.write_modes.fold`` (last change per key) -> one delta-rs
  ``merge`` per 50k events (or 5 s) with the batch's txn ids (``CommitProperties(
  app_transactions=...)``, app id ``<topic>/<partition>``, version = next offset);
- rayconnect with its defaults, and tuned (``commit_interval_s=30``,
  ``commit_when_caught_up``): fewer, larger rounds, each one MERGE.

events/s = events / (commit time of the last version - pipeline ready, ``start()``
returned); the rate from ``start()`` called (start-up included) beside it. Every table is
checked at the end (read with what applies deletes: delta-rs ``QueryBuilder``, pyiceberg
``scan``): its keys and their versions equal the stream's final state.

**round**: one round of 100k changes (same mix) merged (``write_modes.delta_merge.merge_round``,
what the committer runs) into tables of ``--round-rows`` rows written in files of
``--file-rows`` rows sorted by key, with the round's keys clustered (one contiguous key
range: few files) or random (every file): seconds and delta-rs's files/rows rewritten.

**iceberg**: the same stream (``--iceberg-events`` changes, default 100k) into a ``--keys``-key
Iceberg table (embedded SQL catalog, local warehouse), the table loaded by a rayconnect upsert
pipeline (not measured) and copied for the other contenders. Contenders, back to back: the
baseline (``baseline-iceberg`` sub-command: aiokafka -> fold -> one pyiceberg transaction per
50k events or 5 s: ``write_modes.iceberg_upsert.upsert_round`` - the key's DELETE + APPEND -
plus the batch's offsets as a table property), rayconnect with ``upsert_mode="copy_on_write"``
and rayconnect with its defaults (merge-on-read). The two slow ones (a few k events/s) consume
only the first ``--slow-events`` (200k) changes (a topic of their own holding them) and are
checked against the state after those; rayconnect's defaults take the whole stream.

**delta-mor**: the same stream (``--events``) into a ``--delta-keys``-key (10M) Delta table,
loaded by a copy-on-write upsert pipeline (timed) and copied for each contender: rayconnect's
defaults (copy-on-write) and ``upsert_mode="merge_on_read"`` (deletion vectors).

Every scenario stops (KeyboardInterrupt) when less than ``--min-available-gib`` (5) of the
machine's memory is left.

Prints a markdown table and writes it to ``bench/results/upsert/`` (``.md`` and ``.json``,
named after the scenarios run, or ``--name``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: the value's 10 fields, declared to rayconnect (nothing inferred) and built by ``_value``
VALUE_SCHEMA = {
    "id": "long",
    "name": "string",
    "amount": "long",
    "price": "double",
    "currency": "string",
    "country": "string",
    "paid": "boolean",
    "qty": "long",
    "note": "string",
    "version": "long",
}
KEY_SCHEMA = {"id": "long"}
SOURCE = dict(
    value_format="json",
    value_schema=VALUE_SCHEMA,
    key_format="json",
    key_schema=KEY_SCHEMA,
    include_key=True,
)
RC_SETTINGS = {
    "defaults": {},
    "tuned": dict(commit_interval_s=30.0, commit_when_caught_up=True),
}
#: the load of the initial table: as fast as it goes, not measured
RC_LOAD = dict(commit_interval_s=30.0, commit_when_caught_up=True)
RESULTS = Path(__file__).resolve().parent / "results" / "upsert"


def _value(key: int, version: int) -> bytes:
    return json.dumps(
        {
            "id": key,
            "name": f"customer-{key}",
            "amount": (key * 37 + version) % 10_000,
            "price": round((key % 997) * 1.25 + version, 2),
            "currency": ("EUR", "USD", "GBP")[key % 3],
            "country": ("DE", "FR", "US", "GB", "JP")[(key + version) % 5],
            "paid": (key + version) % 2 == 0,
            "qty": version % 100,
            "note": "n" * (key % 20),
            "version": version,
        }
    ).encode()


class ChangeLog:
    """The change events and the state they leave: ``live`` keys -> their last version."""

    def __init__(self, keys: int, seed: int = 26) -> None:
        self.rng = np.random.default_rng(seed)
        self.live = list(range(keys))  # random choice of a live key: swap-remove on delete
        self.where = {k: k for k in self.live}
        self.next_key = keys
        self.version: dict[int, int] = dict.fromkeys(self.live, 0)

    def changes(self, n: int) -> list[tuple[int, bytes | None]]:
        """``n`` changes (key, value or None for a delete), the state following them."""
        kinds = self.rng.random(n)
        picks = self.rng.random(n)
        out: list[tuple[int, bytes | None]] = []
        for i in range(n):
            if kinds[i] < 0.2:  # insert a new key
                k = self.next_key
                self.next_key += 1
                self.where[k] = len(self.live)
                self.live.append(k)
            else:
                k = self.live[int(picks[i] * len(self.live))]
            if kinds[i] >= 0.9:  # delete a live key
                at, last = self.where.pop(k), self.live.pop()
                if last != k:
                    self.live[at], self.where[last] = last, at
                del self.version[k]
                out.append((k, None))
            else:
                v = self.version.get(k, -1) + 1
                self.version[k] = v
                out.append((k, _value(k, v)))
        return out


def _produce_both(
    bootstrap: str, partitions: int, initial: list, changes: list, out: dict[str, Any]
) -> tuple[dict[int, int], dict[int, int]]:
    """The table's initial records into topic ``load``, then the changes into ``changes``
    (each list emptied once produced: the big ones are not held twice); the seconds taken
    in ``out["produce_s"]``. Returns both topics' counts per partition."""
    t = time.monotonic()
    load_counts = asyncio.run(_produce(bootstrap, "load", partitions, initial))
    initial.clear()
    counts = asyncio.run(_produce(bootstrap, "changes", partitions, changes))
    changes.clear()
    out["produce_s"] = time.monotonic() - t
    print(f"produced in {out['produce_s']:.0f} s", file=sys.stderr)
    return load_counts, counts


async def _produce(bootstrap: str, topic: str, partitions: int, changes: list) -> dict[int, int]:
    from aiokafka import AIOKafkaProducer

    from rayconnect.kafka.admin import create_topic

    await create_topic(bootstrap, topic, partitions)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=64 * 1024, acks="all"
    )
    await producer.start()
    counts = dict.fromkeys(range(partitions), 0)
    try:
        pending = []
        for key, value in changes:
            p = key % partitions
            pending.append(
                await producer.send(topic, value, key=json.dumps({"id": key}).encode(), partition=p)
            )
            counts[p] += 1
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return counts


def _equals(got: pa.Table, want: dict[int, int]) -> dict[str, Any]:
    """A table's ``id`` and ``version`` columns against a state (key -> last version): the
    same keys, each once, with the same versions."""
    ids, versions = got.column("id").to_numpy(), got.column("version").to_numpy()
    keys = np.fromiter(want.keys(), np.int64, len(want))
    ok = len(ids) == len(keys)
    if ok:
        have, expect = np.argsort(ids, kind="stable"), np.argsort(keys)
        ok = np.array_equal(ids[have], keys[expect]) and np.array_equal(
            versions[have], np.fromiter(want.values(), np.int64, len(want))[expect]
        )
    return {"rows": len(ids), "expected_rows": len(want), "equals_final_state": bool(ok)}


def _check(table: str, want: dict[int, int]) -> dict[str, Any]:
    """The Delta table's keys and versions against the stream's final state (read with
    delta-rs's ``QueryBuilder``, which applies deletion vectors)."""
    from deltalake import DeltaTable, QueryBuilder

    query = QueryBuilder().register("t", DeltaTable(table))
    out = _equals(pa.table(query.execute("SELECT id, version FROM t").read_all()), want)
    return out | {"data_files": len(DeltaTable(table).file_uris())}


# --------------------------------------------------------------------------------------
# the baseline (a sub-process)
# --------------------------------------------------------------------------------------


async def _fold_and_commit(
    a: argparse.Namespace,
    consumer: Any,
    committed: dict[int, int],
    schema: pa.Schema,
    commit: Any,
) -> dict:
    """The baselines' loop: records -> rows (value, or the key for a tombstone) -> every
    ``--flush-records`` events or ``--flush-age`` s, ``commit(folded, moved offsets)``."""
    from rayconnect.write_modes.fold import DELETE_COLUMN, fold

    print("READY", flush=True)
    rows: list[dict] = []
    next_offsets = dict(committed)
    last_flush = time.monotonic()
    t0 = t0_wall = None
    commits, commit_s, total = 0, 0.0, 0
    try:
        while sum(committed.values()) < a.expected:
            fetched = await consumer.getmany(timeout_ms=200, max_records=20_000)
            for tp, records in fetched.items():
                if not records:
                    continue
                if t0 is None:
                    t0, t0_wall = time.perf_counter(), time.time()
                for r in records:
                    key = json.loads(r.key)
                    row = json.loads(r.value) if r.value is not None else dict(key)
                    row.update(
                        _kafka_cluster="local",
                        _kafka_topic=r.topic,
                        _kafka_partition=r.partition,
                        _kafka_offset=r.offset,
                        _kafka_timestamp=r.timestamp * 1000,
                        _kafka_key=key,
                    )
                    row[DELETE_COLUMN] = r.value is None
                    rows.append(row)
                next_offsets[tp.partition] = records[-1].offset + 1
            now = time.monotonic()
            if rows and (len(rows) >= a.flush_records or now - last_flush >= a.flush_age):
                w0 = time.perf_counter()
                moved = {p: o for p, o in next_offsets.items() if o != committed[p]}
                commit(fold(pa.Table.from_pylist(rows, schema), ["id"]), moved)
                commit_s += time.perf_counter() - w0
                commits += 1
                total += len(rows)
                committed.update(moved)
                rows, last_flush = [], now
        elapsed = time.perf_counter() - (t0 or time.perf_counter())
    finally:
        await consumer.stop()
    return {
        "events": total,
        "seconds": elapsed,
        "events_per_s": total / elapsed if elapsed else None,
        "merges": commits,
        "merge_s": commit_s,
        "t0_wall": t0_wall,
    }


async def baseline(a: argparse.Namespace) -> dict:
    """One process on a Delta table: each batch one MERGE with its txn ids."""
    from baseline import resume_consumer
    from deltalake import CommitProperties, DeltaTable, Transaction

    from rayconnect.write_modes.delta_merge import merge_round
    from rayconnect.write_modes.fold import DELETE_COLUMN

    dt = DeltaTable(a.table)
    schema = pa.schema(dt.schema().to_arrow()).append(pa.field(DELETE_COLUMN, pa.bool_()))
    consumer, committed = await resume_consumer(a.bootstrap, a.topic, dt)

    def commit(folded: Any, moved: dict[int, int]) -> None:
        txns = [Transaction(f"{a.topic}/{p}", o) for p, o in moved.items()]
        merge_round(dt, folded, ["id"], CommitProperties(app_transactions=txns))
        dt.update_incremental()

    return await _fold_and_commit(a, consumer, committed, schema, commit)


#: the Iceberg baseline's offsets: a table property, JSON partition -> next offset
_BASE_OFFSETS = "bench.offsets"


def _iceberg_sink(warehouse: str, name: str, **settings: Any) -> Any:
    import rayconnect as rc

    return rc.IcebergSink(f"bench.{name}", warehouse=warehouse, write_mode="upsert", **settings)


async def baseline_iceberg(a: argparse.Namespace) -> dict:
    """The one-process baseline on an Iceberg table: ``baseline``'s loop, each batch one
    pyiceberg transaction (the round's DELETE + APPEND and its offsets)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from rayconnect.kafka import compat
    from rayconnect.tables.factory import open_committer
    from rayconnect.write_modes.fold import DELETE_COLUMN
    from rayconnect.write_modes.iceberg_upsert import upsert_round

    sink = _iceberg_sink(a.warehouse, a.table)
    catalog = open_committer(sink, "bench").catalog()
    schema = catalog.load_table(sink.table).schema().as_arrow()
    consumer = compat.own(  # the reader's read_committed on tansu: rayconnect's fixes
        AIOKafkaConsumer(
            bootstrap_servers=a.bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
        )
    )
    await consumer.start()
    tps = [TopicPartition(a.topic, p) for p in sorted(consumer.partitions_for_topic(a.topic))]
    consumer.assign(tps)
    stored = json.loads(catalog.load_table(sink.table).properties.get(_BASE_OFFSETS, "{}"))
    committed = {tp.partition: int(stored.get(str(tp.partition), 0)) for tp in tps}
    for tp in tps:
        consumer.seek(tp, committed[tp.partition])
    done = dict(committed)

    def commit(folded: Any, moved: dict[int, int]) -> None:
        done.update(moved)
        with catalog.load_table(sink.table).transaction() as tx:
            upsert_round(tx, folded, ["id"], {})
            tx.set_properties({_BASE_OFFSETS: json.dumps(done)})

    schema = schema.append(pa.field(DELETE_COLUMN, pa.bool_()))
    return await _fold_and_commit(a, consumer, committed, schema, commit)


def _check_iceberg(sink: Any, want: dict[int, int]) -> dict[str, Any]:
    from rayconnect.tables.factory import open_committer

    table = open_committer(sink, "bench").catalog().load_table(sink.table)
    out = _equals(table.scan(selected_fields=("id", "version")).to_arrow(), want)
    files = table.inspect.files()
    deletes = int(pc.sum(pc.equal(files.column("content"), 1)).as_py() or 0)
    return out | {"data_files": files.num_rows - deletes, "delete_files": deletes}


def _copy_iceberg(source: Any, *copies: Any) -> int:
    """Each of ``copies`` (sinks) a new table holding ``source``'s rows; the source's
    files."""
    from rayconnect.tables.factory import open_committer

    catalog = open_committer(source, "bench").catalog()
    loaded = catalog.load_table(source.table).scan().to_arrow()
    for sink in copies:
        catalog.create_table(sink.table, loaded.schema, location=sink.location().uri).append(loaded)
    return len(catalog.load_table(source.table).inspect.files())


def _stream(
    a: argparse.Namespace, keys: int, events: int, head: int = 0
) -> tuple[list, list, dict[int, int], dict[int, int], dict]:
    """The initial table's ``keys`` records, ``events`` changes, the final state, the state
    after the first ``head`` changes, and their figures."""
    log = ChangeLog(keys)
    initial = [(k, _value(k, 0)) for k in range(keys)]
    t = time.monotonic()
    changes = log.changes(head)
    want_head = dict(log.version) if head else {}
    changes += log.changes(events - head)
    want = dict(log.version)
    out: dict[str, Any] = {
        "keys": keys,
        "events": events,
        "partitions": a.partitions,
        "deletes": sum(v is None for _, v in changes),
        "value_bytes_mean": float(np.mean([len(v) for _, v in changes if v is not None])),
        "final_keys": len(want),
        "generate_s": time.monotonic() - t,
    }
    return initial, changes, want, want_head, out


def _rc_rates(r: dict[str, Any], events: int) -> dict[str, Any]:
    """``run_backlog``'s result with events/s from the pipeline ready (``start()``
    returned) and from ``start()`` called, both to the commit of the last version."""
    r.pop("records_per_s")
    r["events_per_s"] = events / max(r["seconds"] - r["startup_s"], 1e-3)
    r["events_per_s_from_start"] = events / r["seconds"]
    return r


def _memory_guard(min_available_gib: float) -> Any:
    """Stops the run (KeyboardInterrupt) when less than ``min_available_gib`` of the
    machine's memory is left (no swap): ``merge_on_read.MemoryGuard`` on used memory."""
    import psutil
    from merge_on_read import MemoryGuard

    return MemoryGuard((psutil.virtual_memory().total / 2**30) - min_available_gib)


def run_iceberg(a: argparse.Namespace, work: str) -> dict[str, Any]:
    """The stream into Iceberg tables, same run: rayconnect's defaults (merge-on-read) the
    whole stream; the baseline and rayconnect copy-on-write its first ``--slow-events``."""
    from common import RaySession, run_helper
    from rc_runner import run_backlog

    from rayconnect.kafka.embedded import EmbeddedBroker

    head = min(a.slow_events, a.iceberg_events)
    initial, changes, want, want_head, out = _stream(a, a.keys, a.iceberg_events, head)
    out["slow_events"] = head
    warehouse = f"{work}/wh"
    ours = _iceberg_sink(warehouse, "rc")
    theirs = _iceberg_sink(warehouse, "base")
    cow = _iceberg_sink(warehouse, "cow", upsert_mode="copy_on_write")
    broker = EmbeddedBroker("bench").start()
    try:
        bs = broker.bootstrap_servers
        t = time.monotonic()
        load_counts = asyncio.run(_produce(bs, "load", a.partitions, initial))
        del initial
        counts = asyncio.run(_produce(bs, "changes", a.partitions, changes))
        head_counts = asyncio.run(_produce(bs, "changes-head", a.partitions, changes[:head]))
        del changes
        out["produce_s"] = time.monotonic() - t
        with RaySession():
            t = time.monotonic()
            run_backlog(
                "upsert-ice-load", bs, "load", ours, load_counts,
                dict(RC_LOAD, source=SOURCE), exclude_pids=(broker.pid,),
            )  # fmt: skip
            out["load_s"] = time.monotonic() - t
            print(f"loaded {a.keys:,} keys in {out['load_s']:.0f} s", file=sys.stderr)
            out["table_files_before"] = _copy_iceberg(ours, theirs, cow)
            r = run_helper(
                "upsert_throughput.py", "baseline-iceberg", bs, "changes-head", "base",
                head, "--warehouse", warehouse,
            )  # fmt: skip
            r["check"] = _check_iceberg(theirs, want_head)
            out["baseline"] = r
            print(f"iceberg baseline: {r['events_per_s']:,.0f} events/s {r['check']}",
                  file=sys.stderr)  # fmt: skip
            for name, sink, topic, n, state, c in (
                ("cow", cow, "changes-head", head, want_head, head_counts),
                ("defaults", ours, "changes", a.iceberg_events, want, counts),
            ):
                r = _rc_rates(run_backlog(
                    f"upsert-ice-{name}", bs, topic, sink, c,
                    dict(source=SOURCE), exclude_pids=(broker.pid,),
                ), n)  # fmt: skip
                r["check"] = _check_iceberg(sink, state)
                out[f"rayconnect_{name}"] = r
                print(f"iceberg rayconnect {name}: {r['events_per_s']:,.0f} events/s "
                      f"{r['check']}", file=sys.stderr)  # fmt: skip
    finally:
        broker.stop()
    return out


def run_delta_mor(a: argparse.Namespace, work: str) -> dict[str, Any]:
    """The stream into a ``--delta-keys``-key Delta table (loaded by a copy-on-write upsert
    pipeline, timed): rayconnect's defaults (copy-on-write) vs merge-on-read (deletion
    vectors), each into its own copy of the loaded table, the whole stream."""
    from common import RaySession
    from rc_runner import run_backlog

    from rayconnect.kafka.embedded import EmbeddedBroker

    initial, changes, want, _, out = _stream(a, a.delta_keys, a.events)
    broker = EmbeddedBroker("bench").start()
    try:
        bs = broker.bootstrap_servers
        load_counts, counts = _produce_both(bs, a.partitions, initial, changes, out)
        del initial, changes
        base = f"{work}/loaded"
        with RaySession():
            t = time.monotonic()
            r = run_backlog(
                "upsert-load", bs, "load", base, load_counts,
                dict(RC_LOAD, source=SOURCE, sink=dict(write_mode="upsert")),
                exclude_pids=(broker.pid,), timeout_s=3600,
            )  # fmt: skip
            out["load_s"] = time.monotonic() - t
            out["load"] = _rc_rates(r, a.delta_keys)
            out["table_mb_before"] = _folder_mb(base)
            print(f"loaded {a.delta_keys:,} keys in {out['load_s']:.0f} s "
                  f"({out['table_mb_before']:.0f} MB)", file=sys.stderr)  # fmt: skip
            for name, mode in (("defaults", {}), ("mor", {"upsert_mode": "merge_on_read"})):
                shutil.copytree(base, f"{work}/{name}")
                r = _rc_rates(run_backlog(
                    f"upsert-{name}", bs, "changes", f"{work}/{name}", counts,
                    dict(source=SOURCE, sink=dict(write_mode="upsert", **mode)),
                    exclude_pids=(broker.pid,),
                ), a.events)  # fmt: skip
                r["check"] = _check(f"{work}/{name}", want)
                r["table_mb"] = _folder_mb(f"{work}/{name}")
                out[f"rayconnect_{name}"] = r
                print(f"delta rayconnect {name}: {r['events_per_s']:,.0f} events/s "
                      f"{r['check']}", file=sys.stderr)  # fmt: skip
                shutil.rmtree(f"{work}/{name}", ignore_errors=True)
    finally:
        broker.stop()
    return out


def _folder_mb(path: str) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 1e6


# --------------------------------------------------------------------------------------
# stream: rayconnect vs the baseline
# --------------------------------------------------------------------------------------


def run_stream(a: argparse.Namespace, work: str) -> dict[str, Any]:
    from common import RaySession, run_helper
    from rc_runner import run_backlog

    from rayconnect.kafka.embedded import EmbeddedBroker

    initial, changes, want, _, out = _stream(a, a.keys, a.events)
    broker = EmbeddedBroker("bench").start()
    try:
        bs = broker.bootstrap_servers
        load_counts, counts = _produce_both(bs, a.partitions, initial, changes, out)
        del initial, changes
        base = f"{work}/loaded"
        sink = dict(write_mode="upsert")
        with RaySession():
            t = time.monotonic()
            run_backlog(
                "upsert-load", bs, "load", base, load_counts,
                dict(RC_LOAD, source=SOURCE, sink=sink), exclude_pids=(broker.pid,),
            )  # fmt: skip
            out["load_s"] = time.monotonic() - t
            print(f"loaded {a.keys:,} keys in {out['load_s']:.0f} s", file=sys.stderr)
            for name in ("baseline", *RC_SETTINGS):
                shutil.copytree(base, f"{work}/{name}")
            r = run_helper(
                "upsert_throughput.py", "baseline", bs, "changes", f"{work}/baseline", a.events
            )
            r["check"] = _check(f"{work}/baseline", want)
            out["baseline"] = r
            print(f"baseline: {r['events_per_s']:,.0f} events/s {r['check']}", file=sys.stderr)
            for name, settings in RC_SETTINGS.items():
                r = _rc_rates(run_backlog(
                    f"upsert-{name}", bs, "changes", f"{work}/{name}", counts,
                    dict(settings, source=SOURCE, sink=sink), exclude_pids=(broker.pid,),
                ), a.events)  # fmt: skip
                r["check"] = _check(f"{work}/{name}", want)
                out[f"rayconnect_{name}"] = r
                print(f"rayconnect {name}: {r['events_per_s']:,.0f} events/s", file=sys.stderr)
    finally:
        broker.stop()
    return out


# --------------------------------------------------------------------------------------
# round: one round of 100k changes by table size and files touched
# --------------------------------------------------------------------------------------


def _rows(ids: np.ndarray, version: int) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "_kafka_partition": pa.array((ids % 8).astype(np.int32)),
            "_kafka_offset": pa.array(np.arange(n, dtype=np.int64) + version * 10_000_000),
            "id": pa.array(ids.astype(np.int64)),
            "name": pa.array(np.char.add("customer-", ids.astype(str))),
            "amount": pa.array((ids * 37 + version) % 10_000),
            "price": pa.array((ids % 997) * 1.25 + version),
            "country": pa.array(np.array(["DE", "FR", "US", "GB", "JP"])[(ids + version) % 5]),
            "paid": pa.array((ids + version) % 2 == 0),
            "version": pa.array(np.full(n, version, dtype=np.int64)),
        }
    )


def _round(rows: int, clustered: bool, n: int, seed: int) -> pa.Table:
    """100k changes: 70% updates, 10% deletes of existing keys, 20% inserts of new keys
    (ids above the table's: ids that grow); clustered: the existing keys are the most recent
    ones (the top of the key range, as when recent rows change most); random: any key."""
    from rayconnect.write_modes.fold import DELETE_COLUMN

    rng = np.random.default_rng(seed)
    existing = int(n * 0.8)
    if clustered:
        ids = rows - existing + rng.choice(existing, existing, replace=False)
    else:
        ids = rng.choice(rows, existing, replace=False)
    ids = np.concatenate([ids, rows + np.arange(n - existing)])
    rng.shuffle(ids)
    changes = _rows(ids, version=1)
    deletes = np.isin(ids, ids[ids < rows][: int(n * 0.1)])
    return changes.append_column(DELETE_COLUMN, pa.array(deletes))


def run_round(a: argparse.Namespace, work: str) -> list[dict[str, Any]]:
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    from rayconnect.write_modes.delta_merge import merge_round
    from rayconnect.write_modes.fold import fold

    out = []
    for rows in a.round_rows:
        path = f"{work}/round-{rows}"
        t = time.monotonic()
        for start in range(0, rows, a.file_rows):  # one file per append: sorted by key
            ids = np.arange(start, min(start + a.file_rows, rows))
            write_deltalake(path, _rows(ids, version=0), mode="append")
        dt = DeltaTable(path)
        files = len(dt.file_uris())
        built_s = time.monotonic() - t
        size = sum(os.path.getsize(p) for p in dt.file_uris())
        print(f"{rows:,} rows in {files} files ({size / 1e6:.0f} MB), {built_s:.0f} s",
              file=sys.stderr)  # fmt: skip
        for clustered in (True, False):
            work_path = f"{path}-{'clustered' if clustered else 'random'}"
            changes = _round(rows, clustered, a.round_changes, seed=rows)
            folds, merges = [], []
            for _ in range(a.repeats):  # the least disturbed of them: the machine is shared
                shutil.rmtree(work_path, ignore_errors=True)
                shutil.copytree(path, work_path)
                t = time.perf_counter()
                folded = fold(changes, ["id"])
                folds.append(time.perf_counter() - t)
                t = time.perf_counter()
                metrics = merge_round(
                    DeltaTable(work_path), folded, ["id"],
                    CommitProperties(app_transactions=[Transaction("bench/0", 1)]),
                )  # fmt: skip
                merges.append(time.perf_counter() - t)
            fold_s, merge_s = min(folds), min(merges)
            after = DeltaTable(work_path)
            expected = (
                rows
                - int(folded.deleted.num_rows)
                + int((folded.rows.column("id").to_numpy() >= rows).sum())
            )
            r = {
                "table_rows": rows,
                "table_files": files,
                "table_mb": size / 1e6,
                "keys": "clustered" if clustered else "random",
                "changes": a.round_changes,
                "fold_s": fold_s,
                "merge_s": merge_s,
                "merge_s_all": merges,
                "files_scanned": metrics.get("num_target_files_scanned"),
                "files_skipped": metrics.get("num_target_files_skipped_during_scan"),
                "files_removed": metrics.get("num_target_files_removed"),
                "files_added": metrics.get("num_target_files_added"),
                "rows_copied": metrics.get("num_target_rows_copied"),
                "rows_updated": metrics.get("num_target_rows_updated"),
                "rows_inserted": metrics.get("num_target_rows_inserted"),
                "rows_deleted": metrics.get("num_target_rows_deleted"),
                "rows_after_ok": after.to_pyarrow_dataset().count_rows() == expected,
                "load": os.getloadavg()[0],
            }
            out.append(r)
            print(json.dumps(r), file=sys.stderr)
            shutil.rmtree(work_path, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------


def markdown(res: dict[str, Any]) -> str:
    lines = []
    s = res.get("stream")
    if s:
        b = s["baseline"]
        lines += [
            f"### Stream: {s['events']:,} change events (70% updates, 20% inserts, 10% deletes) "
            f"into a {s['keys']:,}-key Delta table, {s['partitions']} partitions",
            "",
            "| contender | events/s (ready -> last commit) | events/s from start() | "
            "x baseline | versions | table = final state |",
            "|---|---|---|---|---|---|",
            f"| baseline (one process, MERGE per 50k) | {b['events_per_s']:,.0f} | | 1.00 | "
            f"{b['merges']} | {b['check']['equals_final_state']} |",
        ]
        for name in RC_SETTINGS:
            r = s[f"rayconnect_{name}"]
            lines.append(
                f"| rayconnect {name} {r['settings_shown']} | {r['events_per_s']:,.0f} | "
                f"{r['events_per_s_from_start']:,.0f} | "
                f"{r['events_per_s'] / b['events_per_s']:.2f} | {r['rounds_committed']} | "
                f"{r['check']['equals_final_state']} |"
            )
        lines.append("")
    ice = res.get("iceberg")
    if ice:
        b, r = ice["baseline"], ice["rayconnect_defaults"]
        head = ice.get("slow_events", ice["events"])
        partial = f" (first {head:,} events)" if head < ice["events"] else ""
        rows = [(f"baseline (one process, DELETE + APPEND per 50k){partial}", b)]
        if "rayconnect_cow" in ice:  # results from before it was measured have none
            rows.append((f"rayconnect copy_on_write{partial}", ice["rayconnect_cow"]))
        rows.append((f"rayconnect defaults (merge_on_read), {ice['events']:,} events", r))
        lines += [
            f"### Iceberg: {ice['events']:,} change events (70% updates, 20% inserts, 10% "
            f"deletes) into a {ice['keys']:,}-key Iceberg table, {ice['partitions']} partitions",
            "",
            "| contender | events/s (ready -> last commit) | events/s from start() | "
            "x baseline | commits | table = state after its events |",
            "|---|---|---|---|---|---|",
        ]
        for name, c in rows:
            lines.append(
                f"| {name} | {c['events_per_s']:,.0f} | "
                f"{_fmt(c.get('events_per_s_from_start'))} | "
                f"{c['events_per_s'] / b['events_per_s']:.2f} | "
                f"{c.get('rounds_committed', c.get('merges'))} | "
                f"{c['check']['equals_final_state']} |"
            )
        ok = r["events_per_s"] >= 50_000 and r["events_per_s"] >= 5 * b["events_per_s"]
        lines += ["", f"Target (>= 50k events/s and >= 5x the baseline): "
                  f"{'met' if ok else 'NOT met'}.", ""]  # fmt: skip
    d = res.get("delta_mor")
    if d:
        load = d["load"]
        lines += [
            f"### Delta: {d['events']:,} change events (70% updates, 20% inserts, 10% deletes) "
            f"into a {d['keys']:,}-key Delta table, {d['partitions']} partitions",
            "",
            f"Loaded by a copy-on-write upsert pipeline ({_settings(RC_LOAD)}): "
            f"{d['load_s']:.0f} s, {load['events_per_s']:,.0f} keys/s from ready "
            f"({load['rounds_committed']} versions, {d['table_mb_before']:.0f} MB).",
            "",
            "| contender | events/s (ready -> last commit) | events/s from start() | "
            "x defaults | versions | round s (median/max) | peak PSS MB | table = final state |",
            "|---|---|---|---|---|---|---|---|",
        ]
        base = d["rayconnect_defaults"]["events_per_s"]
        for name, label in (("defaults", "defaults (copy_on_write)"),
                            ("mor", 'upsert_mode="merge_on_read" (deletion vectors)')):  # fmt: skip
            c = d[f"rayconnect_{name}"]
            lines.append(
                f"| rayconnect {label} | {c['events_per_s']:,.0f} | "
                f"{c['events_per_s_from_start']:,.0f} | {c['events_per_s'] / base:.2f} | "
                f"{c['rounds_committed']} | {_fmt(c.get('round_s_median'), '.1f')}/"
                f"{_fmt(c.get('round_s_max'), '.1f')} | "
                f"{_fmt(c.get('memory', {}).get('peak_pss_mb'))} | "
                f"{c['check']['equals_final_state']} |"
            )
        ok = d["rayconnect_mor"]["events_per_s"] >= 50_000
        lines += ["", f"Target (merge-on-read >= 50k events/s): {'met' if ok else 'NOT met'}.", ""]
    rounds = res.get("round")
    if rounds:
        lines += [
            "### One round of 100k changes (70% updates, 20% inserts, 10% deletes)",
            "",
            "| table rows | table files | keys | fold s | MERGE s (fastest of "
            f"{len(rounds[0]['merge_s_all'])}) | files rewritten "
            "(removed/added) | rows copied | load |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rounds:
            lines.append(
                f"| {r['table_rows']:,} | {r['table_files']} | {r['keys']} | {r['fold_s']:.2f} | "
                f"{r['merge_s']:.2f} | {r['files_removed']}/{r['files_added']} | "
                f"{r['rows_copied']:,} | {r['load']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--round-rows", default="1000000,10000000")
    ap.add_argument("--round-changes", type=int, default=100_000)
    ap.add_argument("--file-rows", type=int, default=250_000)
    ap.add_argument("--repeats", type=int, default=2, help="round: runs of each, the fastest")
    ap.add_argument("--iceberg-events", type=int, default=100_000)
    ap.add_argument(
        "--slow-events", type=int, default=200_000,
        help="iceberg: the baseline and copy-on-write consume only the first N events",
    )  # fmt: skip
    ap.add_argument("--delta-keys", type=int, default=10_000_000)
    ap.add_argument("--min-available-gib", type=float, default=5.0,
                    help="stop the run when less of the machine's memory is left")  # fmt: skip
    ap.add_argument("--only", default="stream,round", help="stream,round,iceberg,delta-mor")
    ap.add_argument("--name", help="results file name (default: the scenarios run)")
    ap.add_argument("--markdown", help="only print the table of a results .json")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args()
    if a.markdown:
        print(markdown(json.loads(Path(a.markdown).read_text())))
        return
    a.round_rows = [int(x) for x in a.round_rows.split(",")]
    only = a.only.split(",")
    res: dict[str, Any] = {"at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    res["load_before"] = os.getloadavg()
    work = tempfile.mkdtemp(prefix="rc-upsert-bench-")
    guard = _memory_guard(a.min_available_gib).__enter__()
    try:
        if "stream" in only:
            res["stream"] = run_stream(a, work)
            for name, settings in RC_SETTINGS.items():
                res["stream"][f"rayconnect_{name}"]["settings_shown"] = (
                    f"({_settings(settings)})" if settings else ""
                )
        if "round" in only:
            res["round"] = run_round(a, work)
        if "iceberg" in only:
            res["iceberg"] = run_iceberg(a, work)
        if "delta-mor" in only:
            res["delta_mor"] = run_delta_mor(a, work)
    finally:
        from common import cleanup_private_tmp

        guard.__exit__()
        shutil.rmtree(work, ignore_errors=True)
        cleanup_private_tmp()  # this run's /tmp/rcb<pid> (its Ray sessions are gone already)
    res["machine_used_gib_peak"] = guard.peak / 2**30
    res["load_after"] = os.getloadavg()
    table = markdown(res)
    print(table)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = a.name or "-".join(only)
    (out / f"{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (out / f"{stamp}.md").write_text(
        f"Run {res['at']}, load average before/after {res['load_before'][0]:.0f}/"
        f"{res['load_after'][0]:.0f} on 2 cores (other jobs running).\n\n" + table
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "baseline-iceberg":
        bp = argparse.ArgumentParser()
        bp.add_argument("bootstrap")
        bp.add_argument("topic")
        bp.add_argument("table", help="the table's name in the namespace bench")
        bp.add_argument("expected", type=int)
        bp.add_argument("--warehouse", required=True)
        bp.add_argument("--flush-records", type=int, default=50_000)
        bp.add_argument("--flush-age", type=float, default=5.0)
        print(json.dumps(asyncio.run(baseline_iceberg(bp.parse_args(sys.argv[2:])))), flush=True)
    elif len(sys.argv) > 1 and sys.argv[1] == "baseline":
        bp = argparse.ArgumentParser()
        bp.add_argument("bootstrap")
        bp.add_argument("topic")
        bp.add_argument("table")
        bp.add_argument("expected", type=int)
        bp.add_argument("--flush-records", type=int, default=50_000)
        bp.add_argument("--flush-age", type=float, default=5.0)
        print(json.dumps(asyncio.run(baseline(bp.parse_args(sys.argv[2:])))), flush=True)
    else:
        main()
