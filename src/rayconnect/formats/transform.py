"""``transform``: a Spark SQL statement over each write's decoded rows (view ``records``).

Rules, and why:

- The rows a transform reads have columns known before start (``records``: the ``_kafka_*``
  coordinates and the declared value columns - json with ``value_schema``, avro, string),
  because Spark plans the statement against a fixed schema. Fields a record has beyond the
  declared ones are not in ``records``.
- Its output keeps ``_kafka_cluster``, ``_kafka_topic`` and ``_kafka_partition``: every row
  is committed with its partition's offsets (and a partition's rows may be left out of a
  partial commit), so a row must say which partition it came from. A row-wise statement
  (``SELECT ... FROM records WHERE ...``) keeps them with ``SELECT *`` or by naming them;
  a statement that merges partitions' rows (an aggregate across partitions) cannot.
- The statement is analysed before any actor starts, in a Spark of its own in a child
  process (~5 s): a syntax error, an unknown column or a missing coordinate is a
  ``ConfigError`` then, not a failed round later. The analysis gives the output's schema,
  which the table is created with (``RecordFormat.transform_schema``).
- The default path (no transform) stays Arrow-only: rows enter the JVM only when a
  transform asks for it (``spark_bridge.transform_job``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import msgspec
import pyarrow as pa

from rayconnect.errors import ConfigError
from rayconnect.formats.settings import KAFKA_PREFIX, RecordFormat

#: the view a transform reads
RECORDS_VIEW = "records"
#: the columns a transform's output must keep (its rows' partition)
KEPT_COORDINATES = tuple(f"{KAFKA_PREFIX}{c}" for c in ("cluster", "topic", "partition"))
#: how long the analysis (a local Spark in a child process) may take
ANALYSIS_TIMEOUT_S = 180.0


def records_schema(fmt: RecordFormat) -> pa.Schema:
    """The columns of the view ``records``: what decoding makes, before any partitioning."""
    from rayconnect.formats.rows import initial_schema

    plain = msgspec.structs.replace(
        fmt, transform=None, transform_schema=None, partition_by=(), partition_values_in_files=False
    )
    return initial_schema(plain)


def analysed(fmt: RecordFormat) -> RecordFormat:
    """``fmt`` with its transform's output schema (``ConfigError`` if the SQL is wrong)."""
    if fmt.transform is None or fmt.transform_schema is not None:
        return fmt
    schema = analyse(fmt.transform, records_schema(fmt))
    return msgspec.structs.replace(fmt, transform_schema=schema.serialize().to_pybytes())


def analyse(sql: str, records: pa.Schema) -> pa.Schema:
    """The output schema of ``sql`` over a view ``records`` of ``records``' columns, from a
    local Spark in a child process (its JVM must not share this process with RayDP's)."""
    request = json.dumps(
        {"sql": sql, "schema": base64.b64encode(records.serialize().to_pybytes()).decode()}
    )
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rayconnect.spark_bridge.transform_analysis"],
            input=request,
            capture_output=True,
            text=True,
            timeout=ANALYSIS_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"transform: Spark did not analyse the statement within {ANALYSIS_TIMEOUT_S:.0f} s"
        ) from None
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ConfigError(f"transform: the analysis failed (exit {done.returncode}): {tail}")
    answer = json.loads(lines[-1])
    if "error" in answer:
        raise ConfigError(f"transform: {answer['error']}")
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(answer["schema"])))
    missing = [c for c in KEPT_COORDINATES if c not in schema.names]
    if missing:
        raise ConfigError(
            f"transform: its rows must keep {missing} (each row is committed with its "
            "partition's offsets): select them, or use SELECT *, ..."
        )
    return pa.schema([f.with_nullable(True) for f in schema])


def row_keys(rows: pa.Table) -> pa.Array:
    """Each row's partition key (``cluster/topic/partition``), as the groups name theirs."""
    import pyarrow.compute as pc

    parts = [rows.column(c).cast(pa.string()) for c in KEPT_COORDINATES]
    return pc.binary_join_element_wise(*parts, "/").combine_chunks()
