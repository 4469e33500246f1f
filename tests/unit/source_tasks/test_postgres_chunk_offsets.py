"""Chunk progress committed by snapshot workers (chunk_offsets): a restarted task takes, per
chunk of its plan, what the chunk's worker committed - never a chunk offset of another
plan - and continues each unfinished chunk in a segment at the new exported snapshot's LSN,
without a new one when the worker's progress already is at that LSN."""

from __future__ import annotations

import msgspec

from rayconnect.kafka.offsets_store import offset_value
from rayconnect.source_tasks.base import encode_partition
from rayconnect.source_tasks.postgres.chunk_offsets import (
    ChunkOffset,
    chunk_partition,
    committed_chunk,
    merge_committed,
    snapshot_ids,
)
from rayconnect.source_tasks.postgres.progress import Chunk, Progress, Segment


def _committed(slot: str, index: int, plan: int, chunk: Chunk) -> tuple[str, object]:
    """As the offsets store hands it back: the JSON the worker wrote, decoded."""
    value = offset_value(msgspec.to_builtins(ChunkOffset(plan, chunk)))
    return encode_partition(chunk_partition(slot, index)), msgspec.json.decode(value)


def test_a_restarted_task_takes_each_chunk_as_its_worker_committed_it() -> None:
    plan = [Chunk("public.t", None, [100], None), Chunk("public.t", [100], None, [100])]
    for chunk in plan:
        chunk.begin_segment(10)
    progress = Progress(chunks=[msgspec.structs.replace(c) for c in plan], plan=7)
    written = Chunk("public.t", None, [100], [40], [Segment(None, 10)])
    stale = Chunk("public.t", [100], None, [180], [Segment([100], 3)], done=True)
    offsets = dict([_committed("s", 0, 7, written), _committed("s", 1, 6, stale)])
    merge_committed(progress, offsets, "s")
    assert progress.chunks == [written, plan[1]]  # chunk 1's offset is an older plan's
    assert committed_chunk(offsets, "s", 6, 1) == stale
    assert committed_chunk(offsets, "other", 7, 0) is None

    # a new exported snapshot: chunk 0 continues from key 40 at LSN 20, chunk 1 from 100
    progress.begin_chunks(20)
    assert progress.chunks[0].segments == [Segment(None, 10), Segment([40], 20)]
    assert progress.chunks[1].segments == [Segment([100], 20)]


def test_progress_read_back_in_the_same_snapshot_keeps_its_segments() -> None:
    chunk = Chunk("public.t", None, None, [40], [Segment(None, 10), Segment([20], 30)])
    chunk.continue_at(30)  # written at 30 already: rows after 40 are read at 30 too
    assert chunk.segments == [Segment(None, 10), Segment([20], 30)]
    chunk.continue_at(50)
    assert chunk.segments[-1] == Segment([40], 50)
    done = Chunk("public.t", None, None, [40], [Segment(None, 10)], done=True)
    done.continue_at(50)
    assert done.segments == [Segment(None, 10)]


def test_every_snapshot_transactional_id_is_derived_from_the_task_id() -> None:
    assert snapshot_ids("rc-p-0", 2) == [
        "rc-p-0-snapshot-plan",
        "rc-p-0-snapshot-0",
        "rc-p-0-snapshot-1",
    ]
