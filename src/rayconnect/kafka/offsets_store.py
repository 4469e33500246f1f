"""Source offsets in Kafka (KIP-618): the pipeline's own offsets topic plus the global one.

Records. Key: JSON ``[pipeline, source_partition]`` (Kafka Connect's offset key layout, so
one topic can hold many pipelines); value: the JSON source offset, ``null`` = deleted. Keys
are canonical (sorted object keys), which log compaction needs: a partition's newer offset
must replace the older one. A second kind of key, ``{"pipeline": p, "record": "task-count"}``,
holds the task count of the pipeline's current generation (what the next start must fence).

Reading. Always read_committed, from the beginning to the high watermark taken when the
read starts: offsets written in a transaction that aborted, or that a zombie never
committed, are never seen. The combined view is the global topic overlaid by the pipeline's
own (seed 002: own first), so a pipeline that moves to its own topic keeps its offsets.

Topics are created if missing, compacted, with one partition: offsets are a few records per
transaction, and one partition keeps "read to the end" one fetch loop.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rayconnect.kafka.read_back import read_to_high_watermarks

TASK_COUNT = "task-count"


class OffsetsSnapshot(msgspec.Struct):
    """What one offsets topic says about one pipeline."""

    offsets: dict[str, Any] = {}  # encoded source partition -> source offset
    task_count: int | None = None
    generation: int = 0


def offset_key(pipeline: str, partition_key: str) -> bytes:
    """``partition_key`` is already canonical JSON (``source.base.encode_partition``)."""
    return msgspec.json.encode([pipeline, msgspec.Raw(partition_key.encode())])


def offset_value(offset: Any) -> bytes:
    return msgspec.json.encode(offset, order="sorted")


def task_count_key(pipeline: str) -> bytes:
    return msgspec.json.encode({"pipeline": pipeline, "record": TASK_COUNT}, order="sorted")


def task_count_value(tasks: int, generation: int) -> bytes:
    return msgspec.json.encode({"generation": generation, "tasks": tasks})


async def ensure_offsets_topic(bootstrap: str, topic: str, **client: Any) -> None:
    """Create ``topic`` (compacted, one partition) unless it exists; wait for metadata."""
    from rayconnect.kafka.admin import create_topic

    await create_topic(
        bootstrap, topic, 1, exist_ok=True, topic_configs={"cleanup.policy": "compact"}, **client
    )


async def read_offsets(
    bootstrap: str, topic: str, pipeline: str, *, timeout_s: float = 60.0, **client: Any
) -> OffsetsSnapshot:
    """Everything committed in ``topic`` about ``pipeline`` (read_committed, to the end)."""
    snap = OffsetsSnapshot()
    records = read_to_high_watermarks(bootstrap, topic, "read_committed", timeout_s, **client)
    async for r in records:
        _apply_record(snap, pipeline, r.key, r.value)
    return snap


def _apply_record(snap: OffsetsSnapshot, pipeline: str, key: bytes | None, value: Any) -> None:
    if key is None:
        return
    try:
        k = msgspec.json.decode(key)
    except msgspec.DecodeError:
        return  # not ours: the global topic may be shared
    if isinstance(k, list) and len(k) == 2 and k[0] == pipeline:
        pkey = msgspec.json.encode(k[1], order="sorted").decode()
        offset = None if value is None else msgspec.json.decode(value)
        if offset is None:
            snap.offsets.pop(pkey, None)
        else:
            snap.offsets[pkey] = offset
    elif isinstance(k, dict) and k.get("pipeline") == pipeline and k.get("record") == TASK_COUNT:
        v = msgspec.json.decode(value)
        snap.task_count, snap.generation = v["tasks"], v["generation"]


async def combined_offsets(
    bootstrap: str, own_topic: str, global_topic: str, pipeline: str, **client: Any
) -> tuple[dict[str, Any], OffsetsSnapshot]:
    """The combined view (global overlaid by own) and the own topic's snapshot."""
    own = await read_offsets(bootstrap, own_topic, pipeline, **client)
    if global_topic == own_topic:
        return dict(own.offsets), own
    shared = await read_offsets(bootstrap, global_topic, pipeline, **client)
    return {**shared.offsets, **own.offsets}, own
