"""Each snapshot chunk's progress as a source offset of its own (pure).

Snapshot workers write their chunks' rows to Kafka themselves, each in transactions of its
own producer, so a chunk's progress cannot ride in the task's offset: it is its own source
partition, ``{"postgres": slot, "snapshot_chunk": i}``, committed in the same Kafka
transaction as the chunk's rows. The task's offset keeps the plan (``Progress.chunks`` as
planned, its ``plan`` id); a restarted task reads both and takes, per chunk, the progress
its worker committed for this plan (a chunk offset of an older plan is ignored: plans
reuse the keys, which keeps the compacted offsets topic small).

The transactional ids: ``<task's id>-snapshot-<i>`` for worker ``i``, ``-snapshot-plan``
for the task's write of the plan. A restarted task fences all of them before it reads the
offsets, so no worker of an earlier incarnation commits afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from rayconnect.source_tasks.base import encode_partition
from rayconnect.source_tasks.postgres.progress import Chunk, Progress


class ChunkOffset(msgspec.Struct, frozen=True):
    """What a worker commits with a chunk's rows: the chunk's progress, for ``plan``."""

    plan: int
    chunk: Chunk


def chunk_partition(slot: str, index: int) -> dict[str, Any]:
    return {"postgres": slot, "snapshot_chunk": index}


def committed_chunk(offsets: Mapping[str, Any], slot: str, plan: int, index: int) -> Chunk | None:
    """Chunk ``index`` of ``plan`` as its worker last committed it (None: never)."""
    found = offsets.get(encode_partition(chunk_partition(slot, index)))
    if found is None:
        return None
    committed = msgspec.convert(found, ChunkOffset)
    return committed.chunk if committed.plan == plan else None


def merge_committed(progress: Progress, offsets: Mapping[str, Any], slot: str) -> None:
    """Each chunk of ``progress``'s plan as its worker last committed it, if it did."""
    for i in range(len(progress.chunks)):
        chunk = committed_chunk(offsets, slot, progress.plan, i)
        if chunk is not None:
            progress.chunks[i] = chunk


def worker_id(transactional_id: str, worker: int) -> str:
    return f"{transactional_id}-snapshot-{worker}"


def plan_id(transactional_id: str) -> str:
    return f"{transactional_id}-snapshot-plan"


def snapshot_ids(transactional_id: str, workers: int) -> list[str]:
    """Every transactional id a snapshot of ``workers`` workers writes with."""
    return [plan_id(transactional_id)] + [worker_id(transactional_id, i) for i in range(workers)]
