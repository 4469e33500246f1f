"""Micro-benchmark of typed tables' decoding: one block of raw records -> typed rows.

    .venv/bin/python bench/micro_json_decode.py [--records 50000] [--repeat 10]

What an executor does per block before writing it (``formats.rows.decode_block``): JSON
values of ~10 fields (~230 B) decoded inferred and against a declared schema, where the time
goes (joining the values into one NDJSON buffer vs Arrow's parser vs the ``_kafka_*``
columns), and the cost of the error path (1 bad record in the block). Beside them: the
per-record Python baseline (``json.loads`` each value, then ``pa.Table.from_pylist``), as a
one-process consumer would do it, Avro datums of the same ~10 fields through DuckDB's
reader, and writing the raw block as Parquet (the work that is
there anyway). Reports ns per record and records/s of one core.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import struct
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.formats.json import JsonDecoder, _ndjson
from rayconnect.formats.rows import decode_block
from rayconnect.formats.settings import RecordFormat
from rayconnect.schema import RAW_RECORD_SCHEMA

SCHEMA = {
    "id": "long",
    "customer": "string",
    "amount": "double",
    "quantity": "int",
    "status": "string",
    "created": "timestamp",
    "country": "string",
    "express": "boolean",
    "tags": "array<string>",
    "address": {"city": "string", "zip": "string"},
}


def value(i: int) -> bytes:
    return json.dumps(
        {
            "id": i,
            "customer": f"customer-{i % 977}",
            "amount": round(i * 0.37 % 500, 2),
            "quantity": i % 12,
            "status": ("new", "paid", "shipped")[i % 3],
            "created": f"2026-11-{1 + i % 28:02d}T10:{i % 60:02d}:00Z",
            "country": ("DE", "FR", "US", "JP")[i % 4],
            "express": bool(i % 2),
            "tags": [f"t{i % 5}", "x"],
            "address": {"city": f"city-{i % 50}", "zip": f"{10000 + i % 9000}"},
        }
    ).encode()


AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "quantity", "type": "int"},
        {"name": "status", "type": "string"},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "country", "type": "string"},
        {"name": "express", "type": "boolean"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "city", "type": "string"},
    ],
}


def avro_value(i: int) -> bytes:
    """The same order as Avro binary (bench set-up only)."""
    from rayconnect.formats.avro import _varint

    def text(s: str) -> bytes:
        return _varint(len(s.encode())) + s.encode()

    return b"".join(
        [
            _varint(i),
            text(f"customer-{i % 977}"),
            struct.pack("<d", i * 0.37 % 500),
            _varint(i % 12),
            text(("new", "paid", "shipped")[i % 3]),
            _varint(1_795_000_000_000 + i),
            text(("DE", "FR", "US", "JP")[i % 4]),
            bytes([i % 2]),
            _varint(2) + text(f"t{i % 5}") + text("x") + _varint(0),
            text(f"city-{i % 50}"),
        ]
    )


def raw_block(n: int, bad_at: int | None = None) -> pa.Table:
    values = [b"not json" if i == bad_at else value(i) for i in range(n)]
    return pa.Table.from_pydict(
        {
            "cluster": ["c"] * n,
            "topic": ["t"] * n,
            "partition": [0] * n,
            "offset": list(range(n)),
            "timestamp": [1_700_000_000_000_000] * n,
            "key": [f"k{i}".encode() for i in range(n)],
            "value": values,
            "headers": [[]] * n,
        },
        schema=RAW_RECORD_SCHEMA,
    )


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    n = args.records
    block = raw_block(n)
    bad_block = raw_block(n, bad_at=n // 2)
    values = block.column("value").combine_chunks()
    inferred = RecordFormat(value_format="json")
    declared = RecordFormat(value_format="json", value_schema=SCHEMA)
    dead = RecordFormat(value_format="json", errors="dead_letter")
    table_schema = decode_block(block, inferred, None).rows.schema
    decoder = JsonDecoder()

    avro_fmt = RecordFormat(value_format="avro", avro_schema=json.dumps(AVRO_SCHEMA))
    avro_block = block.set_column(
        block.schema.get_field_index("value"), "value", pa.array([avro_value(i) for i in range(n)])
    )

    def python_baseline() -> None:
        pa.Table.from_pylist([json.loads(v) for v in values.to_pylist()])

    def parquet_raw() -> None:
        pq.write_table(block, io.BytesIO())

    cases = {
        "ndjson buffer (Arrow join + newline scan)": lambda: _ndjson(values),
        "JsonDecoder inferred (join + Arrow parse)": lambda: decoder.decode(values, None),
        "decode_block inferred (+ _kafka_* columns)": lambda: decode_block(block, inferred, None),
        "decode_block vs the table's schema": lambda: decode_block(block, inferred, table_schema),
        "decode_block declared schema": lambda: decode_block(block, declared, None),
        "decode_block, 1 bad record (error path)": lambda: decode_block(bad_block, dead, None),
        "decode_block avro (DuckDB reader)": lambda: decode_block(avro_block, avro_fmt, None),
        "python: json.loads each + from_pylist": python_baseline,
        "parquet write of the raw block (for scale)": parquet_raw,
    }
    size = sum(len(v) for v in values.to_pylist()) / n
    print(f"{n} records, ~{size:.0f} B JSON values, 10 fields; median of {args.repeat}")
    for name, fn in cases.items():
        s = timed(fn, args.repeat)
        print(f"  {name:<46} {s * 1e9 / n:8.0f} ns/rec {n / s:12,.0f} rec/s")


if __name__ == "__main__":
    main()
