"""Helpers for sink pipeline tests on real parts: build a pipeline over the embedded broker,
track what was produced, and check a table exactly (row set, no duplicates, offsets).

A table is given as a local path (a Delta table), an ``rc.DeltaSink`` (whose
``storage_options``, when it has them, are used to read it back) or an ``rc.IcebergSink``, so
a test can move its table to object storage or to another format by changing only where the
sink comes from.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from os import PathLike
from typing import Any

from deltalake import DeltaTable
from iceberg_reads import iceberg_rows, load_table

import rayconnect as rc
from rayconnect.kafka.admin import create_topic, produce_demo_records
from rayconnect.protocol.status import PipelineStatus

CLUSTER = "local"

Table = str | PathLike[str] | rc.DeltaSink | rc.IcebergSink


def as_sink(table: Table) -> rc.DeltaSink | rc.IcebergSink:
    if isinstance(table, rc.DeltaSink | rc.IcebergSink):
        return table
    return rc.DeltaSink(str(table))


def open_table(table: Table) -> DeltaTable:
    sink = as_sink(table)
    return DeltaTable(sink.path, storage_options=getattr(sink, "storage_options", None) or None)


def static_meta(bootstrap: str, topics: list[str], stream: str = "s") -> rc.StaticMetadataService:
    """One stream of ``topics`` on the test broker (cluster ``CLUSTER``)."""
    return rc.StaticMetadataService(
        (rc.KafkaStream(stream, {CLUSTER: rc.ClusterMetadata(bootstrap, tuple(topics))}),)
    )


def pipeline(
    name: str,
    bootstrap: str,
    topic: str,
    table: Table,
    source: dict[str, Any] | None = None,
    **settings: Any,
) -> rc.SinkPipeline:
    kafka = rc.KafkaSource(static_meta(bootstrap, [topic], stream=topic), **(source or {}))
    return rc.SinkPipeline(name, kafka, as_sink(table), **settings)


class Produced:
    """What was produced so far, per partition (offsets are 0..n-1 on a fresh topic)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.counts = Counter({p: 0 for p in range(partitions)})
        asyncio.run(create_topic(bootstrap, topic, partitions))

    def more(self, n: int) -> None:
        start = sum(self.counts.values())
        counts = asyncio.run(
            produce_demo_records(self.bootstrap, self.topic, n, self.partitions, start_index=start)
        )
        self.counts.update(counts)

    def offsets(self) -> dict[str, int]:
        return {f"{CLUSTER}/{self.topic}/{p}": n for p, n in self.counts.items() if n}

    def rows(self) -> set[tuple[str, str, int, int]]:
        return {(CLUSTER, self.topic, p, o) for p, n in self.counts.items() for o in range(n)}


def table_rows(table: Table) -> list[tuple[str, str, int, int]]:
    sink = as_sink(table)
    if isinstance(sink, rc.IcebergSink):
        return iceberg_rows(sink)
    t = open_table(table).to_pyarrow_table(columns=["cluster", "topic", "partition", "offset"])
    return list(
        zip(
            t["cluster"].to_pylist(),
            t["topic"].to_pylist(),
            t["partition"].to_pylist(),
            t["offset"].to_pylist(),
            strict=True,
        )
    )


def assert_exactly_once(table: Table, produced: Produced, status: dict[str, Any]) -> None:
    rows = table_rows(table)
    dupes = [r for r, c in Counter(rows).items() if c > 1]
    assert dupes == [], f"{len(dupes)} duplicated records, e.g. {dupes[:5]}"
    assert set(rows) == produced.rows(), (
        f"missing {len(produced.rows() - set(rows))}, extra {len(set(rows) - produced.rows())}"
    )
    assert status["offsets"] == produced.offsets()


def caught_up(produced: Produced) -> Callable[[dict[str, Any]], bool]:
    """A ``wait_for`` predicate: every record produced so far is committed."""
    want = produced.offsets()
    return lambda s: s["offsets"] == want


def in_flight(status: PipelineStatus) -> int:
    """Records the readers have read past the table's committed offsets."""
    committed = status.offsets
    return sum(
        max(p.position - committed.get(key, 0), 0)
        for reader in status.readers.values()
        for key, p in reader.partitions.items()
        if p.position is not None
    )


def open_round_with_data(status: dict[str, Any]) -> bool:
    """A ``wait_for`` predicate: a round is open and holds records not yet committed - the
    moment a kill must land in to cut a round."""
    return status["state"] == "started" and in_flight(status) > 0


def produce_into_an_open_round(
    handle: Any, produced: Produced, n: int, *, attempts: int = 6, wait_s: float = 10.0
) -> dict[str, Any]:
    """Produce ``n`` records and return the status of a round that holds some of them
    uncommitted. With a short commit interval (or a slow status call) a round can read and
    commit them between two polls, so produce again, up to ``attempts`` times."""
    for attempt in range(attempts):
        produced.more(n)
        try:
            return handle.wait_for(open_round_with_data, timeout_s=wait_s, poll_s=0.05)
        except TimeoutError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def kill_landed_in_round(table: Table, before: dict[str, Any], killed_at: float) -> bool:
    """Did a kill at ``killed_at`` (wall clock) land inside the round ``before`` saw open?
    Yes unless the table's history shows that round (its epoch and txn id) committed first."""
    for commit in commit_history(table):
        if (commit.get("rayconnect.epoch"), commit.get("rayconnect.txn_id")) == (
            str(before["epoch"]),
            str(before["txn_id"]),
        ):
            return commit["timestamp"] / 1000 > killed_at
    return True


def commit_history(table: Table) -> list[dict[str, Any]]:
    """Every commit the table still knows, as its metadata plus ``timestamp`` (ms) and
    ``version``: Delta's history, or the summaries of an Iceberg table's (unexpired)
    snapshots, their sequence number as version."""
    sink = as_sink(table)
    if isinstance(sink, rc.IcebergSink):
        return [
            {
                **s.summary.additional_properties,
                "timestamp": s.timestamp_ms,
                "version": s.sequence_number,
            }
            for s in load_table(sink).metadata.snapshots
        ]
    return open_table(table).history()
