"""A transform write's two ``mapInArrow`` stages around the user's SQL statement: decode
the raw blocks into the ``records`` view (``transform_decoder``), then write the
statement's rows into their groups' files (``transformed_writer``)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import msgspec
import pyarrow as pa
import ray

from rayconnect.formats import partitioning
from rayconnect.formats.rows import BadRecordError, conform_to_table, decode_block, partition_specs
from rayconnect.formats.settings import RecordFormat
from rayconnect.formats.transform import records_schema, row_keys
from rayconnect.spark_bridge.job_blocks import JobBlocks
from rayconnect.spark_bridge.task_errors import bad_record_in_task, input_schema_in_task
from rayconnect.spark_bridge.written_files import result_batch


def transform_decoder(
    blocks: JobBlocks, record_format: RecordFormat
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
            raise bad_record_in_task(e) from None
        finally:
            files.abort()
        ctx = TaskContext.get()
        task, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
        ray.get(blocks.holder().report.remote(blocks.write_id, task, attempt, written))

    return decode_blocks


def transformed_writer(
    blocks: JobBlocks,
    record_format: RecordFormat,
    table_schema: pa.Schema | None,
    share_of: list[str | None] | None,
    key_of: Sequence[str | None],
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A transform write's second ``mapInArrow``: the statement's rows in, (group, path)
    rows out. A row's group is its partition's (``_kafka_*`` coordinates; a write's groups
    have distinct partitions), and a group's rows stay consecutive (row-wise statements
    keep the order), so files are cut as in ``spark_write``'s block writer."""
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
                    raise input_schema_in_task(
                        f"the transform made rows of partitions {unknown}"
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
        yield result_batch(written)

    return write_rows
