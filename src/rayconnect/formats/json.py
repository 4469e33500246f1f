"""``json``: one JSON object per value, parsed by Arrow's JSON reader a block at a time.

The block's values are joined into one newline-delimited buffer (newline bytes inside a
value are JSON whitespace and become spaces first) and parsed in one ``pyarrow.json`` call:
nested objects become structs, arrays lists. The explicit schema is the declared one (other
fields are ignored) or, when inferred, the table's current decoded columns (other fields are
inferred from the data: the new columns of schema evolution); with ``infer_others``, the
declared columns plus the table's others, and other fields inferred.

Only when the block does not parse - garbage bytes, a value of another type than its column,
a value that is not an object - are the values parsed one by one, to name the bad records;
the good ones are then parsed in bulk again. A null value (a tombstone) is a row of nulls.

An inferred column's strings become timestamps by ``formats.iso_time``'s rule (ISO-8601 with
fractional seconds and offsets too, not only what Arrow infers), decided when the column is
new; afterwards the table's type steers the parser.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from rayconnect.formats.base import Decoded
from rayconnect.formats.iso_time import infer_timestamps, timestamps_as_strings
from rayconnect.formats.types import EPOCH_MILLIS, TIMESTAMP

_BLOCK_SIZE = 1 << 24  # Arrow parses the whole block as one chunk below 16 MiB


class JsonDecoder:
    """JSON objects -> columns, against a declared schema or an inferred one."""

    def __init__(self, declared: pa.Schema | None = None, infer_others: bool = False) -> None:
        self.declared = declared
        #: fields that are not declared become columns (else they are ignored)
        self.infers = declared is None or infer_others

    def decode(self, values: pa.Array, table_schema: pa.Schema | None) -> Decoded:
        explicit = self._explicit(table_schema)
        values = pc.fill_null(values.cast(pa.binary()), b"{}")
        table = _parse(_ndjson(values), explicit, self.infers)
        if table is not None and table.num_rows == len(values):
            return Decoded(self._finish(table, explicit))
        return self._decode_one_by_one(values, explicit)

    def _explicit(self, table_schema: pa.Schema | None) -> pa.Schema:
        """What the parser is told: declared columns, or the table's (epoch-millis columns
        are read as integers and converted after)."""
        schema = table_schema or pa.schema([])
        if self.declared is not None:  # the declared types win; other columns: the table's
            others = [f for f in schema if f.name not in self.declared.names]
            schema = pa.schema(list(self.declared) + (others if self.infers else []))
        return pa.schema(
            [
                f.with_type(pa.int64()) if f.metadata and _is_millis(f) else _parse_field(f)
                for f in schema
            ]
        )

    def _finish(self, table: pa.Table, explicit: pa.Schema) -> pa.Table:
        """Epoch millis -> timestamps; new inferred columns' ISO-8601 strings -> timestamps
        (``formats.iso_time``); columns the block knows nothing about (all null, type null)
        dropped: they carry no type to add to the table."""
        target = self.declared
        columns, fields = [], []
        for f, column in zip(table.schema, table.columns, strict=True):
            if pa.types.is_null(f.type):
                continue
            at = target.get_field_index(f.name) if target is not None else -1
            declared = target.field(at) if target is not None and at >= 0 else None
            if self.infers and f.name not in explicit.names:
                column = _inferred_timestamps(column)
                f = f.with_type(column.type)
            elif declared is not None and declared.metadata and _is_millis(declared):
                column = column.cast(pa.timestamp("ms", tz="UTC")).cast(TIMESTAMP)
                f = declared
            elif pa.types.is_timestamp(f.type) and f.type != TIMESTAMP:
                column = column.cast(TIMESTAMP)
                f = f.with_type(TIMESTAMP)
            columns.append(column)
            fields.append(f.with_nullable(True))
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))

    def _decode_one_by_one(self, values: pa.Array, explicit: pa.Schema) -> Decoded:
        """The error path: find the bad values by bisection (a parse of each half, down to
        single values: ~2 log2(n) parses per bad record, not one per record), then decode
        the others together."""
        infer = self.infers
        bad: dict[int, str] = {}
        pieces: list[tuple[int, int, pa.Table]] = []
        stack = [(0, len(values))]
        while stack:
            lo, hi = stack.pop()
            chunk = values.slice(lo, hi - lo)
            try:
                table = _parse(_ndjson(chunk), explicit, infer, raise_=True)
                error = None
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
                table, error = None, e
            if table is not None and table.num_rows == hi - lo:
                pieces.append((lo, hi, table))
            elif hi - lo > 1:
                mid = (lo + hi) // 2
                stack += [(mid, hi), (lo, mid)]
            elif not chunk[0].as_py().strip():
                bad[lo] = "empty value"
            elif error is None:
                bad[lo] = f"{table.num_rows if table is not None else 0} JSON objects in one value"
            else:
                bad[lo] = f"not a JSON object of the table's types: {_first_line(error)}"
        # Pieces that parse alone may still disagree among themselves (a new field that is
        # a number in one and a string in another): the first type wins, per record.
        schema = pa.schema([])
        for lo, hi, table in sorted(pieces, key=lambda p: p[0]):
            try:
                schema = pa.unify_schemas([schema, _without_null_columns(table.schema)])
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass
            for i in range(lo, hi):
                one = _parse(_ndjson(values.slice(i, 1)), explicit, infer, raise_=True)
                assert one is not None
                try:
                    schema = pa.unify_schemas([schema, _without_null_columns(one.schema)])
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    bad[i] = f"a field's type conflicts with earlier records: {_first_line(e)}"
        kept = [i for i in range(len(values)) if i not in bad]
        if not kept:
            return Decoded(self._finish(pa.table({}), explicit).slice(0, 0), bad)
        good = values.take(pa.array(kept))
        explicit_all = pa.schema(
            list(explicit) + [f for f in schema if f.name not in explicit.names]
        )
        table = _parse(_ndjson(good), explicit_all, False, raise_=True)
        assert table is not None and table.num_rows == len(kept)
        return Decoded(self._finish(table, explicit), bad)


def _inferred_timestamps(column: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A new column with its timestamps decided by the rule, not by Arrow's inference."""
    as_strings = timestamps_as_strings(column.type)
    if as_strings == column.type and not _has_strings(column.type):
        return column
    return infer_timestamps(column.combine_chunks().cast(as_strings))


def _has_strings(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_strings(t.field(i).type) for i in range(t.num_fields))
    return pa.types.is_list(t) and _has_strings(t.value_type)


def _is_millis(f: pa.Field) -> bool:
    return bool(f.metadata) and all(f.metadata.get(k) == v for k, v in EPOCH_MILLIS.items())


def _parse_field(f: pa.Field) -> pa.Field:
    """Arrow's JSON reader parses timestamps without a zone; the zone is put back after."""
    if pa.types.is_timestamp(f.type) and f.type.tz is not None:
        return f.with_type(pa.timestamp(f.type.unit))
    return f


def _without_null_columns(schema: pa.Schema) -> pa.Schema:
    """The columns with a type; inferred timestamps as strings (``formats.iso_time``
    decides them for the whole block: two pieces must not disagree on them)."""
    return pa.schema(
        [
            f.with_type(timestamps_as_strings(f.type))
            for f in schema
            if not pa.types.is_null(f.type)
        ]
    )


def _ndjson(values: pa.Array) -> pa.Buffer:
    """The values as newline-delimited JSON, without a Python object per value: Arrow's
    element-wise join appends the newlines (~0.16 us a 230 B value here)."""
    if len(values) == 0:
        return pa.py_buffer(b"")
    offsets = np.frombuffer(
        values.buffers()[1], dtype=np.int32, count=len(values) + 1, offset=values.offset * 4
    )
    data = np.frombuffer(values.buffers()[2], dtype=np.uint8, count=int(offsets[-1]))
    body = data[int(offsets[0]) :]
    if np.count_nonzero((body == ord("\n")) | (body == ord("\r"))):
        # a pretty-printed value: its newlines are JSON whitespace (rare: a copy is fine)
        body = body.copy()
        body[(body == ord("\n")) | (body == ord("\r"))] = ord(" ")
        values = pa.Array.from_buffers(
            pa.binary(), len(values), [None, pa.py_buffer(offsets - offsets[0]), pa.py_buffer(body)]
        )
    joined = pc.binary_join_element_wise(values, pa.scalar(b""), pa.scalar(b"\n"))
    ends = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=len(joined) + 1)
    return joined.buffers()[2].slice(int(ends[0]), int(ends[-1] - ends[0]))


def _parse(data: pa.Buffer, explicit: pa.Schema, infer: bool, raise_: bool = False) -> pa.Table | None:
    if not data:
        return pa.Table.from_batches([], schema=explicit)
    try:
        return pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(block_size=max(_BLOCK_SIZE, data.size + 1)),
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
