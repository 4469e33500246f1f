"""``avro``: values are Avro binary datums of one writer schema (an ``.avsc`` file).

Decoded by DuckDB's Avro reader (C++, the ``duckdb-ext-avro`` wheel), a block at a time: the
block's values are already back to back in Arrow's data buffer, so they become ONE data
block of an in-memory Avro object container file (header with the schema, count, size,
datums, sync marker) - no Python object per record. A block that does not decode is cut in
halves down to single values to name the bad ones, as for JSON. Confluent-framed values
(magic byte + schema id, from a schema registry) are not supported: no registry server
could be installed here to test against.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rayconnect.formats.base import Decoded

_local = threading.local()


def _connection() -> Any:
    """This thread's DuckDB connection with the Avro extension loaded (from its wheel:
    DuckDB cannot download extensions here)."""
    con = getattr(_local, "con", None)
    if con is None:
        import duckdb
        import duckdb_ext

        extensions = Path(next(iter(duckdb_ext.__path__))) / "extensions"
        con = duckdb.connect(
            config={"extension_directory": str(extensions), "autoinstall_known_extensions": False}
        )
        con.sql("LOAD avro;")
        _local.con = con
    return con


def _varint(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _container(schema_json: str, count: int, body: bytes | memoryview) -> bytes:
    sync = b"rayconnect-sync!"  # 16 bytes; never searched for in a single-block file
    meta = {"avro.schema": schema_json.encode(), "avro.codec": b"null"}
    header = b"Obj\x01" + _varint(len(meta))
    for k, v in meta.items():
        header += _varint(len(k)) + k.encode() + _varint(len(v)) + v
    header += _varint(0) + sync
    if not count:
        return header
    return b"".join([header, _varint(count), _varint(len(body)), bytes(body), sync])


def read_container(data: bytes) -> pa.Table:
    """Decode an in-memory container file with DuckDB (through a private temp file)."""
    fd, path = tempfile.mkstemp(suffix=".avro", prefix="rayconnect-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        result = _connection().sql(f"SELECT * FROM read_avro('{path}')").arrow()
        return result if isinstance(result, pa.Table) else result.read_all()
    finally:
        os.unlink(path)


def avro_schema_columns(schema_json: str) -> pa.Schema:
    """The table columns of a writer schema (a record): decoded from an empty container,
    so they are exactly what decoding gives. ValueError if DuckDB rejects the schema."""
    parsed = json.loads(schema_json)
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise ValueError("the writer schema must be an Avro record")
    try:
        return read_container(_container(schema_json, 0, b"")).schema
    except Exception as e:  # duckdb's own error types
        raise ValueError(f"DuckDB cannot read this Avro schema: {e}") from None


class AvroDecoder:
    """Avro datums of one writer schema -> columns (one per top-level field)."""

    def __init__(self, schema_json: str) -> None:
        self.schema_json = schema_json

    def decode(self, values: pa.Array, table_schema: pa.Schema | None) -> Decoded:
        values = values.cast(pa.binary())
        table = self._try(values)
        if table is not None:
            return Decoded(table)
        bad: dict[int, str] = {}
        stack = [(0, len(values))]
        while stack:
            lo, hi = stack.pop()
            if self._try(values.slice(lo, hi - lo)) is not None:
                continue
            if hi - lo > 1:
                mid = (lo + hi) // 2
                stack += [(mid, hi), (lo, mid)]
            else:
                bad[lo] = (
                    "null value"
                    if not values[lo].is_valid
                    else "not an Avro datum of the writer schema"
                )
        kept = [i for i in range(len(values)) if i not in bad]
        good = self._try(values.take(pa.array(kept, pa.int64())))
        assert good is not None
        return Decoded(good, bad)

    def _try(self, values: pa.Array) -> pa.Table | None:
        if values.null_count:
            return None
        n = len(values)
        if n == 0:
            return read_container(_container(self.schema_json, 0, b""))
        offsets = np.frombuffer(
            values.buffers()[1], dtype=np.int32, count=n + 1, offset=values.offset * 4
        )
        body = memoryview(values.buffers()[2])[int(offsets[0]) : int(offsets[-1])]
        try:
            table = read_container(_container(self.schema_json, n, body))
        except Exception:  # duckdb's own error types: the block does not decode
            return None
        return table if table.num_rows == n else None
