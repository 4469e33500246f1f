"""Write many groups of Arrow data as Parquet files in ONE Spark job.

A Spark job costs ~0.5 s however small, so a transaction round must not run one job per
partition (design.md, step 2). All blocks of all groups become ONE job: a ``range`` over the
block indexes, one task per executor core, and a ``mapInArrow`` whose tasks fetch their blocks
from Ray's object store and write them with Arrow's Parquet writer, one file per group per
task, straight from the Arrow data. The task returns (group, path) rows; nothing else crosses
into the JVM.

Why not ``df.write.parquet``: it moves every row Arrow -> JVM rows -> Spark's Parquet writer,
~3.9 us of JVM CPU a row here (bench (a): 7.8 of 15.8 CPU-s of the pipeline for 2M records),
against ~0.3 us for Arrow's writer on the same data; on 2 cores that CPU is taken from the
reader.

Exactly-once of the files: the files of a write are the ones the job's *result* names, never a
directory listing. A failed task attempt (or one Spark re-ran) may leave a file behind; no
result names it, nothing commits it, and vacuum removes it with the staging folder.

Files land in ``<table>/staging/<uuid>/_rc_group=<i>/``, written through the table's
filesystem (``storage.TableLocation``): on a local disk or straight to an object store, so
executors on any node write where the committer reads. The folder name must not start with
``_`` or ``.``: delta-rs's vacuum treats such top-level folders as hidden and would never
remove the files of an aborted round.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import pyarrow as pa
import ray

from rayconnect.formats.partitioning import split as split_partitions
from rayconnect.formats.rows import BadRecordError, decode_block, partition_specs
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.files import STAGING_DIR, describe_file, schema_differences
from rayconnect.storage.location import TableLocation, as_location

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


#: Marks a bad record (``errors: stop``) raised inside a Spark task.
_BAD_RECORD_MARK = "rayconnect-bad-record:"

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

    Owned by the process running the session (the writer actor), so it dies with it; and
    placed on its node, so that no other node's loss can take it (and every later write).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"{spark.sparkContext.appName}_RC_BLOCKS"
    if name not in _holders:
        context = ray.get_runtime_context()
        namespace = context.namespace
        handle = _BlockHolder.options(
            name=name,
            namespace=namespace,
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False),
        ).remote()
        _holders[name] = (handle, name, namespace)
    return _holders[name]


def _conform(table: pa.Table, schema: pa.Schema, index: int) -> pa.Table:
    """The block in exactly the table's column order and types, or an input-schema error."""
    problems = schema_differences(table.schema, schema)
    if problems:
        raise ValueError(f"{_INPUT_SCHEMA_MARK} block {index}: {'; '.join(problems)}")
    return table.select(schema.names).cast(schema)


#: What a write task returns: one row per file it wrote.
_RESULT_SCHEMA = pa.schema([pa.field(GROUP_COLUMN, pa.int32()), pa.field("path", pa.string())])


def _parquet_options(schema: pa.Schema) -> dict[str, object]:
    """Dictionary-encode only the flat non-binary columns (cluster, topic, partition...).

    Keys and values are mostly unique: a dictionary for them is built, overflows and is
    thrown away on every page (bench: 0.39 -> 0.29 us a row without it).
    """
    flat = [
        f.name for f in schema if not (pa.types.is_binary(f.type) or pa.types.is_nested(f.type))
    ]
    return {"use_dictionary": flat, "compression": "snappy"}


def _block_writer(
    ray_address: str,
    namespace: str,
    holder_name: str,
    write_id: str,
    group_of: list[int],
    schema: pa.Schema,
    location: TableLocation,
    staging_rel: str,
    record_format: RecordFormat | None = None,
    table_schema: pa.Schema | None = None,
    share_of: list[str | None] | None = None,
    key_of: Sequence[str | None] | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: block indexes in, (group, file path) rows out.

    Consecutive groups with the same ``share_of`` token (not None) go into the same files,
    but never two groups of one partition (``key_of``): a flush of a round that was
    discarded must not ride in the file of a newer one, which its partition alone would
    vouch for. A file yields one row per group it holds.

    Blocks are Arrow end to end, so types are kept exactly: int32 partition,
    timestamp[us, UTC], binary, list<struct>. One block in memory at a time: a task's memory
    is one block (one row group), not the whole round. Indexes arrive in order and a group's
    blocks are consecutive, so a task holds one file open at a time.

    With a typed ``record_format`` each block is decoded here (``formats.rows``), on the
    executor, in the round's one job: the decoded rows go to the group's file (a block that
    brings new columns starts a new file with its own schema: the committer evolves the
    table), bad records to a dead-letter file of the group, or - ``errors: stop`` - fail
    the write with the record's offset and reason.
    """
    typed = record_format is not None and record_format.typed

    def write_blocks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        import ray  # runs in a Spark Python worker: a separate Ray driver

        if not ray.is_initialized():
            ray.init(
                address=ray_address,
                namespace=namespace,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        holder = ray.get_actor(holder_name, namespace=namespace)
        options = _parquet_options(schema)
        filesystem = location.filesystem()
        attempt = uuid.uuid4().hex  # each task attempt writes files of its own
        written: list[tuple[int, str]] = []
        #: the current group's (or share's) open files, by table partition folder
        #: ("" unpartitioned), with the path each one has from the staging folder
        current: dict[str, tuple[pq.ParquetWriter, str]] = {}
        in_file: set[tuple[int, str]] = set()  # (group, path) rows already in `written`
        dead: list[pa.Table] = []
        last_group: int | None = None
        shares = share_of or [None] * (max(group_of, default=0) + 1)
        open_keys: set[str | None] = set()  # partitions in the open files

        def same_files(a: int, b: int) -> bool:
            return (
                shares[a] is not None
                and shares[a] == shares[b]
                and key_of is not None
                and key_of[b] not in open_keys
            )

        specs = partition_specs(record_format) if typed else []  # type: ignore[arg-type]
        in_files = typed and record_format.partition_values_in_files  # type: ignore[union-attr]

        def open_file(
            group: int, file_schema: pa.Schema, rel_root: str, folder: str = ""
        ) -> tuple[pq.ParquetWriter, str]:
            if folder:  # Hive folders only: readers parse every name=value of the path
                rel = f"{rel_root}/{folder}/part-{attempt}-g{group}-{len(written)}.parquet"
            else:
                rel = f"{rel_root}/{GROUP_COLUMN}={group}/part-{attempt}-{len(written)}.parquet"
            path = location.path(rel)
            location.make_parents(filesystem, path)
            opts = options if not typed else _parquet_options(file_schema)
            writer = pq.ParquetWriter(path, file_schema, filesystem=filesystem, **opts)
            return writer, rel[len(staging_rel) + 1 :] if rel_root == staging_rel else rel

        def holds(group: int, rel: str) -> None:
            if (group, rel) not in in_file:
                in_file.add((group, rel))
                written.append((group, rel))

        def close_all() -> None:
            for w, _ in current.values():
                w.close()
            current.clear()
            open_keys.clear()

        def flush_dead(group: int) -> None:
            if dead:
                rows = pa.concat_tables(dead)
                dead.clear()
                dl_root = f"{DEAD_LETTER_DIR}/{staging_rel}"
                w, rel = open_file(group, rows.schema, dl_root)
                with w:
                    w.write_table(rows)
                holds(group, rel)

        try:
            for batch in batches:
                indexes = batch.column(0).to_pylist()
                refs = ray.get(holder.get.remote(write_id, indexes))
                for index, ref in zip(indexes, refs, strict=True):
                    block = ray.get(ref)
                    table = block if isinstance(block, pa.Table) else pa.Table.from_batches([block])
                    group = group_of[index]
                    if last_group is not None and last_group != group:
                        if not same_files(last_group, group):
                            close_all()
                        flush_dead(last_group)  # dead letters stay per group
                    last_group = group
                    open_keys.add(key_of[group] if key_of is not None else None)
                    if typed:
                        assert record_format is not None
                        decoded = decode_block(
                            _conform(table, schema, index), record_format, table_schema
                        )
                        table = decoded.rows
                        if decoded.dead_letters.num_rows:
                            dead.append(decoded.dead_letters)
                    else:
                        table = _conform(table, schema, index)
                    if table.num_rows == 0:
                        continue
                    for folder, rows in split_partitions(table, specs, in_files):
                        opened = current.get(folder)
                        if opened is not None and opened[0].schema != rows.schema:
                            opened[0].close()  # new columns: a file of their own
                            opened = None
                        if opened is None:
                            opened = current[folder] = open_file(
                                group, rows.schema, staging_rel, folder
                            )
                        opened[0].write_table(rows)
                        holds(group, opened[1])
            close_all()
            if last_group is not None:
                flush_dead(last_group)
        except BadRecordError as e:
            raise ValueError(f"{_BAD_RECORD_MARK} {e}") from None
        finally:
            close_all()  # idempotent
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([g for g, _ in written], pa.int32()),
                pa.array([r for _, r in written], pa.string()),
            ],
            schema=_RESULT_SCHEMA,
        )

    return write_blocks


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
    location: TableLocation,
    staging_rel: str,
    record_format: RecordFormat | None = None,
    table_schema: pa.Schema | None = None,
    share_of: list[str | None] | None = None,
    key_of: Sequence[str | None] | None = None,
) -> DataFrame:
    """The write of all blocks of all groups as ONE lazy DataFrame of (group, path) rows.

    One ``mapInArrow`` over a ``range`` of block indexes: the per-group cost of building a
    DataFrame per group (~0.1 s of Ray calls each, plus a Python pipeline per group in the
    job) would otherwise grow a round's write time with its number of partitions.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    _, holder_name, namespace = holder
    # One task per executor core. Not defaultParallelism: Spark makes that at least 2, and
    # two tasks queued on one core cost a round ~0.15 s and twice the files
    # (micro_spark_write.py: 0.78 -> 0.62 s). Contiguous slices keep a group's blocks
    # together, so each task writes one file per group it sees.
    slices = max(1, min(len(refs), _executor_cores(spark)))
    writer = _block_writer(
        ray.get_runtime_context().gcs_address,
        namespace,
        holder_name,
        write_id,
        group_of,
        schema,
        location,
        staging_rel,
        record_format,
        table_schema,
        share_of,
        key_of,
    )
    return spark.range(0, len(refs), 1, slices).mapInArrow(
        writer, from_arrow_schema(_RESULT_SCHEMA)
    )


def _describe_files(
    location: TableLocation,
    staging_rel: str,
    written: list[tuple[int, str]],
    n_groups: int,
    keys: Sequence[str | None] | None = None,
) -> list[list[DataFile]]:
    """Each group's files, from the job's result (never a listing: see the module doc).
    A file several groups share is described once and names their ``keys`` (``shared_by``)."""
    files: list[list[DataFile]] = [[] for _ in range(n_groups)]
    filesystem = location.filesystem()
    groups_of: dict[str, list[int]] = {}
    for group, rel in sorted(written):
        groups_of.setdefault(rel, []).append(group)
    for rel, groups in groups_of.items():
        # dead-letter files come with their path from the table root
        full = rel if rel.startswith(DEAD_LETTER_DIR + "/") else f"{staging_rel}/{rel}"
        data_file, _ = describe_file(location, full, filesystem)
        if len(groups) > 1:
            if keys is None or any(keys[g] is None for g in groups):
                raise AssertionError(f"{rel} holds groups {groups} without partition keys")
            shared_by = tuple(sorted({keys[g] for g in groups}))  # type: ignore[misc]
            data_file = msgspec.structs.replace(data_file, shared_by=shared_by)
        for group in groups:
            files[group].append(data_file)
    return files


def write_groups(
    spark: SparkSession,
    table: str | TableLocation,
    groups: Sequence[Sequence[ray.ObjectRef]],
    schema: pa.Schema = RAW_RECORD_SCHEMA,
    record_format: RecordFormat | None = None,
    table_schema: pa.Schema | None = None,
    keys: Sequence[str | None] | None = None,
    shares: Sequence[str | None] | None = None,
) -> WriteResult:
    """Write all groups as Parquet files under the table (a path or a ``TableLocation``) in
    ONE Spark job.

    Groups with the same ``shares[i]`` token (not None) may share files: a task writes them
    into one file per table partition instead of one each, and the file names the groups'
    partition ``keys`` (``DataFile.shared_by``). The participant hosts pass their name, so
    a round's file count follows the hosts, not the partitions.

    ``groups[i]`` is a list of object refs to ``pa.Table`` (or ``pa.RecordBatch``) in the
    table's schema. ``files[i]`` are the files that hold exactly group i's rows, with paths
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
    non_empty = [(i, refs) for i, refs in enumerate(groups) if refs]
    if not non_empty:
        return WriteResult(files=[[] for _ in groups])
    share_of: list[str | None] | None = None
    if shares is not None and keys is not None:
        share_of = [s if keys[i] is not None else None for i, s in enumerate(shares)]
        # a share's groups next to each other: a task keeps one file open per share
        non_empty.sort(key=lambda item: (share_of[item[0]] or "", item[0]))  # type: ignore[index]
    write_id = uuid.uuid4().hex
    staging_rel = f"{STAGING_DIR}/{write_id}"
    refs = [ref for _, group in non_empty for ref in group]
    group_of = [i for i, group in non_empty for _ in group]
    holder = _holder(spark)
    ray.get(holder[0].put.remote(write_id, refs))
    sc = spark.sparkContext
    job_group = f"rayconnect-write-{write_id}"
    try:
        df = _blocks_frame(
            spark,
            holder,
            write_id,
            refs,
            group_of,
            schema,
            location,
            staging_rel,
            record_format,
            table_schema,
            share_of,
            list(keys) if keys is not None else None,
        )
        prepared = time.perf_counter()
        sc.setJobGroup(job_group, f"rayconnect: {len(non_empty)} groups -> {location.uri}")
        job_files = [(row[0], row[1]) for row in df.collect()]
    except Exception as exc:
        text = str(exc)
        if _INPUT_SCHEMA_MARK in text:
            detail = text.split(_INPUT_SCHEMA_MARK, 1)[1].splitlines()[0].strip()
            raise InputSchemaError(detail) from None
        if _BAD_RECORD_MARK in text:
            detail = text.split(_BAD_RECORD_MARK, 1)[1].splitlines()[0].strip()
            raise BadRecordError.from_text(detail) from None
        raise
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
        ray.get(holder[0].drop.remote(write_id))
    written = time.perf_counter()
    job_ids = list(sc.statusTracker().getJobIdsForGroup(job_group))
    files = _describe_files(location, staging_rel, job_files, len(groups), keys)
    return WriteResult(
        files=files,
        job_ids=sorted(job_ids),
        staging_dir=staging_rel,
        seconds=time.perf_counter() - start,
        prepare_seconds=prepared - start,
        spark_seconds=written - prepared,
    )
