"""The raw record schema every sink table has: one row per Kafka record, all nullable."""

from __future__ import annotations

import pyarrow as pa

RAW_RECORD_SCHEMA = pa.schema(
    [
        pa.field("cluster", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ),
    ]
)
