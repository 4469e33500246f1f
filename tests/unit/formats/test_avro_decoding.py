"""Avro datums of an .avsc writer schema decoded a block at a time (DuckDB's reader, no
Python object per record): exact columns, bad datums named, the source settings checked."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from rayconnect.config.sink import KafkaSource
from rayconnect.errors import ConfigError
from rayconnect.formats.avro import AvroDecoder, _varint
from rayconnect.formats.rows import decode_block, initial_schema
from rayconnect.metadata.static import StaticMetadataService
from rayconnect.protocol.types import ClusterMetadata, KafkaStream
from rayconnect.schema import RAW_RECORD_SCHEMA

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": ["null", "double"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def text(s: str) -> bytes:
    return _varint(len(s.encode())) + s.encode()


def datum(i: int) -> bytes:
    score = _varint(1) + struct.pack("<d", i * 1.5) if i % 2 else _varint(0)
    return _varint(i) + text(f"n{i}") + score + _varint(1) + text("t") + _varint(0)


def source(tmp_path: Path, schema: object = SCHEMA) -> KafkaSource:
    avsc = tmp_path / "order.avsc"
    avsc.write_text(json.dumps(schema))
    meta = StaticMetadataService((KafkaStream("s", {"c": ClusterMetadata("x:1", ("t",))}),))
    return KafkaSource(meta, value_format="avro", value_avro_schema=str(avsc), errors="dead_letter")


def test_datums_decode_to_columns_and_bad_ones_are_named(tmp_path: Path) -> None:
    fmt = source(tmp_path).record_format()
    assert initial_schema(fmt).names[5:] == ["id", "name", "score", "tags"]
    values = [datum(0), datum(1), b"\x07", datum(3)]
    n = len(values)
    raw = pa.Table.from_pydict(
        {
            "cluster": ["c"] * n,
            "topic": ["t"] * n,
            "partition": [0] * n,
            "offset": list(range(n)),
            "timestamp": [0] * n,
            "key": [None] * n,
            "value": values,
            "headers": [[]] * n,
        },
        schema=RAW_RECORD_SCHEMA,
    )
    block = decode_block(raw, fmt, initial_schema(fmt))
    assert block.rows.select(["_kafka_offset", "id", "name", "score", "tags"]).to_pylist() == [
        {"_kafka_offset": 0, "id": 0, "name": "n0", "score": None, "tags": ["t"]},
        {"_kafka_offset": 1, "id": 1, "name": "n1", "score": 1.5, "tags": ["t"]},
        {"_kafka_offset": 3, "id": 3, "name": "n3", "score": 4.5, "tags": ["t"]},
    ]
    assert block.dead_letters.column("_kafka_offset").to_pylist() == [2]


def test_null_values_are_bad() -> None:
    out = AvroDecoder(json.dumps(SCHEMA)).decode(pa.array([datum(1), None], pa.binary()), None)
    assert out.bad == {1: "null value"} and out.columns.num_rows == 1


def test_avsc_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be an Avro record"):
        source(tmp_path, {"type": "string"})
    meta = StaticMetadataService((KafkaStream("s", {"c": ClusterMetadata("x:1", ("t",))}),))
    with pytest.raises(ConfigError, match="cannot read"):
        KafkaSource(meta, value_format="avro", value_avro_schema=str(tmp_path / "missing.avsc"))
