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
new; afterwards the table's type steers the parser. A column the table does not have yet but
the records' ``rayconnect.value_schema`` header types (``hinted``:
``formats.value_schema_header``) is parsed as that type, not inferred. Dates, base64 binary
and zoned timestamps are parsed as what the reader takes and converted after
(``formats.json_types``); a value that does not convert is a bad record.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from rayconnect.formats.base import Decoded
from rayconnect.formats.iso_time import infer_timestamps, timestamps_as_strings
from rayconnect.formats.json_types import convert, parse_type
from rayconnect.formats.types import EPOCH_MILLIS, TIMESTAMP

_BLOCK_SIZE = 1 << 24  # Arrow parses the whole block as one chunk below 16 MiB


class JsonDecoder:
    """JSON objects -> columns, against a declared schema or an inferred one."""

    def __init__(
        self,
        declared: pa.Schema | None = None,
        infer_others: bool = False,
        hinted: pa.Schema | None = None,
    ) -> None:
        self.declared = declared
        #: fields that are not declared become columns (else they are ignored)
        self.infers = declared is None or infer_others
        #: the types of fields neither declared nor in the table (a header's), if inferred
        self.hinted = hinted if self.infers else None

    def decode(self, values: pa.Array, table_schema: pa.Schema | None) -> Decoded:
        targets = self._targets(table_schema)
        explicit = self._explicit(targets)
        values = pc.fill_null(values.cast(pa.binary()), b"{}")
        table = _parse(_ndjson(values), explicit, self.infers)
        if table is not None and table.num_rows == len(values):
            finished, lost = self._finish(table, targets)
            return _without_lost(finished, lost, np.arange(len(values)), {})
        return self._decode_one_by_one(values, targets, explicit)

    def _targets(self, table_schema: pa.Schema | None) -> pa.Schema:
        """The types the known columns end as: declared columns, or the table's, then the
        hinted ones the table does not have."""
        schema = table_schema or pa.schema([])
        if self.declared is not None:  # the declared types win; other columns: the table's
            others = [f for f in schema if f.name not in self.declared.names]
            schema = pa.schema(list(self.declared) + (others if self.infers else []))
        if self.hinted is not None:
            schema = pa.schema(list(schema) + [f for f in self.hinted if f.name not in schema.names])
        return schema

    @staticmethod
    def _explicit(targets: pa.Schema) -> pa.Schema:
        """What the parser is told (epoch-millis columns are read as integers, dates and
        binary as strings, zoned timestamps without their zone: converted after)."""
        return pa.schema(
            [
                f.with_type(pa.int64()) if f.metadata and _is_millis(f) else f.with_type(
                    parse_type(f.type)
                )
                for f in targets
            ]
        )

    def _finish(self, table: pa.Table, targets: pa.Schema) -> tuple[pa.Table, dict[int, str]]:
        """Epoch millis -> timestamps; parsed columns -> their target types
        (``formats.json_types``); new inferred columns' ISO-8601 strings -> timestamps
        (``formats.iso_time``); columns the block knows nothing about (all null, type null)
        dropped: they carry no type to add to the table. Also the rows whose value did not
        convert, by row, with the reason."""
        columns, fields = [], []
        lost: dict[int, str] = {}
        for f, column in zip(table.schema, table.columns, strict=True):
            if pa.types.is_null(f.type):
                continue
            at = targets.get_field_index(f.name)
            target = targets.field(at) if at >= 0 else None
            if target is None:
                if self.infers:
                    column = _inferred_timestamps(column)
                    f = f.with_type(column.type)
                if pa.types.is_timestamp(f.type) and f.type != TIMESTAMP:
                    column = column.cast(TIMESTAMP)
                    f = f.with_type(TIMESTAMP)
            elif target.metadata and _is_millis(target):
                column = column.cast(pa.timestamp("ms", tz="UTC")).cast(TIMESTAMP)
                f = target
            elif f.type != target.type and parse_type(target.type) != target.type:
                column, bad = convert(column.combine_chunks(), target.type)
                for row in np.flatnonzero(bad) if bad is not None else ():
                    lost.setdefault(int(row), f"field {f.name!r}: not a {target.type}")
                f = f.with_type(target.type)
            columns.append(column)
            fields.append(f.with_nullable(True))
        return pa.Table.from_arrays(columns, schema=pa.schema(fields)), lost

    def _decode_one_by_one(
        self, values: pa.Array, targets: pa.Schema, explicit: pa.Schema
    ) -> Decoded:
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
            return Decoded(self._finish(pa.table({}), targets)[0].slice(0, 0), bad)
        good = values.take(pa.array(kept))
        explicit_all = pa.schema(
            list(explicit) + [f for f in schema if f.name not in explicit.names]
        )
        table = _parse(_ndjson(good), explicit_all, False, raise_=True)
        assert table is not None and table.num_rows == len(kept)
        finished, lost = self._finish(table, targets)
        return _without_lost(finished, lost, np.array(kept), bad)


def _without_lost(
    table: pa.Table, lost: dict[int, str], origin: np.ndarray, bad: dict[int, str]
) -> Decoded:
    """``table`` without the rows whose value did not convert; those bad by their index
    among the values (``origin[row]``), with ``bad``'s."""
    if not lost:
        return Decoded(table, bad)
    bad = {**bad, **{int(origin[row]): reason for row, reason in lost.items()}}
    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(lost)] = False
    return Decoded(table.filter(pa.array(keep)), bad)


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
