"""``write_groups_here``: ``write_groups`` without Spark, in this process."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from rayconnect.formats.settings import RecordFormat
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.blocks import Block, resolve
from rayconnect.spark_bridge.group_order import in_write_order
from rayconnect.spark_bridge.task_errors import InputSchemaError, conform_block
from rayconnect.spark_bridge.task_writes import FilesLayout, RoutedWrite
from rayconnect.spark_bridge.write_result import WriteResult
from rayconnect.spark_bridge.written_files import group_files
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables.files import STAGING_DIR


def write_groups_here(
    table: str | TableLocation,
    groups: Sequence[Sequence[Block]],
    schema: pa.Schema = RAW_RECORD_SCHEMA,
    record_format: RecordFormat | None = None,
    table_schema: pa.Schema | None = None,
    keys: Sequence[str | None] | None = None,
    shares: Sequence[str | None] | None = None,
    routing: RoutedWrite | None = None,
) -> WriteResult:
    """``write_groups`` in this process, without Spark: the same files (the same
    ``TableWrites``/``RoutedFiles`` a Spark task writes with, typed decoding and routes
    included), one after another.

    A Spark job costs 0.3-0.7 s however small (scenario (b): most of a round's END -> ACK at
    10k records/s), and Spark needs 20-30 s to start. A small write done here costs
    milliseconds, and writes can be made before Spark is up (``WriterActor``). Not for a
    transform (Spark SQL runs it): ``InputSchemaError``.
    """
    if record_format is not None and record_format.transform_schema is not None:
        raise InputSchemaError("a transform's write needs Spark")
    start = time.perf_counter()
    location = as_location(table)
    non_empty, share_of = in_write_order(groups, keys, shares)
    if not non_empty:
        return WriteResult(files=[[] for _ in groups])
    staging_rel = f"{STAGING_DIR}/{uuid.uuid4().hex}"
    key_of = list(keys) if keys is not None else None
    layout = FilesLayout(
        location, staging_rel, schema, len(groups), record_format, share_of, key_of
    )
    writes = layout.writes(table_schema, routing)
    try:
        index = 0
        tables = iter(resolve([b for _, blocks in non_empty for b in blocks]))
        for group, blocks in non_empty:
            for block in itertools.islice(tables, len(blocks)):
                try:
                    block = conform_block(block, schema, index)
                except ValueError as e:  # a cast Arrow refuses too
                    raise InputSchemaError(str(e).strip()) from None
                index += 1
                writes.add(group, block)
        written: Sequence[tuple[Any, ...]] = writes.finish()
    finally:
        writes.abort()
    files, changes = group_files(location, routing, staging_rel, written, len(groups), keys)
    return WriteResult(
        files=files,
        staging_dir=staging_rel,
        seconds=time.perf_counter() - start,
        schema_changes=changes,
    )
