"""A round's data files without the rows a table holds already (``protocol.table_offsets``:
after a coordinator died between the tables of a round, the partition is read again from the
smallest offset and each table skips what it has).

Only after such a recovery does a table have a floor above the round's start, so the files
are read only then; a file wholly below is dropped, one partly below rewritten beside it
with the rest (the original is left to vacuum).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayconnect.protocol.types import DataFile, TopicPartition
from rayconnect.storage.location import TableLocation
from rayconnect.tables.files import describe_file

#: (cluster, topic, partition, offset) columns of a typed file, and of a raw one
_TYPED = ("_kafka_cluster", "_kafka_topic", "_kafka_partition", "_kafka_offset")
_RAW = ("cluster", "topic", "partition", "offset")


def without_rows_below(
    files: Sequence[DataFile],
    floors: Mapping[str, int],
    location: TableLocation,
    filesystem: Any,
) -> list[DataFile]:
    """``files`` (of the table at ``location``) without the rows of each partition key in
    ``floors`` whose offset is below its floor. Dead-letter files are left as they are
    (their table skips by its own offsets: ``tables.dead_letters``)."""
    if not floors:
        return list(files)
    keep: list[DataFile] = []
    for f in files:
        if f.dead_letters or not set(f.shared_by) & set(floors):
            keep.append(f)
            continue
        rows = pq.read_table(location.path(f.path), filesystem=filesystem)
        names = _TYPED if _TYPED[0] in rows.column_names else _RAW
        cluster, topic, partition, offset = (rows.column(n).to_pylist() for n in names)
        mask = pa.array(
            [
                o >= floors.get(TopicPartition(c, t, p).key, 0)
                for c, t, p, o in zip(cluster, topic, partition, offset, strict=True)
            ],
            pa.bool_(),
        )
        kept = int(pc.sum(mask).as_py() or 0)
        if kept == rows.num_rows:
            keep.append(f)
        elif kept:
            rel = f.path.rsplit(".", 1)[0] + f"-from-{uuid.uuid4().hex[:8]}.parquet"
            pq.write_table(rows.filter(mask), location.path(rel), filesystem=filesystem)
            described = describe_file(location, rel, filesystem)[0]
            keep.append(msgspec.structs.replace(described, shared_by=f.shared_by, table=f.table))
    return keep
