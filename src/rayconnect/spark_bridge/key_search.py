"""A merge-on-read search job (``write_modes.row_delta.SearchJob``) on Spark's executors:
one ``mapInArrow`` over the candidate files' indexes, one task per executor core, each task
reading its files' key columns where it runs and answering (file index, positions) - the
positions as one binary value per file, so the driver collects a row per file, not one
per position."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from rayconnect.spark_bridge.job_blocks import executor_cores
from rayconnect.write_modes.row_delta import SearchJob

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_ANSWER = pa.schema([("file", pa.int64()), ("positions", pa.binary())])


def search_on_spark(spark: SparkSession, job: SearchJob) -> list[np.ndarray]:
    """Each file's positions, in order (the job's answer, computed by the executors)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    n = len(job.files)
    if n == 0:
        return []

    def answer(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            indexes = batch.column(0).to_pylist()
            found = [job.positions(i).tobytes() for i in indexes]
            yield pa.record_batch([pa.array(indexes, pa.int64()), found], schema=_ANSWER)

    slices = max(1, min(n, executor_cores(spark)))
    rows = spark.range(0, n, 1, slices).mapInArrow(answer, from_arrow_schema(_ANSWER)).collect()
    out = [np.zeros(0, dtype=np.uint64)] * n
    for row in rows:
        out[row["file"]] = np.frombuffer(row["positions"], dtype=np.uint64)
    return out
