"""Write many groups of Arrow data as Parquet files in ONE Spark job.

A Spark job costs ~0.5 s however small, so a transaction round must not run one job per
partition (docs/design.md, step 2). All blocks of all groups become ONE job: a ``range`` over the
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

import dataclasses
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from rayconnect import ray_internals
from rayconnect.formats import partitioning
from rayconnect.formats.evolution import schema_differences
from rayconnect.formats.partitioning import split as split_partitions
from rayconnect.formats.route_split import Router, split_block
from rayconnect.formats.rows import (
    BadRecordError,
    conform_to_table,
    decode_block,
    partition_specs,
)
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat, typed_format
from rayconnect.formats.transform import RECORDS_VIEW, records_schema, row_keys
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.blocks import Block, ref_of, resolve
from rayconnect.spark_bridge.row_groups import RowGroupFile
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables.files import STAGING_DIR, describe_file

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
    #: a routed write's tables whose files do not match the schema they were decoded
    #: against (new columns, or a table not made yet): their schema changes at the commit
    schema_changes: tuple[str, ...] = ()


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
        self._writes: dict[str, list[Block]] = {}
        self._reports: dict[str, dict[int, tuple[int, list[tuple[int, str]]]]] = {}

    def put(self, write_id: str, refs: list[Block]) -> None:
        self._writes[write_id] = refs

    def get(self, write_id: str, indexes: list[int]) -> list[Block]:
        refs = self._writes[write_id]
        return [refs[i] for i in indexes]

    def report(
        self, write_id: str, task: int, attempt: int, written: list[tuple[int, str]]
    ) -> None:
        """Files a task wrote beside its rows (a transform's dead letters). A task that is
        retried reports again with a higher attempt; the last attempt's report wins."""
        reports = self._reports.setdefault(write_id, {})
        if task not in reports or reports[task][0] < attempt:
            reports[task] = (attempt, written)

    def reported(self, write_id: str) -> list[tuple[int, str]]:
        return [row for _, written in self._reports.get(write_id, {}).values() for row in written]

    def drop(self, write_id: str) -> None:
        self._writes.pop(write_id, None)
        self._reports.pop(write_id, None)


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
        handle = (
            ray_internals.actor_class(_BlockHolder)
            .options(
                name=name,
                namespace=namespace,
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    context.get_node_id(), soft=False
                ),
            )
            .remote()
        )
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
#: A routed write's: the route table of each file too (null: the sink's own, unrouted records).
_ROUTED_RESULT_SCHEMA = _RESULT_SCHEMA.append(pa.field("table", pa.string()))


@dataclass(frozen=True)
class RoutedWrite:
    """A write whose records go to many tables (``config.routes``): pickled into each task.

    ``locate`` gives a route table's location from its name (the sink's ``route_table``);
    ``formats`` its ``RecordFormat`` - its rule's own settings, else the sink's
    (``config.routes.RouteFormats``); ``schemas`` the schemas of the tables that exist (a
    new one starts from its format's first schema, as a new typed table does)."""

    routes: Router
    locate: Callable[[str], TableLocation]
    formats: Callable[[str], RecordFormat]
    schemas: dict[str, pa.Schema] = field(default_factory=dict)


class _TableWrites:
    """A task's files of a write into one table: each raw block decoded with the table's
    format (typed formats) against its schema, then into the table's ``_TaskFiles`` -
    rows, and bad records as dead letters (``errors: stop``: ``BadRecordError``)."""

    def __init__(
        self, files: _TaskFiles, record_format: RecordFormat | None, table_schema: pa.Schema | None
    ) -> None:
        self.files, self.format, self.table_schema = (
            files,
            typed_format(record_format),
            table_schema,
        )

    def add(self, group: int, raw: pa.Table) -> None:
        if self.format is None:
            self.files.add(group, raw)
            return
        decoded = decode_block(raw, self.format, self.table_schema)
        self.files.add(group, decoded.rows, decoded.dead_letters)

    def finish(self) -> list[tuple[int, str]]:
        return self.files.finish()

    def abort(self) -> None:
        self.files.abort()


class _RoutedFiles:
    """A task's files of a routed write: the raw block is split by table first
    (``formats.route_split``), then each table's rows are decoded with that table's own
    format against its own schema into files of its own (``_TableWrites`` per table, under
    the table's location). Unrouted records are dead letters of the sink's own
    ``location``, or - ``unrouted: stop`` - fail the write like a bad record."""

    def __init__(self, layout: _FilesLayout, routing: RoutedWrite) -> None:
        self.layout, self.routing = layout, routing
        self.tables: dict[str | None, _TableWrites] = {}

    def _files(self, name: str | None) -> _TableWrites:
        files = self.tables.get(name)
        if files is None:
            if name is None:  # the unrouted records' dead letters, in the sink's own table
                files = _TableWrites(self.layout.files(self.layout.record_format), None, None)
            else:
                fmt = self.routing.formats(name)
                task_files = self.layout.files(fmt, self.routing.locate(name))
                files = _TableWrites(task_files, fmt, self.routing.schemas.get(name))
            self.tables[name] = files
        return files

    def add(self, group: int, raw: pa.Table) -> None:
        block = split_block(raw, self.routing.routes)
        unrouted = block.unrouted
        if unrouted is not None:
            if self.routing.routes.unrouted == "stop":
                first = unrouted.slice(0, 1).to_pylist()[0]
                key = f"{first['_kafka_cluster']}/{first['_kafka_topic']}/"
                raise BadRecordError(
                    key + str(first["_kafka_partition"]), first["_kafka_offset"], first["reason"]
                )
            self._files(None).files.add(group, raw.slice(0, 0), unrouted)
        for name, rows in block.tables.items():
            self._files(name).add(group, rows)

    def finish(self) -> list[tuple[int, str, str | None]]:
        return [
            (group, rel, name)
            for name, files in self.tables.items()
            for group, rel in files.finish()
        ]

    def abort(self) -> None:
        for files in self.tables.values():
            files.abort()


@dataclass(frozen=True)
class _FilesLayout:
    """What every table's files of one task share: where the write's files are staged,
    the blocks' schema, the groups and how they share files; ``record_format`` the write's
    own (the sink's)."""

    location: TableLocation
    staging_rel: str
    schema: pa.Schema
    n_groups: int
    record_format: RecordFormat | None
    share_of: list[str | None] | None
    key_of: Sequence[str | None] | None

    def files(
        self, record_format: RecordFormat | None, location: TableLocation | None = None
    ) -> _TaskFiles:
        return _TaskFiles(
            location or self.location,
            self.staging_rel,
            self.schema,
            record_format,
            self.share_of,
            self.key_of,
            self.n_groups,
        )

    def writes(
        self, table_schema: pa.Schema | None, routing: RoutedWrite | None
    ) -> _TableWrites | _RoutedFiles:
        """The task's writes: into the one table, or - ``routing`` - into each record's."""
        if routing is not None:
            return _RoutedFiles(self, routing)
        return _TableWrites(self.files(self.record_format), self.record_format, table_schema)


def _parquet_options(schema: pa.Schema) -> dict[str, object]:
    """Dictionary-encode only the flat non-binary columns (cluster, topic, partition...).

    Keys and values are mostly unique: a dictionary for them is built, overflows and is
    thrown away on every page (bench: 0.39 -> 0.29 us a row without it).
    """
    flat = [
        f.name for f in schema if not (pa.types.is_binary(f.type) or pa.types.is_nested(f.type))
    ]
    return {"use_dictionary": flat, "compression": "snappy"}


class _TaskFiles:
    """The files one Spark task writes: rows go in group by group, (group, path) rows out.

    Consecutive groups with the same ``share_of`` token (not None) go into the same files,
    but never two groups of one partition (``key_of``): a flush of a round that was
    discarded must not ride in the file of a newer one, which its partition alone would
    vouch for. A file yields one row per group it holds. Groups arrive one after another
    (a group's rows are consecutive), so a task holds one file open per table partition.
    A piece that brings new columns starts a new file with its own schema (the committer
    evolves the table); dead letters go to a file of the group in the dead-letter table.
    """

    def __init__(
        self,
        location: TableLocation,
        staging_rel: str,
        schema: pa.Schema,
        record_format: RecordFormat | None,
        share_of: list[str | None] | None,
        key_of: Sequence[str | None] | None,
        n_groups: int,
    ) -> None:
        self.location = location
        self.filesystem = location.filesystem()
        self.staging_rel = staging_rel
        typed = typed_format(record_format)
        self.typed = typed is not None
        self.options = _parquet_options(schema)
        self.specs = partition_specs(typed) if typed is not None else []
        self.in_files = typed is not None and typed.partition_values_in_files
        #: an upsert table's change files: unsplit (``partitioning.split``'s ``whole``)
        self.whole = typed is not None and bool(typed.upsert_keys)
        self.attempt = uuid.uuid4().hex  # each task attempt writes files of its own
        self.shares = share_of or [None] * n_groups
        self.key_of = key_of
        self.written: list[tuple[int, str]] = []
        #: the current group's (or share's) open files, by table partition folder
        #: ("" unpartitioned), with the path each one has from the staging folder
        self.current: dict[str, tuple[RowGroupFile, str]] = {}
        self.in_file: set[tuple[int, str]] = set()  # (group, path) rows already written
        self.dead: list[pa.Table] = []
        self.last_group: int | None = None
        self.open_keys: set[str | None] = set()  # partitions in the open files

    def _same_files(self, a: int, b: int) -> bool:
        return (
            self.shares[a] is not None
            and self.shares[a] == self.shares[b]
            and self.key_of is not None
            and self.key_of[b] not in self.open_keys
        )

    def _open(
        self, group: int, file_schema: pa.Schema, rel_root: str, folder: str = ""
    ) -> tuple[RowGroupFile, str]:
        n = len(self.written)
        if folder:  # Hive folders only: readers parse every name=value of the path
            rel = f"{rel_root}/{folder}/part-{self.attempt}-g{group}-{n}.parquet"
        else:
            rel = f"{rel_root}/{GROUP_COLUMN}={group}/part-{self.attempt}-{n}.parquet"
        path = self.location.path(rel)
        self.location.make_parents(self.filesystem, path)
        opts = self.options if not self.typed else _parquet_options(file_schema)
        writer = pq.ParquetWriter(path, file_schema, filesystem=self.filesystem, **opts)
        staged = rel_root == self.staging_rel
        return RowGroupFile(writer), rel[len(self.staging_rel) + 1 :] if staged else rel

    def _holds(self, group: int, rel: str) -> None:
        if (group, rel) not in self.in_file:
            self.in_file.add((group, rel))
            self.written.append((group, rel))

    def _close_all(self) -> None:
        for w, _ in self.current.values():
            w.close()
        self.current.clear()
        self.open_keys.clear()

    def _flush_dead(self, group: int) -> None:
        if self.dead:
            rows = pa.concat_tables(self.dead)
            self.dead.clear()
            w, rel = self._open(group, rows.schema, f"{DEAD_LETTER_DIR}/{self.staging_rel}")
            try:
                w.write(rows)
            finally:
                w.close()
            self._holds(group, rel)

    def add(self, group: int, rows: pa.Table, dead: pa.Table | None = None) -> None:
        """Group ``group``'s next rows (and bad records), after any earlier group's."""
        last = self.last_group
        if last is not None and last != group:
            if not self._same_files(last, group):
                self._close_all()
            self._flush_dead(last)  # dead letters stay per group
        self.last_group = group
        self.open_keys.add(self.key_of[group] if self.key_of is not None else None)
        if dead is not None and dead.num_rows:
            self.dead.append(dead)
        if rows.num_rows == 0:
            return
        for folder, part in split_partitions(rows, self.specs, self.in_files, self.whole):
            opened = self.current.get(folder)
            if opened is not None and opened[0].schema != part.schema:
                opened[0].close()  # new columns: a file of their own
                opened = None
            if opened is None:
                opened = self.current[folder] = self._open(
                    group, part.schema, self.staging_rel, folder
                )
            opened[0].write(part)
            self._holds(group, opened[1])

    def finish(self) -> list[tuple[int, str]]:
        """Close every file; the (group, path) rows of all files written."""
        self._close_all()
        if self.last_group is not None:
            self._flush_dead(self.last_group)
        return self.written

    def abort(self) -> None:
        self._close_all()  # idempotent


def _result_batch(written: Sequence[tuple[Any, ...]], routed: bool = False) -> pa.RecordBatch:
    """(group, path) rows; a routed write's (group, path, table) rows."""
    columns = [
        pa.array([w[0] for w in written], pa.int32()),
        pa.array([w[1] for w in written], pa.string()),
    ]
    if not routed:
        return pa.RecordBatch.from_arrays(columns, schema=_RESULT_SCHEMA)
    tables = pa.array([w[2] for w in written], pa.string())
    return pa.RecordBatch.from_arrays([*columns, tables], schema=_ROUTED_RESULT_SCHEMA)


@dataclass(frozen=True)
class _Blocks:
    """One write's blocks, as its Spark tasks see them (pickled into each task): the Ray
    cluster and the holder that lends the refs, each block's group, where files go."""

    ray_address: str
    namespace: str
    holder_name: str
    write_id: str
    group_of: list[int]
    schema: pa.Schema  # the blocks' (raw) schema
    location: TableLocation
    staging_rel: str

    def each(self, batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, pa.Table]]:
        """(index, block) of the block indexes a task was given (in a Spark Python worker:
        a separate Ray driver), one block in memory at a time, conformed to ``schema``."""
        holder = None  # looked up once per task, not per batch of indexes
        fetched: dict[Any, pa.Table] = {}  # an object many blocks slice is fetched once
        for batch in batches:
            indexes = batch.column(0).to_pylist()
            holder = self.holder() if holder is None else holder
            handles: list[Any] = ray.get(holder.get.remote(self.write_id, indexes))
            # fetched as the blocks come, and let go once no later block of the batch
            # slices it: one object in memory at a time, not every object of the batch
            uses = Counter(ref_of(h) for h in handles)
            for index, handle in zip(indexes, handles, strict=True):
                (block,) = resolve([handle], fetched)
                ref = ref_of(handle)
                uses[ref] -= 1
                if uses[ref] == 0:
                    del fetched[ref]
                yield index, _conform(block, self.schema, index)

    def holder(self) -> ray.actor.ActorHandle:
        if not ray.is_initialized():
            ray.init(
                address=self.ray_address,
                namespace=self.namespace,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        return ray.get_actor(self.holder_name, namespace=self.namespace)

    def layout(
        self,
        record_format: RecordFormat | None,
        share_of: list[str | None] | None = None,
        key_of: Sequence[str | None] | None = None,
    ) -> _FilesLayout:
        return _FilesLayout(
            self.location,
            self.staging_rel,
            self.schema,
            len(self.group_of),
            record_format,
            share_of,
            key_of,
        )

    def files(
        self,
        record_format: RecordFormat | None,
        share_of: list[str | None] | None = None,
        key_of: Sequence[str | None] | None = None,
    ) -> _TaskFiles:
        return self.layout(record_format, share_of, key_of).files(record_format)

    def mapped(
        self,
        spark: SparkSession,
        fn: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]],
        out: pa.Schema,
    ) -> DataFrame:
        """``fn`` over the block indexes: one task per executor core. Not
        defaultParallelism: Spark makes that at least 2, and two tasks queued on one core
        cost a round ~0.15 s and twice the files (micro_spark_write.py: 0.78 -> 0.62 s).
        Contiguous slices keep a group's blocks together, so each task writes one file per
        group it sees."""
        from pyspark.sql.pandas.types import from_arrow_schema

        n = len(self.group_of)
        slices = max(1, min(n, executor_cores(spark)))
        return spark.range(0, n, 1, slices).mapInArrow(fn, from_arrow_schema(out))


def _block_writer(
    blocks: _Blocks,
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
    blocks are consecutive, so a task holds one file open at a time (``_TaskFiles``).

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
            raise ValueError(f"{_BAD_RECORD_MARK} {e}") from None
        finally:
            writes.abort()
        yield _result_batch(written, routing is not None)

    return write_blocks


def _transform_decoder(
    blocks: _Blocks, record_format: RecordFormat
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A transform write's first ``mapInArrow``: block indexes in, decoded rows (the
    ``records`` view's columns) out. Bad records go to dead-letter files here, reported to
    the holder (they never enter the transform); ``errors: stop`` fails the write."""
    records = records_schema(record_format)
    plain = msgspec.structs.replace(
        record_format, transform=None, transform_schema=None, partition_by=()
    )

    def decode_blocks(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        files = blocks.files(plain)
        try:
            for index, table in blocks.each(batches):
                decoded = decode_block(table, plain, records)
                files.add(blocks.group_of[index], records.empty_table(), decoded.dead_letters)
                yield from decoded.rows.select(records.names).cast(records).to_batches()
            written = files.finish()
        except BadRecordError as e:
            raise ValueError(f"{_BAD_RECORD_MARK} {e}") from None
        finally:
            files.abort()
        ctx = TaskContext.get()
        task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
        ray.get(blocks.holder().report.remote(blocks.write_id, task, attempt, written))

    return decode_blocks


def _transformed_writer(
    blocks: _Blocks,
    record_format: RecordFormat,
    table_schema: pa.Schema | None,
    share_of: list[str | None] | None,
    key_of: Sequence[str | None],
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A transform write's second ``mapInArrow``: the statement's rows in, (group, path)
    rows out. A row's group is its partition's (``_kafka_*`` coordinates; a write's groups
    have distinct partitions), and a group's rows stay consecutive (row-wise statements
    keep the order), so files are cut as in ``_block_writer``."""
    import numpy as np

    specs = partition_specs(record_format)
    out = record_format.transform_output()
    assert out is not None
    group_of_key = {k: g for g, k in enumerate(key_of) if k is not None}
    layout = dataclasses.replace(blocks, schema=out)

    def write_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        files = layout.files(record_format, share_of, key_of)
        try:
            for batch in batches:
                rows = pa.Table.from_batches([batch])
                if rows.num_rows == 0:
                    continue
                keys = row_keys(rows).dictionary_encode()
                unknown = [k for k in keys.dictionary.to_pylist() if k not in group_of_key]
                if unknown:
                    raise ValueError(
                        f"{_INPUT_SCHEMA_MARK} the transform made rows of partitions {unknown}"
                        " that this write has no records of (keep _kafka_* as they are)"
                    )
                ids = np.array([group_of_key[k] for k in keys.dictionary.to_pylist()])
                groups = ids[keys.indices.to_numpy(zero_copy_only=False)]
                cuts = [0, *(np.flatnonzero(np.diff(groups)) + 1).tolist(), len(groups)]
                rows = conform_to_table(partitioning.with_derived(rows, specs), table_schema)
                for a, b in itertools.pairwise(cuts):
                    files.add(int(groups[a]), rows.slice(a, b - a))
            written = files.finish()
        finally:
            files.abort()
        yield _result_batch(written)

    return write_rows


def _frame(
    spark: SparkSession,
    blocks: _Blocks,
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
        out = _RESULT_SCHEMA if routing is None else _ROUTED_RESULT_SCHEMA
        return blocks.mapped(spark, writer, out)
    if key_of is None:
        raise InputSchemaError("a transform write needs the groups' partition keys")
    decoded = blocks.mapped(
        spark, _transform_decoder(blocks, record_format), records_schema(record_format)
    )
    decoded.createOrReplaceTempView(RECORDS_VIEW)
    transformed = spark.sql(record_format.transform)
    write = _transformed_writer(blocks, record_format, table_schema, share_of, key_of)
    from pyspark.sql.pandas.types import from_arrow_schema

    return transformed.mapInArrow(write, from_arrow_schema(_RESULT_SCHEMA))


def executor_cores(spark: SparkSession) -> int:
    conf = spark.sparkContext.getConf()
    try:
        return int(conf.get("spark.executor.instances", "1")) * int(
            conf.get("spark.executor.cores", "1")
        )
    except ValueError:
        return spark.sparkContext.defaultParallelism


def _described(
    location: TableLocation,
    routing: RoutedWrite | None,
    staging_rel: str,
    written: Sequence[tuple[Any, ...]],
    n_groups: int,
    keys: Sequence[str | None] | None,
) -> tuple[list[list[DataFile]], tuple[str, ...]]:
    """Each group's files from a write's (group, path) rows - a routed write's (group,
    path, table) rows - whether Spark's tasks or this process wrote them; and the route
    tables whose schema a file changes (the writer reads those again)."""
    if routing is None:
        return _describe_files(location, staging_rel, list(written), n_groups, keys), ()
    return _describe_routed(location, routing, staging_rel, list(written), n_groups, keys)


def _describe_routed(
    location: TableLocation,
    routing: RoutedWrite,
    staging_rel: str,
    written: list[tuple[int, str, str | None]],
    n_groups: int,
    keys: Sequence[str | None] | None,
) -> tuple[list[list[DataFile]], tuple[str, ...]]:
    """``_describe_files`` of a routed write, table by table: each file names its table
    and always the partitions whose rows it holds (``shared_by``): the committer moves a
    table's offsets for exactly those (``tables.table_set``)."""
    files: list[list[DataFile]] = [[] for _ in range(n_groups)]
    changes: list[str] = []
    for name in sorted({t for _, _, t in written}, key=lambda t: t or ""):
        where = location if name is None else routing.locate(name)
        ours = [(g, rel) for g, rel, t in written if t == name]
        schemas: list[pa.Schema] = []
        described = _describe_files(
            where, staging_rel, ours, n_groups, keys, always_keys=True, schemas=schemas
        )
        if name is not None and any(_changes_schema(s, routing.schemas.get(name)) for s in schemas):
            changes.append(name)
        for group, group_files in enumerate(described):
            files[group] += [msgspec.structs.replace(f, table=name) for f in group_files]
    return files, tuple(changes)


def _changes_schema(file_schema: pa.Schema, table_schema: pa.Schema | None) -> bool:
    """Whether a file of a table brings it what its schema lacks (the commit evolves it),
    or the table is not made yet. Partition columns that are only in the file's folder
    names are no change."""
    if table_schema is None:
        return True
    for f in file_schema:
        i = table_schema.get_field_index(f.name)
        if i < 0 or table_schema.field(i).type != f.type:
            return True
    return False


def _describe_files(
    location: TableLocation,
    staging_rel: str,
    written: list[tuple[int, str]],
    n_groups: int,
    keys: Sequence[str | None] | None = None,
    always_keys: bool = False,
    schemas: list[pa.Schema] | None = None,
) -> list[list[DataFile]]:
    """Each group's files, from the job's result (never a listing: see the module doc).
    A file several groups share is described once and names their ``keys`` (``shared_by``).
    ``schemas``: gets the data files' schemas (read with their footers anyway)."""
    files: list[list[DataFile]] = [[] for _ in range(n_groups)]
    filesystem = location.filesystem()
    groups_of: dict[str, list[int]] = {}
    for group, rel in sorted(written):
        groups_of.setdefault(rel, []).append(group)
    for rel, groups in groups_of.items():
        # dead-letter files come with their path from the table root
        dead = rel.startswith(DEAD_LETTER_DIR + "/")
        full = rel if dead else f"{staging_rel}/{rel}"
        data_file, file_schema = describe_file(location, full, filesystem, dead_letters=dead)
        if schemas is not None and not dead:
            schemas.append(file_schema)
        if len(groups) > 1 or always_keys:
            if keys is None or any(keys[g] is None for g in groups):
                raise AssertionError(f"{rel} holds groups {groups} without partition keys")
            shared_by = tuple(sorted({k for g in groups if (k := keys[g]) is not None}))
            data_file = msgspec.structs.replace(data_file, shared_by=shared_by)
        for group in groups:
            files[group].append(data_file)
    return files


def _distinct_key_layers(
    groups: Sequence[Sequence[Block]], keys: Sequence[str | None]
) -> list[list[Sequence[Block]]]:
    """The groups split into layers in which no partition has two groups (a transform's
    rows find their group by partition). Nearly always one layer: two flushes of one
    partition in one write happen only when a discarded round's flush meets a newer one."""
    layers: list[list[Sequence[Block]]] = []
    seen: list[set[str | None]] = []
    for i, refs in enumerate(groups):
        if not refs:
            continue
        at = next((n for n, s in enumerate(seen) if keys[i] not in s), len(layers))
        if at == len(layers):
            layers.append([[] for _ in groups])
            seen.append(set())
        layers[at][i] = refs
        seen[at].add(keys[i])
    return layers


def _merge_results(results: list[WriteResult]) -> WriteResult:
    files = [sum((r.files[i] for r in results), []) for i in range(len(results[0].files))]
    return WriteResult(
        files=files,
        job_ids=sorted(j for r in results for j in r.job_ids),
        staging_dir=results[0].staging_dir,
        seconds=sum(r.seconds for r in results),
        prepare_seconds=sum(r.prepare_seconds for r in results),
        spark_seconds=sum(r.spark_seconds for r in results),
    )


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
    non_empty, share_of = _in_write_order(groups, keys, shares)
    if not non_empty:
        return WriteResult(files=[[] for _ in groups])
    transform = record_format is not None and record_format.transform_schema is not None
    if transform and keys is not None:
        layers = _distinct_key_layers(groups, keys)
        if len(layers) > 1:  # rows find their group by partition: one job per layer
            return _merge_results(
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
    holder = _holder(spark)
    ray.get(holder[0].put.remote(write_id, refs))
    sc = spark.sparkContext
    job_group = f"rayconnect-write-{write_id}"
    try:
        blocks = _Blocks(
            ray.get_runtime_context().gcs_address,
            holder[2],
            holder[1],
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
        if transform:  # the decoding stage's dead letters (before drop forgets them)
            job_files_dead = ray.get(holder[0].reported.remote(write_id))
        ray.get(holder[0].drop.remote(write_id))
    written = time.perf_counter()
    job_ids = list(sc.statusTracker().getJobIdsForGroup(job_group))
    if transform:
        job_files += job_files_dead
    files, changes = _described(location, routing, staging_rel, job_files, len(groups), keys)
    return WriteResult(
        files=files,
        job_ids=sorted(job_ids),
        staging_dir=staging_rel,
        seconds=time.perf_counter() - start,
        prepare_seconds=prepared - start,
        spark_seconds=written - prepared,
        schema_changes=changes,
    )


def _in_write_order(
    groups: Sequence[Sequence[Block]],
    keys: Sequence[str | None] | None,
    shares: Sequence[str | None] | None,
) -> tuple[list[tuple[int, Sequence[Block]]], list[str | None] | None]:
    """The non-empty groups, a share's groups next to each other (a task keeps one file
    open per share), and each group's share token (None: files of its own)."""
    non_empty = [(i, refs) for i, refs in enumerate(groups) if refs]
    if shares is None or keys is None:
        return non_empty, None
    share_of = [s if keys[i] is not None else None for i, s in enumerate(shares)]
    non_empty.sort(key=lambda item: (share_of[item[0]] or "", item[0]))
    return non_empty, share_of


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
    ``_TableWrites``/``_RoutedFiles`` a Spark task writes with, typed decoding and routes
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
    non_empty, share_of = _in_write_order(groups, keys, shares)
    if not non_empty:
        return WriteResult(files=[[] for _ in groups])
    staging_rel = f"{STAGING_DIR}/{uuid.uuid4().hex}"
    key_of = list(keys) if keys is not None else None
    layout = _FilesLayout(
        location, staging_rel, schema, len(groups), record_format, share_of, key_of
    )
    writes = layout.writes(table_schema, routing)
    try:
        index = 0
        tables = iter(resolve([b for _, blocks in non_empty for b in blocks]))
        for group, blocks in non_empty:
            for block in itertools.islice(tables, len(blocks)):
                try:
                    block = _conform(block, schema, index)
                except ValueError as e:
                    raise InputSchemaError(
                        str(e).split(_INPUT_SCHEMA_MARK, 1)[-1].strip()
                    ) from None
                index += 1
                writes.add(group, block)
        written: Sequence[tuple[Any, ...]] = writes.finish()
    finally:
        writes.abort()
    described, changes = _described(location, routing, staging_rel, written, len(groups), keys)
    return WriteResult(
        files=described,
        staging_dir=staging_rel,
        seconds=time.perf_counter() - start,
        schema_changes=changes,
    )
