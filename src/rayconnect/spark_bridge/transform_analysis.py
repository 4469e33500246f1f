"""Child process of ``formats.transform.analyse``: plan a transform in a local Spark.

Reads ``{"sql", "schema"}`` (the ``records`` schema, Arrow IPC, base64) from stdin and
prints one JSON line: ``{"schema": ...}`` (the output's, same encoding) or ``{"error": ...}``
(Spark's own message, first line). Nothing runs: an empty ``records`` is planned only.
"""

from __future__ import annotations

import base64
import json
import sys


def main() -> int:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    from rayconnect.formats.transform import RECORDS_VIEW
    from rayconnect.spark_bridge.session import java_options

    request = json.loads(sys.stdin.read())
    records = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(request["schema"])))
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("rayconnect-transform-check")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", java_options())
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        empty = spark.createDataFrame([], from_arrow_schema(records))
        empty.createOrReplaceTempView(RECORDS_VIEW)
        try:
            out = spark.sql(request["sql"]).schema
            schema = to_arrow_schema(out)
        except Exception as e:  # Spark's AnalysisException / ParseException, or a type
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(json.dumps({"error": first}))
            return 0
        encoded = base64.b64encode(schema.serialize().to_pybytes()).decode()
        print(json.dumps({"schema": encoded}))
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
