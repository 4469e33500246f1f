"""Write many groups of Arrow data as Parquet files in ONE Spark job.

A Spark job costs ~0.5 s however small, so a transaction round must not run one job per
partition (design.md, step 2). All blocks of all groups become one DataFrame with a
``_rc_group`` column (the group index) and are written with ``partitionBy("_rc_group")``:
Spark stores partition columns in the directory name, not in the files, so every file under
``_rc_group=<i>/`` holds only group ``i``'s rows, in exactly the table's schema.

Files land in ``<table>/staging/<uuid>/``. The folder name must not start with ``_`` or
``.``: delta-rs's vacuum treats such top-level folders as hidden and would never remove the
files of an aborted round.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import ray

from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.files import STAGING_DIR, describe_file, schema_differences

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

GROUP_COLUMN = "_rc_group"


class InputSchemaError(ValueError):
    """The Arrow data handed to the writer does not have the table's schema."""


@dataclass(frozen=True)
class WriteResult:
    """What one ``write_groups`` call did; ``job_ids`` proves it ran a single Spark job."""

    files: list[list[DataFile]]
    job_ids: list[int] = field(default_factory=list)
    staging_dir: str | None = None  # relative to the table root
    seconds: float = 0.0
    prepare_seconds: float = 0.0  # lend refs to the holder + build the lazy DataFrame
    spark_seconds: float = 0.0  # the Spark job itself


#: Marks an input-schema error raised inside a Spark task, so the driver can re-raise it as
#: ``InputSchemaError`` instead of Spark's generic PythonException.
_INPUT_SCHEMA_MARK = "rayconnect-input-schema:"


@ray.remote(num_cpus=0)
class _BlockHolder:
    """Lends the refs of one write to the Spark tasks, and lets go of them afterwards.

    Spark's Python workers are separate Ray drivers: they can only get an object by asking a
    live Ray process that holds its ref. RayDP's own ``to_spark`` parks refs in its master
    actor and never drops them (every batch ever written would stay pinned in the object
    store), so the writer uses this holder and calls ``drop`` after each job.
    """

    def __init__(self) -> None:
        self._writes: dict[str, list[ray.ObjectRef]] = {}

    def put(self, write_id: str, refs: list[ray.ObjectRef]) -> None:
        self._writes[write_id] = refs

    def get(self, write_id: str, indexes: list[int]) -> list[ray.ObjectRef]:
        refs = self._writes[write_id]
        return [refs[i] for i in indexes]

    def drop(self, write_id: str) -> None:
        self._writes.pop(write_id, None)


_holders: dict[str, tuple[ray.actor.ActorHandle, str, str]] = {}


def _holder(spark: SparkSession) -> tuple[ray.actor.ActorHandle, str, str]:
    """This session's block holder (created on first use): handle, name, namespace.

    Owned by the process running the session (the writer actor), so it dies with it.
    """
    name = f"{spark.sparkContext.appName}_RC_BLOCKS"
    if name not in _holders:
        namespace = ray.get_runtime_context().namespace
        handle = _BlockHolder.options(name=name, namespace=namespace, get_if_exists=True).remote()
        _holders[name] = (handle, name, namespace)
    return _holders[name]


def _conform(table: pa.Table, schema: pa.Schema, index: int) -> pa.Table:
    """The block in exactly the table's column order and types, or an input-schema error."""
    problems = schema_differences(table.schema, schema)
    if problems:
        raise ValueError(f"{_INPUT_SCHEMA_MARK} block {index}: {'; '.join(problems)}")
    return table.select(schema.names).cast(schema)


def _block_reader(
    ray_address: str,
    namespace: str,
    holder_name: str,
    write_id: str,
    group_of: list[int],
    schema: pa.Schema,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: block indexes in, the blocks' rows + group column out.

    Arrow end to end (no pandas round trip as in RayDP's ``to_spark``), so types are kept
    exactly: int32 partition, timestamp[us, UTC], binary, list<struct>.
    """

    def read_blocks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import ray  # runs in a Spark Python worker: a separate Ray driver

        if not ray.is_initialized():
            ray.init(
                address=ray_address,
                namespace=namespace,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        holder = ray.get_actor(holder_name, namespace=namespace)
        for batch in batches:
            indexes = batch.column(0).to_pylist()
            refs = ray.get(holder.get.remote(write_id, indexes))
            for index, ref in zip(indexes, refs, strict=True):
                # One block at a time: a task's memory stays one block, not the whole round.
                block = ray.get(ref)
                table = block if isinstance(block, pa.Table) else pa.Table.from_batches([block])
                table = _conform(table, schema, index)
                group = pa.array([group_of[index]] * table.num_rows, pa.int32())
                yield from table.append_column(GROUP_COLUMN, group).to_batches()

    return read_blocks


def _executor_cores(spark: SparkSession) -> int:
    conf = spark.sparkContext.getConf()
    try:
        return int(conf.get("spark.executor.instances", "1")) * int(
            conf.get("spark.executor.cores", "1")
        )
    except ValueError:
        return spark.sparkContext.defaultParallelism


def _blocks_frame(
    spark: SparkSession,
    holder: tuple[ray.actor.ActorHandle, str, str],
    write_id: str,
    refs: list[ray.ObjectRef],
    group_of: list[int],
    schema: pa.Schema,
) -> DataFrame:
    """All blocks of all groups as ONE lazy DataFrame with a ``_rc_group`` column.

    One ``mapInArrow`` over a ``range`` of block indexes: the per-group cost of building a
    DataFrame per group (~0.1 s of Ray calls each, plus a Python pipeline per group in the
    job) would otherwise grow a round's write time with its number of partitions.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    _, holder_name, namespace = holder
    out_schema = schema.append(pa.field(GROUP_COLUMN, pa.int32()))
    # One task per executor core: each task writes one file per group it sees. Not
    # defaultParallelism: Spark makes that at least 2, and two tasks queued on one core
    # cost a round ~0.15 s and twice the files (micro_spark_write.py: 0.78 -> 0.62 s).
    slices = max(1, min(len(refs), _executor_cores(spark)))
    reader = _block_reader(
        ray.get_runtime_context().gcs_address, namespace, holder_name, write_id, group_of, schema
    )
    return spark.range(0, len(refs), 1, slices).mapInArrow(reader, from_arrow_schema(out_schema))


def _collect_files(table_path: str, staging_rel: str, index: int) -> list[DataFile]:
    """Describe the Parquet files Spark wrote for group ``index`` (none if it had no rows)."""
    group_rel = os.path.join(staging_rel, f"{GROUP_COLUMN}={index}")
    group_dir = os.path.join(table_path, group_rel)
    if not os.path.isdir(group_dir):
        return []
    files: list[DataFile] = []
    for name in sorted(os.listdir(group_dir)):
        if name.endswith(".crc"):
            # Hadoop's local checksum files: nothing reads them; drop them at once.
            os.remove(os.path.join(group_dir, name))
            continue
        if name.startswith((".", "_")) or not name.endswith(".parquet"):
            continue
        data_file, _ = describe_file(table_path, os.path.join(group_rel, name))
        files.append(data_file)
    return files


def write_groups_detailed(
    spark: SparkSession,
    table_path: str,
    groups: Sequence[Sequence[ray.ObjectRef]],
    schema: pa.Schema = RAW_RECORD_SCHEMA,
) -> WriteResult:
    """Write every group in one Spark job; see ``write_groups``. Also reports the job ids."""
    start = time.perf_counter()
    non_empty = [(i, refs) for i, refs in enumerate(groups) if refs]
    if not non_empty:
        return WriteResult(files=[[] for _ in groups])
    write_id = uuid.uuid4().hex
    staging_rel = f"{STAGING_DIR}/{write_id}"
    refs = [ref for _, group in non_empty for ref in group]
    group_of = [i for i, group in non_empty for _ in group]
    holder = _holder(spark)
    ray.get(holder[0].put.remote(write_id, refs))
    sc = spark.sparkContext
    job_group = f"rayconnect-write-{write_id}"
    try:
        df = _blocks_frame(spark, holder, write_id, refs, group_of, schema)
        prepared = time.perf_counter()
        sc.setJobGroup(job_group, f"rayconnect: {len(non_empty)} groups -> {table_path}")
        df.write.mode("errorifexists").partitionBy(GROUP_COLUMN).parquet(
            os.path.join(table_path, staging_rel)
        )
    except Exception as exc:
        text = str(exc)
        if _INPUT_SCHEMA_MARK in text:
            detail = text.split(_INPUT_SCHEMA_MARK, 1)[1].splitlines()[0].strip()
            raise InputSchemaError(detail) from None
        raise
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
        ray.get(holder[0].drop.remote(write_id))
    written = time.perf_counter()
    job_ids = list(sc.statusTracker().getJobIdsForGroup(job_group))
    files = [_collect_files(table_path, staging_rel, i) for i in range(len(groups))]
    return WriteResult(
        files=files,
        job_ids=sorted(job_ids),
        staging_dir=staging_rel,
        seconds=time.perf_counter() - start,
        prepare_seconds=prepared - start,
        spark_seconds=written - prepared,
    )


def write_groups(
    spark: SparkSession,
    table_path: str,
    groups: Sequence[Sequence[ray.ObjectRef]],
    schema: pa.Schema = RAW_RECORD_SCHEMA,
) -> list[list[DataFile]]:
    """Write all groups as Parquet files under ``table_path`` in ONE Spark job.

    ``groups[i]`` is a list of object refs to ``pa.Table`` (or ``pa.RecordBatch``) in the
    table's schema. Returns, for each group, the files that hold exactly that group's rows,
    with paths relative to ``table_path`` and stats from the Parquet footers, ready to be
    committed. An empty group (or one whose batches have no rows) gets ``[]``.

    The files are not part of the table until a committer commits them; if nobody does,
    vacuum removes them.
    """
    return write_groups_detailed(spark, table_path, groups, schema).files
