"""GeneratorSource: numbered records on ``partitions`` source partitions, for demos and
benchmarks. Source partition ``{"generator": j}``, offset ``{"seq": n}`` (the last record
sent); each record's key is ``g<j>`` so one source partition always lands on one Kafka
partition, in order. Values are ~``value_size``-byte JSON objects ``{"p", "seq", "tag",
"pad"}`` (``tag`` tells runs apart in tests). ``poll_delay_s`` throttles it; with
``transaction_boundary="connector"``, ``commit_every=n`` ends a transaction after every n-th
record of the task (through the TransactionContext) - the connector-boundary demo."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from rayconnect.settings_types import NonNegativeFloat, NonNegativeInt, PositiveInt
from rayconnect.source_tasks.base import (
    ConfiguredTask,
    SourceRecord,
    SourceTaskContext,
    check_topic,
)


class GeneratorSettings(msgspec.Struct, frozen=True):
    """GeneratorSource's parameters: its constructor's and a pipeline file's ``task:`` block's."""

    #: the topic written to
    topic: str
    #: source partitions, one Kafka partition each; records are numbered 0, 1, ... per partition
    partitions: PositiveInt = 4
    #: stop after this many per partition; None: for ever
    records_per_partition: NonNegativeInt | None = None
    #: records per partition one poll returns
    batch_size: PositiveInt = 1000
    #: bytes of each record's value
    value_size: NonNegativeInt = 200
    #: how long a poll waits when there is nothing to generate
    idle_s: NonNegativeFloat = 0.05
    #: a pause in every poll (to pace the generator)
    poll_delay_s: NonNegativeFloat = 0.0
    #: written into each record (tells runs apart)
    tag: str = ""
    #: with ``transaction_boundary: connector``: ask for a commit every this many records
    commit_every: PositiveInt | None = None

    def __post_init__(self) -> None:
        check_topic("topic", self.topic)


class GeneratorSource(ConfiguredTask[GeneratorSettings]):
    settings_type = GeneratorSettings

    async def start(self, context: SourceTaskContext) -> None:
        self.context = context
        # next seq per owned partition: one after the committed offset
        self.next_seq: dict[int, int] = {}
        for j in range(self.settings.partitions):
            if context.owns_index(j):
                committed = context.offset({"generator": j})
                self.next_seq[j] = 0 if committed is None else committed["seq"] + 1
        self._count = 0

    def value(self, j: int, seq: int) -> bytes:
        head = {"p": j, "seq": seq, "tag": self.settings.tag}
        base = json.dumps({**head, "pad": ""}, separators=(",", ":"))
        pad = "x" * max(0, self.settings.value_size - len(base))
        return json.dumps({**head, "pad": pad}, separators=(",", ":")).encode()

    async def poll(self) -> list[SourceRecord]:
        owned = [j for j, n in self.next_seq.items() if self._has_more(n)]
        if not owned:
            await asyncio.sleep(self.settings.idle_s)
            return []
        if self.settings.poll_delay_s:
            await asyncio.sleep(self.settings.poll_delay_s)
        records: list[SourceRecord] = []
        per = max(1, self.settings.batch_size // len(owned))
        for j in owned:
            for _ in range(per):
                n = self.next_seq[j]
                if not self._has_more(n) or len(records) >= self.settings.batch_size:
                    break
                record = SourceRecord(
                    self.settings.topic,
                    self.value(j, n),
                    key=f"g{j}".encode(),
                    source_partition={"generator": j},
                    source_offset={"seq": n},
                )
                records.append(record)
                self.next_seq[j] = n + 1
                self._count += 1
                txn = self.context.transaction_context
                if self.settings.commit_every and txn is not None and self._count % self.settings.commit_every == 0:
                    txn.commit_transaction(record)
        return records

    def _has_more(self, n: int) -> bool:
        return self.settings.records_per_partition is None or n < self.settings.records_per_partition


def sequences(values: Iterable[Mapping[str, Any]]) -> dict[int, list[int]]:
    """Source partition -> the ``seq`` numbers of its records, in the order given: read back
    in offset order, exactly once and in order means ``[0, 1, ..., n-1]`` for each."""
    seqs: dict[int, list[int]] = {}
    for v in values:
        seqs.setdefault(v["p"], []).append(v["seq"])
    return seqs
