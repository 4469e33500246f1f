"""Typed rounds staged the way the Spark executors stage them (decoded with ``formats.rows``
against the table's schema now, split per table partition), without Spark: what the typed
committer tests of every table kind commit."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.formats.partitioning import split
from rayconnect.formats.rows import decode_block, partition_specs
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.storage.location import TableLocation
from rayconnect.tables.files import STAGING_DIR, describe_file

#: an upsert table keyed by the record key's ``id`` (JSON key and value, ``v`` a string)
UPSERT_BY_ID = RecordFormat(
    value_format="json",
    value_schema={"id": "long", "v": "string"},
    key_format="json",
    key_schema={"id": "long"},
    include_key=True,
    upsert_keys=("id",),
)


def raw(values: list[bytes], start: int, partition: int = 0) -> pa.Table:
    """Raw records of cluster ``c``, topic ``t``, one partition, offsets from ``start``."""
    n = len(values)
    return pa.Table.from_pydict(
        {
            "cluster": ["c"] * n,
            "topic": ["t"] * n,
            "partition": [partition] * n,
            "offset": list(range(start, start + n)),
            "timestamp": [1_700_000_000_000_000] * n,
            "key": [b"k"] * n,
            "value": values,
            "headers": [[]] * n,
        },
        schema=RAW_RECORD_SCHEMA,
    )


def stage_decoded(
    table: Path, values: list[bytes], start: int, fmt: RecordFormat, table_schema: pa.Schema
) -> list[DataFile]:
    """Decode against ``table_schema`` and stage one file per table partition, plus the
    dead letters' file, under the table folder ``table``."""
    return stage_records(table, raw(values, start), fmt, table_schema)


def stage_records(
    table: Path | TableLocation, records: pa.Table, fmt: RecordFormat, table_schema: pa.Schema
) -> list[DataFile]:
    """``stage_decoded`` of raw ``records`` (any keys, values, partitions); ``table``: a
    local folder or any table location on a store."""
    location = table if isinstance(table, TableLocation) else TableLocation.parse(str(table))
    filesystem = location.filesystem()
    block = decode_block(records, fmt, table_schema)
    files = []
    staging = f"{STAGING_DIR}/{uuid.uuid4().hex}"
    parts = split(block.rows, partition_specs(fmt), fmt.partition_values_in_files)
    staged = [
        (f"{staging}/{folder}/part-0.parquet".replace("//", "/"), rows) for folder, rows in parts
    ]
    staged.append((f"{DEAD_LETTER_DIR}/{staging}/part-0.parquet", block.dead_letters))
    for rel, rows in staged:
        if rows.num_rows:
            location.make_parents(filesystem, location.path(rel))
            pq.write_table(rows, location.path(rel), filesystem=filesystem)
            dead = rel.startswith(DEAD_LETTER_DIR)
            files.append(describe_file(location, rel, dead_letters=dead)[0])
    return files
