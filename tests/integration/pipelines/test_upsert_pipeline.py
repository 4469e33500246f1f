"""Upsert tables on real parts: a stream of inserts, updates and deletes by key through a
sink pipeline whose coordinator, participant host and writer are killed mid-round (ray.kill
and SIGKILL) - the table ends equal to the stream's final state, each key once, for Delta
with plain keyed records (a tombstone deletes) and for Iceberg with Debezium change
events; changes that cannot apply are dead letters with their reason."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
import sink_checks
from aiokafka import AIOKafkaProducer
from iceberg_reads import load_table

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST
from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.kafka.admin import create_topic

CLUSTER = sink_checks.CLUSTER
PARTITIONS = 4
KEYS = 2_000


class ChangeStream:
    """Changes by key, produced to partition ``key % PARTITIONS`` (Kafka's keying: a key
    lives in one partition), and the state they leave: key -> row, or absent if deleted."""

    def __init__(self, bootstrap: str, topic: str, debezium: bool, seed: int) -> None:
        self.bootstrap, self.topic, self.debezium = bootstrap, topic, debezium
        self.rng = random.Random(seed)
        self.state: dict[int, dict] = {}
        self.sent: dict[int, int] = dict.fromkeys(range(PARTITIONS), 0)
        self.bad: set[tuple[int, int]] = set()  # (partition, offset) of unappliable changes
        self.serial = 0
        asyncio.run(create_topic(bootstrap, topic, PARTITIONS))

    def _change(self) -> tuple[int, bytes | None, bytes | None, bool]:
        """(partition, key, value, is_bad) of one random change; the state follows it."""
        self.serial += 1
        key = self.rng.randrange(KEYS)
        p = key % PARTITIONS
        if self.serial % 251 == 0:  # a change that cannot apply
            if self.debezium:
                return p, json.dumps({"id": key}).encode(), b'{"op":"x","after":{"id":1}}', True
            return p, b"{not json", b'{"id": 1, "v": "?"}', True
        row = {"id": key, "v": f"s{self.serial}", "n": self.serial}
        deletes = key in self.state and self.rng.random() < 0.25
        before = self.state.get(key)
        if deletes:
            del self.state[key]
        else:
            self.state[key] = row
        if not self.debezium:
            return (
                p,
                json.dumps({"id": key}).encode(),
                None if deletes else json.dumps(row).encode(),
                False,
            )
        op = "d" if deletes else ("u" if before else "c")
        event = {
            "op": op,
            "before": {"id": key} if before else None,
            "after": None if deletes else row,
        }
        return p, json.dumps({"id": key}).encode(), json.dumps(event).encode(), False

    def more(self, n: int) -> None:
        async def go() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await producer.start()
            try:
                futures = []
                for _ in range(n):
                    p, key, value, bad = self._change()
                    futures.append(await producer.send(self.topic, value, key=key, partition=p))
                    if bad:
                        self.bad.add((p, self.sent[p]))
                    self.sent[p] += 1
                    if self.debezium and value is not None and b'"op": "d"' in value:
                        # Debezium's tombstone after a delete: skipped, no dead letter
                        futures.append(await producer.send(self.topic, None, key=key, partition=p))
                        self.sent[p] += 1
                await asyncio.gather(*futures)
            finally:
                await producer.stop()

        asyncio.run(go())

    def offsets(self) -> dict[str, int]:
        return {f"{CLUSTER}/{self.topic}/{p}": n for p, n in self.sent.items() if n}

    def caught_up(self):  # noqa: ANN201 - a wait_for predicate
        want = self.offsets()
        return lambda s: s["offsets"] == want


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["delta", "delta-merge-on-read", "iceberg"])
def test_upserts_and_deletes_exactly_once_through_kills_of_every_role(
    ray_session, kafka_broker, tmp_path: Path, kill, kind: str
) -> None:
    """Iceberg: merge-on-read (its default, keys in the key index); Delta: copy-on-write
    (its default) and merge-on-read (deletion vectors) without a key index: each round's
    key search runs in the writer (``write_modes.key_search``), killed with the others."""
    debezium = kind == "iceberg"  # both table kinds, both input shapes
    name = f"upsert-{kind}"
    stream = ChangeStream(kafka_broker.bootstrap_servers, name, debezium, seed=7)
    stream.more(3_000)
    if kind.startswith("delta"):
        mode = "merge_on_read" if kind == "delta-merge-on-read" else "copy_on_write"
        sink: rc.DeltaSink | rc.IcebergSink = rc.DeltaSink(
            str(tmp_path / "t"), write_mode="upsert", upsert_mode=mode, key_index_rows=0
        )
    else:
        sink = rc.IcebergSink(
            "db.upserts", warehouse=str(tmp_path / "wh"), write_mode="upsert", key_columns=("id",)
        )
    meta = sink_checks.static_meta(kafka_broker.bootstrap_servers, [name])
    source = rc.KafkaSource(
        meta,
        value_format="json",
        value_schema={"id": "long", "v": "string", "n": "long"},
        key_format="json",
        key_schema={"id": "long"},
        include_key=True,
        errors="dead_letter",
        envelope="debezium" if debezium else "none",
    )
    handle = rc.SinkPipeline(name, source, sink, commit_interval_s=2).start()
    try:
        handle.wait_for(stream.caught_up(), timeout_s=180)
        host = names.participant_host(name, f"{CLUSTER}/{name}/0", DEFAULT_PARTITIONS_PER_HOST)
        victims = [
            (names.coordinator(name), "sigkill"),
            (host, "ray.kill"),
            (names.writer(name), "sigkill"),
            (names.coordinator(name), "ray.kill"),
        ]
        for victim, how in victims:
            sink_checks.produce_into_an_open_round(handle, stream, 300, attempts=5, wait_s=8)
            kill(victim, how)
        stream.more(1_000)
        handle.wait_for(stream.caught_up(), timeout_s=360)
        searches = handle.status().key_searches  # since the coordinator's last restart
        if kind == "delta-merge-on-read":
            assert searches.on_writer >= 1, searches
        elif kind == "delta":  # copy-on-write searches nothing (Iceberg's index: while
            assert searches.on_writer == searches.here == 0, searches  # it builds, it may)
    finally:
        handle.stop(commit=False)

    if kind.startswith("delta"):
        table = pl.read_delta(str(tmp_path / "t"))
        dead = pl.read_delta(str(tmp_path / "t" / DEAD_LETTER_DIR))
    else:
        table = pl.from_arrow(load_table(sink).scan().to_arrow())
        dead = pl.from_arrow(load_table(sink, sink.table + "_dead_letters").scan().to_arrow())
    ids = table["id"].to_list()
    assert [k for k, n in Counter(ids).items() if n > 1] == []  # each key once
    got = {r["id"]: {"id": r["id"], "v": r["v"], "n": r["n"]} for r in table.to_dicts()}
    assert got == stream.state
    coords = set(
        zip(dead["_kafka_partition"].to_list(), dead["_kafka_offset"].to_list(), strict=True)
    )
    assert coords == stream.bad and len(dead) == len(stream.bad)  # each once
    assert all(dead["reason"].str.contains("debezium envelope" if debezium else "key"))
    assert "_rayconnect_delete" not in table.columns
