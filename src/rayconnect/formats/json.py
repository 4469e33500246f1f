"""``json``: one JSON object per value, parsed by Arrow's JSON reader a block at a time.

The block's values are joined into one newline-delimited buffer (newline bytes inside a
value are JSON whitespace and become spaces first) and parsed in one ``pyarrow.json`` call:
nested objects become structs, arrays lists. The explicit schema is the declared one (other
fields are ignored) or, when inferred, the table's current decoded columns (other fields are
inferred from the data: the new columns of schema evolution).

Only when the block does not parse - garbage bytes, a value of another type than its column,
a value that is not an object - are the values parsed one by one, to name the bad records;
the good ones are then parsed in bulk again. A null value (a tombstone) is a row of nulls.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from rayconnect.formats.base import Decoded
from rayconnect.formats.types import EPOCH_MILLIS, TIMESTAMP

_BLOCK_SIZE = 1 << 24  # Arrow parses the whole block as one chunk below 16 MiB


class JsonDecoder:
    """JSON objects -> columns, against a declared schema or an inferred one."""

    def __init__(self, declared: pa.Schema | None = None) -> None:
        self.declared = declared

    def decode(self, values: pa.Array, table_schema: pa.Schema | None) -> Decoded:
        explicit = self._explicit(table_schema)
        values = pc.fill_null(values.cast(pa.binary()), b"{}")
        table = _parse(_ndjson(values), explicit, self.declared is None)
        if table is not None and table.num_rows == len(values):
            return Decoded(self._finish(table, explicit))
        return self._decode_one_by_one(values, explicit)

    def _explicit(self, table_schema: pa.Schema | None) -> pa.Schema:
        """What the parser is told: declared columns, or the table's (epoch-millis columns
        are read as integers and converted after)."""
        schema = self.declared if self.declared is not None else table_schema or pa.schema([])
        return pa.schema(
            [
                f.with_type(pa.int64()) if f.metadata and _is_millis(f) else _parse_field(f)
                for f in schema
            ]
        )

    def _finish(self, table: pa.Table, explicit: pa.Schema) -> pa.Table:
        """Epoch millis -> timestamps; columns the block knows nothing about (all null,
        type null) dropped: they carry no type to add to the table."""
        target = self.declared
        columns, fields = [], []
        for f, column in zip(table.schema, table.columns, strict=True):
            if pa.types.is_null(f.type):
                continue
            declared = target.field(f.name) if target is not None else None
            if declared is not None and declared.metadata and _is_millis(declared):
                column = column.cast(pa.timestamp("ms", tz="UTC")).cast(TIMESTAMP)
                f = declared
            elif pa.types.is_timestamp(f.type) and f.type != TIMESTAMP:
                column = column.cast(TIMESTAMP)
                f = f.with_type(TIMESTAMP)
            columns.append(column)
            fields.append(f.with_nullable(True))
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))

    def _decode_one_by_one(self, values: pa.Array, explicit: pa.Schema) -> Decoded:
        """The error path: find the bad values, then decode the others together."""
        infer = self.declared is None
        bad: dict[int, str] = {}
        pieces: list[pa.Table] = []
        for i, value in enumerate(values.to_pylist()):
            reason = None
            if not value.strip():
                reason = "empty value"
            else:
                try:
                    one = _parse(value.replace(b"\n", b" ") + b"\n", explicit, infer, raise_=True)
                    assert one is not None
                    if one.num_rows != 1:
                        reason = f"{one.num_rows} JSON objects in one value"
                    else:
                        pieces.append(one)
                except (pa.ArrowInvalid, ValueError) as e:
                    reason = f"not a JSON object of the table's types: {_first_line(e)}"
            if reason is not None:
                bad[i] = reason
        good_idx = [i for i in range(len(values)) if i not in bad]
        # Records that parse alone may still disagree among themselves (a new field that
        # is a number in one and a string in another): the first type wins.
        schema = pa.schema([])
        kept = []
        for i, piece in zip(good_idx, pieces, strict=True):
            try:
                schema = pa.unify_schemas([schema, _without_null_columns(piece.schema)])
                kept.append(i)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                bad[i] = f"a field's type conflicts with earlier records: {_first_line(e)}"
        if not kept:
            return Decoded(self._finish(pa.table({}), explicit).slice(0, 0), bad)
        good = values.take(pa.array(kept))
        explicit_all = pa.schema(
            list(explicit) + [f for f in schema if f.name not in explicit.names]
        )
        table = _parse(_ndjson(good), explicit_all, False, raise_=True)
        assert table is not None and table.num_rows == len(kept)
        return Decoded(self._finish(table, explicit), bad)


def _is_millis(f: pa.Field) -> bool:
    return bool(f.metadata) and all(f.metadata.get(k) == v for k, v in EPOCH_MILLIS.items())


def _parse_field(f: pa.Field) -> pa.Field:
    """Arrow's JSON reader parses timestamps without a zone; the zone is put back after."""
    if pa.types.is_timestamp(f.type) and f.type.tz is not None:
        return f.with_type(pa.timestamp(f.type.unit))
    return f


def _without_null_columns(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f for f in schema if not pa.types.is_null(f.type)])


def _ndjson(values: pa.Array) -> bytes:
    """The values as newline-delimited JSON, without a Python object per value."""
    n = len(values)
    if n == 0:
        return b""
    offsets = np.frombuffer(
        values.buffers()[1], dtype=np.int32, count=n + 1, offset=values.offset * 4
    )
    data = np.frombuffer(values.buffers()[2], dtype=np.uint8, count=int(offsets[-1]))
    start = int(offsets[0])
    lengths = np.diff(offsets)
    out = np.full(int(offsets[-1]) - start + n, ord("\n"), dtype=np.uint8)
    # each value i lands at (its offset - start + i): one newline after each value
    positions = np.repeat(offsets[:-1] - start + np.arange(n), lengths) + (
        np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    )
    body = data[start:].copy()
    body[(body == ord("\n")) | (body == ord("\r"))] = ord(" ")
    out[positions] = body
    return out.tobytes()


def _parse(data: bytes, explicit: pa.Schema, infer: bool, raise_: bool = False) -> pa.Table | None:
    if not data:
        return pa.Table.from_batches([], schema=explicit)
    try:
        return pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(block_size=max(_BLOCK_SIZE, len(data) + 1)),
            parse_options=pj.ParseOptions(
                explicit_schema=explicit,
                unexpected_field_behavior="infer" if infer else "ignore",
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        if raise_:
            raise
        return None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
