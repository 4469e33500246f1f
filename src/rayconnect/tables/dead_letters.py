"""Which of a round's dead letters a dead-letter table still lacks - for every table kind.

Exactly once across the two tables of a typed sink: the dead-letter table carries, per
partition, the next offset up to which its bad records are in (Delta: txn versions; Iceberg:
a table property), set in the same commit as the files. The round's dead letters are
committed *before* the round's main commit; an attempt that dies in between leaves them in
the dead-letter table, and the next attempt of the same offsets (after recovery, or a
fenced coordinator's - decoding is deterministic, so they are the same records) drops the
rows below that offset here instead of adding them twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.protocol.types import DataFile, TopicPartition
from rayconnect.storage.location import TableLocation
from rayconnect.tables.files import describe_file


def unseen(
    files: Sequence[DataFile],
    done: Mapping[str, int],
    table: TableLocation,
    dead_table: TableLocation,
    filesystem: Any,
) -> list[DataFile]:
    """The round's dead-letter ``files`` (paths under ``table``'s ``DEAD_LETTER_DIR``) as
    files of ``dead_table`` (paths relative to it), without the rows whose offset is below
    ``done[partition key]``. A file partly below is rewritten with the rest (rare: part of
    it was committed by an attempt that died)."""
    keep: list[DataFile] = []
    for f in files:
        rel = f.path[len(DEAD_LETTER_DIR) + 1 :]
        rows = pq.read_table(table.path(f.path), filesystem=filesystem)
        keys = [
            TopicPartition(c, t, p).key
            for c, t, p in zip(
                rows["_kafka_cluster"].to_pylist(),
                rows["_kafka_topic"].to_pylist(),
                rows["_kafka_partition"].to_pylist(),
                strict=True,
            )
        ]
        mask = [
            off >= done.get(k, 0)
            for k, off in zip(keys, rows["_kafka_offset"].to_pylist(), strict=True)
        ]
        if all(mask):
            keep.append(msgspec.structs.replace(f, path=rel))
        elif any(mask):
            part = rel.rsplit(".", 1)[0] + f"-from-{uuid.uuid4().hex[:8]}.parquet"
            pq.write_table(
                rows.filter(pa.array(mask)), dead_table.path(part), filesystem=filesystem
            )
            keep.append(describe_file(dead_table, part, filesystem, dead_letters=True)[0])
    return keep


def next_offsets(done: Mapping[str, int], offsets: Mapping[str, int]) -> dict[str, int]:
    """The dead-letter table's offsets after the round: never lower than they were."""
    return {k: max(done.get(k, 0), v) for k, v in sorted(offsets.items())}
