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

from rayconnect.source.base import SourceRecord, SourceTask, SourceTaskContext


class GeneratorSource(SourceTask):
    def __init__(
        self,
        topic: str,
        partitions: int = 4,
        records_per_partition: int | None = None,
        batch_size: int = 1000,
        value_size: int = 200,
        idle_s: float = 0.05,
        poll_delay_s: float = 0.0,
        tag: str = "",
        commit_every: int | None = None,
    ) -> None:
        if partitions < 1 or batch_size < 1:
            raise ValueError("partitions and batch_size must be >= 1")
        self.topic = topic
        self.partitions = partitions
        self.records_per_partition = records_per_partition
        self.batch_size = batch_size
        self.value_size = value_size
        self.idle_s = idle_s
        self.poll_delay_s = poll_delay_s
        self.tag = tag
        self.commit_every = commit_every

    async def start(self, context: SourceTaskContext) -> None:
        self.context = context
        # next seq per owned partition: one after the committed offset
        self.next_seq: dict[int, int] = {}
        for j in range(self.partitions):
            if context.owns_index(j):
                committed = context.offset({"generator": j})
                self.next_seq[j] = 0 if committed is None else committed["seq"] + 1
        self._count = 0

    def value(self, j: int, seq: int) -> bytes:
        head = {"p": j, "seq": seq, "tag": self.tag}
        base = json.dumps({**head, "pad": ""}, separators=(",", ":"))
        pad = "x" * max(0, self.value_size - len(base))
        return json.dumps({**head, "pad": pad}, separators=(",", ":")).encode()

    async def poll(self) -> list[SourceRecord]:
        owned = [j for j, n in self.next_seq.items() if self._has_more(n)]
        if not owned:
            await asyncio.sleep(self.idle_s)
            return []
        if self.poll_delay_s:
            await asyncio.sleep(self.poll_delay_s)
        records: list[SourceRecord] = []
        per = max(1, self.batch_size // len(owned))
        for j in owned:
            for _ in range(per):
                n = self.next_seq[j]
                if not self._has_more(n) or len(records) >= self.batch_size:
                    break
                record = SourceRecord(
                    self.topic,
                    self.value(j, n),
                    key=f"g{j}".encode(),
                    source_partition={"generator": j},
                    source_offset={"seq": n},
                )
                records.append(record)
                self.next_seq[j] = n + 1
                self._count += 1
                txn = self.context.transaction_context
                if self.commit_every and txn is not None and self._count % self.commit_every == 0:
                    txn.commit_transaction(record)
        return records

    def _has_more(self, n: int) -> bool:
        return self.records_per_partition is None or n < self.records_per_partition


def sequences(values: Iterable[Mapping[str, Any]]) -> dict[int, list[int]]:
    """Source partition -> the ``seq`` numbers of its records, in the order given: read back
    in offset order, exactly once and in order means ``[0, 1, ..., n-1]`` for each."""
    seqs: dict[int, list[int]] = {}
    for v in values:
        seqs.setdefault(v["p"], []).append(v["seq"])
    return seqs
