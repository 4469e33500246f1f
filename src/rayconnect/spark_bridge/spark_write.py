"""``write_groups``: many groups of Arrow data written as Parquet files in ONE Spark job.

A Spark job costs ~0.5 s however small, so a transaction round must not run one job per
partition (docs/design.md, step 2). All blocks of all groups become ONE job: a ``range`` over
the block indexes, one task per executor core, and a ``mapInArrow`` whose tasks fetch their
blocks from Ray's object store (lent by the ``block_holder``) and write them with Arrow's
Parquet writer, one file per group per task, straight from the Arrow data. The task returns
(group, path) rows; nothing else crosses into the JVM.

Why not ``df.write.parquet``: it moves every row Arrow -> JVM rows -> Spark's Parquet
writer, an order of magnitude more CPU a row than Arrow's writer (bench/README.md), and on
a small machine that CPU is taken from the reader.

Each task writes with ``task_writes``/``task_files``, the same code the writer's own
process writes with when it writes without Spark (``write_here``); the files of a write are
the ones its job's result names (``written_files``).

Files land in ``<table>/staging/<uuid>/_rc_group=<i>/``, written through the table's
filesystem (``storage.TableLocation``): on a local disk or straight to an object store, so
executors on any node write where the committer reads. The folder name must not start with
``_`` or ``.``: delta-rs's vacuum treats such top-level folders as hidden and would never
remove the files of an aborted round.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import ray

from rayconnect.formats.rows import BadRecordError
from rayconnect.formats.settings import RecordFormat
from rayconnect.formats.transform import RECORDS_VIEW, records_schema
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.block_holder import holder_of
from rayconnect.spark_bridge.blocks import Block
from rayconnect.spark_bridge.group_order import distinct_key_layers, in_write_order
from rayconnect.spark_bridge.job_blocks import JobBlocks
from rayconnect.spark_bridge.task_errors import InputSchemaError, bad_record_in_task, from_task
from rayconnect.spark_bridge.task_writes import RoutedWrite
from rayconnect.spark_bridge.transform_job import transform_decoder, transformed_writer
from rayconnect.spark_bridge.write_result import WriteResult, merge_results
from rayconnect.spark_bridge.written_files import (
    RESULT_SCHEMA,
    ROUTED_RESULT_SCHEMA,
    group_files,
    result_batch,
)
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables.files import STAGING_DIR

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _block_writer(
    blocks: JobBlocks,
    record_format: RecordFormat | None = None,
    table_schema: pa.Schema | None = None,
    share_of: list[str | None] | None = None,
    key_of: Sequence[str | None] | None = None,
    routing: RoutedWrite | None = None,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: block indexes in, (group, file path) rows out.

    Blocks are Arrow end to end, so types are kept exactly: int32 partition,
    timestamp[us, UTC], binary, list<struct>. One block in memory at a time: a task's memory
    is one block (one row group), not the whole round. Indexes arrive in order and a group's
    blocks are consecutive, so a task holds one file open at a time (``TaskFiles``).

    With a typed ``record_format`` each block is decoded here (``formats.rows``), on the
    executor, in the round's one job: the decoded rows go to the group's file, bad records
    to a dead-letter file of the group, or - ``errors: stop`` - fail the write with the
    record's offset and reason.
    """
    layout = blocks.layout(record_format, share_of, key_of)

    def write_blocks(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writes = layout.writes(table_schema, routing)
        try:
            for index, table in blocks.each(batches):
                writes.add(blocks.group_of[index], table)
            written: Sequence[tuple[Any, ...]] = writes.finish()
        except BadRecordError as e:
            raise bad_record_in_task(e) from None
        finally:
            writes.abort()
        yield result_batch(written, routing is not None)

    return write_blocks


def _frame(
    spark: SparkSession,
    blocks: JobBlocks,
    record_format: RecordFormat | None,
    table_schema: pa.Schema | None,
    share_of: list[str | None] | None,
    key_of: Sequence[str | None] | None,
    routing: RoutedWrite | None = None,
) -> DataFrame:
    """The write of all blocks of all groups as ONE lazy DataFrame of (group, path) rows.

    One ``mapInArrow`` over a ``range`` of block indexes: the per-group cost of building a
    DataFrame per group (~0.1 s of Ray calls each, plus a Python pipeline per group in the
    job) would otherwise grow a round's write time with its number of partitions. With a
    transform: decode (Arrow, on the executors) -> the statement over the view ``records``
    -> write by group; still one lazy DataFrame, one job when collected.
    """
    if (
        record_format is None
        or record_format.transform_schema is None
        or record_format.transform is None  # never without transform_schema
    ):
        writer = _block_writer(blocks, record_format, table_schema, share_of, key_of, routing)
        out = RESULT_SCHEMA if routing is None else ROUTED_RESULT_SCHEMA
        return blocks.mapped(spark, writer, out)
    if key_of is None:
        raise InputSchemaError("a transform write needs the groups' partition keys")
    decoded = blocks.mapped(
        spark, transform_decoder(blocks, record_format), records_schema(record_format)
    )
    decoded.createOrReplaceTempView(RECORDS_VIEW)
    transformed = spark.sql(record_format.transform)
    write = transformed_writer(blocks, record_format, table_schema, share_of, key_of)
    from pyspark.sql.pandas.types import from_arrow_schema

    return transformed.mapInArrow(write, from_arrow_schema(RESULT_SCHEMA))


def write_groups(
    spark: SparkSession,
    table: str | TableLocation,
    groups: Sequence[Sequence[Block]],
    schema: pa.Schema = RAW_RECORD_SCHEMA,
    record_format: RecordFormat | None = None,
    table_schema: pa.Schema | None = None,
    keys: Sequence[str | None] | None = None,
    shares: Sequence[str | None] | None = None,
    routing: RoutedWrite | None = None,
) -> WriteResult:
    """Write all groups as Parquet files under the table (a path or a ``TableLocation``) in
    ONE Spark job.

    ``routing``: the records go to many tables (``RoutedWrite``; needs ``keys``): each
    file is under its route table's location and names it (``DataFile.table``); unrouted
    records' dead letters stay under ``table``.

    Groups with the same ``shares[i]`` token (not None) may share files: a task writes them
    into one file per table partition instead of one each, and the file names the groups'
    partition ``keys`` (``DataFile.shared_by``). The participant hosts pass their name, so
    a round's file count follows the hosts, not the partitions.

    ``groups[i]`` is a list of blocks in the table's schema: object refs to ``pa.Table`` (or
    ``pa.RecordBatch``), or ``blocks.Rows`` handles of rows inside such an object (a
    reader's one object per host per fetch; each task fetches an object once and slices it). ``files[i]`` are the files that hold exactly group i's rows, with paths
    relative to the table root and stats from the Parquet footers, ready to be committed;
    the job ids and timings come beside them. An empty group (or one whose batches have no
    rows) gets ``[]``. ``schema`` is the blocks' (raw) schema; a typed ``record_format``
    decodes them against ``table_schema`` (the table's now) into typed files, plus
    dead-letter files whose paths start with ``DEAD_LETTER_DIR/``.

    The files are not part of the table until a committer commits them; if nobody does,
    vacuum removes them.
    """
    start = time.perf_counter()
    location = as_location(table)
    non_empty, share_of = in_write_order(groups, keys, shares)
    if not non_empty:
        return WriteResult(files=[[] for _ in groups])
    transform = record_format is not None and record_format.transform_schema is not None
    if transform and keys is not None:
        layers = distinct_key_layers(groups, keys)
        if len(layers) > 1:  # rows find their group by partition: one job per layer
            return merge_results(
                [
                    write_groups(
                        spark, table, layer, schema, record_format, table_schema, keys, shares
                    )
                    for layer in layers
                ]
            )
    write_id = uuid.uuid4().hex
    staging_rel = f"{STAGING_DIR}/{write_id}"
    refs = [ref for _, group in non_empty for ref in group]
    group_of = [i for i, group in non_empty for _ in group]
    holder = holder_of(spark)
    ray.get(holder.handle.put.remote(write_id, refs))
    sc = spark.sparkContext
    job_group = f"rayconnect-write-{write_id}"
    try:
        blocks = JobBlocks(
            ray.get_runtime_context().gcs_address,
            holder.namespace,
            holder.name,
            write_id,
            group_of,
            schema,
            location,
            staging_rel,
        )
        df = _frame(
            spark,
            blocks,
            record_format,
            table_schema,
            share_of,
            list(keys) if keys is not None else None,
            routing,
        )
        prepared = time.perf_counter()
        sc.setJobGroup(job_group, f"rayconnect: {len(non_empty)} groups -> {location.uri}")
        rows = df.collect()
        job_files: list[tuple[Any, ...]] = [tuple(row) for row in rows]
    except Exception as exc:
        marked = from_task(exc)
        if marked is not None:
            raise marked from None
        raise
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
        if transform:  # the decoding stage's dead letters (before drop forgets them)
            job_files_dead = ray.get(holder.handle.reported.remote(write_id))
        ray.get(holder.handle.drop.remote(write_id))
    written = time.perf_counter()
    job_ids = list(sc.statusTracker().getJobIdsForGroup(job_group))
    if transform:
        job_files += job_files_dead
    files, changes = group_files(location, routing, staging_rel, job_files, len(groups), keys)
    return WriteResult(
        files=files,
        job_ids=sorted(job_ids),
        staging_dir=staging_rel,
        seconds=time.perf_counter() - start,
        prepare_seconds=prepared - start,
        spark_seconds=written - prepared,
        schema_changes=changes,
    )
