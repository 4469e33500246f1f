"""Helpers for committer tests on real tables: records of a partition in the raw schema, and
files staged where the writer would put them (uncommitted), described like the writer does."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.files import STAGING_DIR, describe_file

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


def stage(table_path: Path, table: pa.Table) -> DataFile:
    """Write a file where the writer would, uncommitted, and describe it like the writer."""
    rel = f"{STAGING_DIR}/{uuid.uuid4().hex}/part-0.parquet"
    (table_path / rel).parent.mkdir(parents=True)
    pq.write_table(table, table_path / rel)
    data_file, _ = describe_file(str(table_path), rel)
    return data_file
