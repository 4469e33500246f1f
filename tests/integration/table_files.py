"""Helpers for committer tests on real tables: records of a partition in the raw schema, and
files staged where the writer would put them (uncommitted), described like the writer does."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.storage.location import TableLocation
from rayconnect.tables.files import STAGING_DIR, describe_file

PIPELINE = "pipe"
K0 = "c1/orders/0"
K1 = "c1/orders/1"


def records(key: str, start: int, n: int) -> pa.Table:
    cluster, topic, partition = key.rsplit("/", 2)
    return pa.Table.from_pylist(
        [
            {
                "cluster": cluster,
                "topic": topic,
                "partition": int(partition),
                "offset": off,
                "timestamp": 1_700_000_000_000_000 + off,
                "key": f"k{off}".encode(),
                "value": None if off % 5 == 0 else f"v{off}".encode(),
                "headers": [{"key": "h", "value": b"x"}],
            }
            for off in range(start, start + n)
        ],
        schema=RAW_RECORD_SCHEMA,
    )


def stage(table: Path | TableLocation, data: pa.Table) -> DataFile:
    """Write a file where the writer would (a local table folder, or any table location on
    a store), uncommitted, and describe it like the writer."""
    location = table if isinstance(table, TableLocation) else TableLocation.parse(str(table))
    rel = f"{STAGING_DIR}/{uuid.uuid4().hex}/part-0.parquet"
    filesystem = location.filesystem()
    location.make_parents(filesystem, location.path(rel))
    pq.write_table(data, location.path(rel), filesystem=filesystem)
    data_file, _ = describe_file(location, rel)
    return data_file
