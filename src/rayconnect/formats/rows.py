"""One block of raw records (``RAW_RECORD_SCHEMA``) -> typed rows + dead letters.

The typed table has the ``_kafka_*`` coordinates first (names that cannot clash with data:
decoded fields may not start with ``_kafka_``), then the decoded fields in the table's
order, then fields the table does not have yet (schema evolution; ``formats.evolution``
decides whether the committer may add them). Bad records leave as dead-letter rows: the raw
key and value, where they came from, and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.formats import evolution, partitioning
from rayconnect.formats.base import Decoded, ValueDecoder
from rayconnect.formats.debezium import unwrap
from rayconnect.formats.settings import KAFKA_PREFIX, RecordFormat
from rayconnect.formats.upsert_rows import keyed_rows
from rayconnect.formats.value_schema_header import hinted_schema
from rayconnect.protocol.truncate_marker import TruncateScope, scope_of
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.write_modes.fold import LSN_COLUMN, PARTITION_TRUNCATE_COLUMN, TRUNCATE_COLUMN
from rayconnect.write_modes.unchanged import mark

_RAW_TO_KAFKA = {
    "cluster": "_kafka_cluster",
    "topic": "_kafka_topic",
    "partition": "_kafka_partition",
    "offset": "_kafka_offset",
    "timestamp": "_kafka_timestamp",
}

#: The dead-letter table: one row per bad record, raw bytes kept.
DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("_kafka_cluster", pa.string()),
        pa.field("_kafka_topic", pa.string()),
        pa.field("_kafka_partition", pa.int32()),
        pa.field("_kafka_offset", pa.int64()),
        pa.field("_kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("reason", pa.string()),
    ]
)


class BadRecordError(ValueError):
    """A record could not be decoded and the policy is ``errors: stop``."""

    def __init__(self, key: str, offset: int, reason: str) -> None:
        self.key, self.offset, self.reason = key, offset, reason
        super().__init__(f"bad record at {key} offset {offset}: {reason}")

    @classmethod
    def from_text(cls, text: str) -> BadRecordError:
        """Back from its message (it crosses Spark's JVM as text)."""
        head, _, reason = text.partition(": ")
        where = head.removeprefix("bad record at ")
        key, _, offset = where.rpartition(" offset ")
        try:
            return cls(key, int(offset), reason)
        except ValueError:
            return cls("?", -1, text)


def kafka_schema(fmt: RecordFormat) -> pa.Schema:
    """The ``_kafka_*`` columns a typed table always has (key/headers on request)."""
    fields = [
        pa.field(name, RAW_RECORD_SCHEMA.field(raw).type) for raw, name in _RAW_TO_KAFKA.items()
    ]
    if fmt.include_key:
        key_type = fmt.key_struct() or (pa.string() if fmt.key_format == "string" else pa.binary())
        fields.append(pa.field("_kafka_key", key_type))
    if fmt.include_headers:
        fields.append(pa.field("_kafka_headers", RAW_RECORD_SCHEMA.field("headers").type))
    return pa.schema(fields)


def initial_schema(fmt: RecordFormat) -> pa.Schema:
    """The schema a new table is created with: coordinates + declared (or string) value
    columns + derived partition columns; an inferred json table starts without value
    columns and grows."""
    if not fmt.typed:
        return RAW_RECORD_SCHEMA
    base = list(kafka_schema(fmt))
    declared = fmt.declared_schema()
    output = fmt.transform_output()
    if output is not None:  # the table holds what the transform makes
        base = list(output)
    elif declared is not None:
        base += [f.remove_metadata() for f in declared]
    elif fmt.value_format == "string":
        base.append(pa.field("value", pa.string()))
    elif fmt.value_format == "avro" and fmt.avro_schema is not None:
        from rayconnect.formats.avro import avro_schema_columns

        base += [f.with_nullable(True) for f in avro_schema_columns(fmt.avro_schema)]
    if fmt.partition_values_in_files:  # derived from columns by the table, not stored
        return pa.schema(base)
    return pa.schema(base + partitioning.derived_fields(partition_specs(fmt), pa.schema(base)))


def partition_specs(fmt: RecordFormat) -> list[partitioning.PartitionSpec]:
    """The table partitions of ``fmt`` (ConfigError if one names an unknown column)."""
    if not fmt.partition_by:
        return []
    known = initial_schema(
        msgspec.structs.replace(fmt, partition_by=(), partition_values_in_files=False)
    )
    return partitioning.parse(fmt.partition_by, known)


def decoder(fmt: RecordFormat, hinted: pa.Schema | None = None) -> ValueDecoder:
    """The decoder of the format (one module each); ``hinted``: json's types of the
    columns the records' headers declare (``formats.value_schema_header``)."""
    if fmt.value_format == "json":
        from rayconnect.formats.json import JsonDecoder

        return JsonDecoder(fmt.declared_schema(), fmt.infer_other_fields, hinted)
    if fmt.value_format == "avro":
        from rayconnect.formats.avro import AvroDecoder

        assert fmt.avro_schema is not None
        return AvroDecoder(fmt.avro_schema)
    if fmt.value_format == "string":
        from rayconnect.formats.string import StringDecoder

        return StringDecoder()
    from rayconnect.formats.raw import RawDecoder

    return RawDecoder()


@dataclass(frozen=True)
class DecodedBlock:
    rows: pa.Table
    dead_letters: pa.Table  # DEAD_LETTER_SCHEMA


def decode_block(raw: pa.Table, fmt: RecordFormat, table_schema: pa.Schema | None) -> DecodedBlock:
    """Decode one block of raw records. ``table_schema``: the table's current schema (its
    decoded columns steer the parser; a value contradicting them is a bad record).

    With ``errors: stop`` the first bad record raises ``BadRecordError``.
    """
    specs = partition_specs(fmt)
    derived = {sp.name for sp in specs if sp.transform != "identity"}
    table_value_cols = None
    if table_schema is not None:
        table_value_cols = pa.schema(
            [
                f
                for f in table_schema
                if not f.name.startswith(KAFKA_PREFIX) and f.name not in derived
            ]
        )
    values = raw.column("value").combine_chunks()
    keys, bad = _decode_keys(raw, fmt)
    values, deletes, marks = _changes(values, raw.column("headers"), fmt, bad)
    if fmt.max_value_bytes:
        too_long = pc.fill_null(pc.greater(pc.binary_length(values), fmt.max_value_bytes), False)
        for i in pc.indices_nonzero(too_long).to_pylist():
            bad[i] = f"value over max_value_bytes ({fmt.max_value_bytes})"
    keep = _mask_without(len(values), bad)
    candidates = values if not bad else values.filter(keep)
    hinted = hinted_schema(raw.column("headers")) if fmt.value_format == "json" else None
    decoded: Decoded = decoder(fmt, hinted).decode(candidates, table_value_cols)
    index_of = pc.indices_nonzero(keep).to_numpy() if bad else None
    for i, reason in decoded.bad.items():
        bad[int(index_of[i]) if index_of is not None else i] = reason
    columns = decoded.columns
    # Fields that cannot become columns make their records bad (never silently dropped):
    # a name rayconnect uses (``_kafka_*``, a derived partition column), or a type the
    # table's column cannot hold (e.g. a struct that gained a nested field).
    for name in list(columns.column_names):
        field_type = columns.schema.field(name).type
        if name.startswith(KAFKA_PREFIX):
            reason = f"field {name!r} uses the reserved prefix {KAFKA_PREFIX!r}"
        elif name in derived:
            reason = f"field {name!r} is the name of a derived partition column"
        elif (
            table_value_cols is not None
            and name in table_value_cols.names
            and not evolution.compatible(field_type, table_value_cols.field(name).type)
        ):
            reason = (
                f"field {name!r} is {field_type} here, "
                f"{table_value_cols.field(name).type} in the table"
            )
        else:
            continue
        table_type = (
            table_value_cols.field(name).type
            if table_value_cols is not None and name in table_value_cols.names
            else None
        )
        narrowed = _struct_within(columns.column(name), table_type)
        if narrowed is not None:  # only records using the new nested fields are bad
            column, uses_new = narrowed
            index = columns.column_names.index(name)
            columns = columns.set_column(index, pa.field(name, table_type), column)
            columns, bad = _reject_where(columns, uses_new, reason, len(values), bad)
            continue
        columns, bad = _reject(columns, name, reason, len(values), bad)
    good = _mask_without(raw.num_rows, bad) if bad else None
    good_raw = raw.filter(good) if good is not None else raw
    if keys is not None and good is not None:
        keys = keys.filter(good)
    unchanged: dict[str, pa.Array] = {}
    if deletes is not None:  # an upsert table: values a change does not carry are marked
        placeholder = fmt.unavailable_value if fmt.envelope == "debezium" else None
        columns, unchanged = mark(columns, good_raw.column("headers"), placeholder)
    rows = partitioning.with_derived(_with_coordinates(good_raw, columns, fmt, keys), specs)
    if deletes is not None:
        origin = (
            pc.indices_nonzero(good).to_numpy() if good is not None else np.arange(raw.num_rows)
        )
        if good is not None:
            deletes = deletes.filter(good)
            marks = {name: column.filter(good) for name, column in marks.items()}
        marks |= unchanged
        rows, missing = keyed_rows(rows, deletes, fmt.upsert_keys, origin, marks)
        bad.update(missing)
    bad = {i: reason for i, reason in bad.items() if reason is not _UNCHANGED}
    if bad and fmt.errors == "stop":
        first = min(bad)
        row = raw.slice(first, 1).to_pylist()[0]
        key = f"{row['cluster']}/{row['topic']}/{row['partition']}"
        raise BadRecordError(key, row["offset"], bad[first])
    return DecodedBlock(conform_to_table(rows, table_schema), _dead_letters(raw, bad))


#: the "reason" of a record that changes nothing (Debezium's tombstone after a delete): left
#: out of the rows like a bad record, but no dead letter
_UNCHANGED = "\0unchanged"


def _changes(
    values: pa.Array, headers: pa.ChunkedArray, fmt: RecordFormat, bad: dict[int, str]
) -> tuple[pa.Array, pa.Array | None, dict[str, pa.Array]]:
    """An upsert table's values as rows to decode, whether each deletes its key, and the
    columns that order truncates (``write_modes.fold``: which are truncates of the whole
    table, which of their partition's rows - by the event's headers, ``TruncateScope`` -
    and each event's LSN; only where there are some); ``bad`` gains the change events that
    cannot apply and, as ``_UNCHANGED``, those that change nothing. Append tables: the
    values as they are, no flags."""
    if not fmt.upsert_keys:
        return values, None, {}
    if fmt.envelope == "none":
        return values, pc.is_null(values), {}
    unwrapped = unwrap(values, apply_truncate=fmt.truncate == "apply")
    for i, reason in unwrapped.bad.items():
        bad.setdefault(i, reason)
    for i in unwrapped.skipped:
        bad.setdefault(i, _UNCHANGED)
    marks: dict[str, pa.Array] = {}
    if unwrapped.truncate:
        columns = {
            TruncateScope.TABLE: TRUNCATE_COLUMN,
            TruncateScope.PARTITION: PARTITION_TRUNCATE_COLUMN,
        }
        flags = {scope: np.zeros(len(values), dtype=bool) for scope in columns}
        for i in unwrapped.truncate:  # (few: only the truncates' headers are read)
            flags[scope_of(headers[i].as_py())][i] = True
        for scope, name in columns.items():
            if flags[scope].any():
                marks[name] = pa.array(flags[scope])
    if fmt.truncate == "apply" and unwrapped.lsn.null_count < len(values):
        marks[LSN_COLUMN] = unwrapped.lsn
    return unwrapped.rows, unwrapped.delete, marks


def _reject(
    columns: pa.Table, name: str, reason: str, n: int, bad: dict[int, str]
) -> tuple[pa.Table, dict[int, str]]:
    """Records with a value in column ``name`` become bad; the column goes."""
    good_idx = pc.indices_nonzero(_mask_without(n, bad)).to_numpy()
    hit = pc.indices_nonzero(pc.is_valid(columns.column(name))).to_numpy()
    bad = dict(bad)
    for j in hit:
        bad[int(good_idx[j])] = reason
    columns = columns.drop_columns([name])
    return columns.filter(_mask_without(columns.num_rows, {int(j): "" for j in hit})), bad


def _struct_within(
    column: pa.ChunkedArray, table_type: pa.DataType | None
) -> tuple[pa.Array, pa.Array] | None:
    """A struct column with nested fields the table's struct lacks (the table's fields
    themselves compatible): the column as the table's struct, and which rows have a value
    in a new nested field. None when that does not apply."""
    if table_type is None or not (
        pa.types.is_struct(column.type) and pa.types.is_struct(table_type)
    ):
        return None
    have = {column.type.field(i).name: column.type.field(i) for i in range(column.type.num_fields)}
    want = [table_type.field(i) for i in range(table_type.num_fields)]
    if any(f.name in have and not evolution.compatible(have[f.name].type, f.type) for f in want):
        return None
    array = column.combine_chunks()
    new = [name for name in have if name not in {f.name for f in want}]
    uses_new = pa.array([False] * len(array))
    for name in new:
        uses_new = pc.or_(uses_new, pc.fill_null(pc.is_valid(pc.struct_field(array, name)), False))
    children = [
        pc.struct_field(array, f.name).cast(f.type)
        if f.name in have
        else pa.nulls(len(array), f.type)
        for f in want
    ]
    narrowed = pa.StructArray.from_arrays(children, fields=want, mask=pc.invert(pc.is_valid(array)))
    return narrowed, uses_new


def _reject_where(
    columns: pa.Table, rows: pa.Array, reason: str, n: int, bad: dict[int, str]
) -> tuple[pa.Table, dict[int, str]]:
    """The records of ``columns`` flagged in ``rows`` become bad."""
    good_idx = pc.indices_nonzero(_mask_without(n, bad)).to_numpy()
    hit = pc.indices_nonzero(rows).to_numpy()
    bad = dict(bad)
    for j in hit:
        bad[int(good_idx[j])] = reason
    return columns.filter(_mask_without(columns.num_rows, {int(j): "" for j in hit})), bad


def _mask_without(n: int, bad: dict[int, str]) -> pa.Array:
    import numpy as np

    mask = np.ones(n, dtype=bool)
    if bad:
        mask[list(bad)] = False
    return pa.array(mask)


def _decode_keys(raw: pa.Table, fmt: RecordFormat) -> tuple[pa.Array | None, dict[int, str]]:
    """key_format json: every record's key as a struct (null where the key is bad), and
    the bad keys by index - a bad key makes its record bad, like a bad value."""
    struct_type = fmt.key_struct()
    if struct_type is None:
        return None, {}
    from rayconnect.formats.json import JsonDecoder

    keys = raw.column("key").combine_chunks()
    declared = pa.schema(list(struct_type))
    decoded = JsonDecoder(declared).decode(keys, declared)
    columns = decoded.columns
    arrays = [
        columns.column(f.name).combine_chunks().cast(f.type)
        if f.name in columns.column_names
        else pa.nulls(columns.num_rows, f.type)
        for f in struct_type
    ]
    good = pa.StructArray.from_arrays(arrays, fields=list(struct_type))
    bad = {i: f"key: {reason}" for i, reason in decoded.bad.items()}
    if not bad:
        return good, bad
    mask = np.ones(len(keys), dtype=bool)
    mask[list(bad)] = False
    at = pa.array(np.cumsum(mask) - 1, mask=~mask)  # each record's row among the good keys
    return good.take(at), bad


def _with_coordinates(
    raw: pa.Table, decoded: pa.Table, fmt: RecordFormat, keys: pa.Array | None = None
) -> pa.Table:
    arrays = [raw.column(r) for r in _RAW_TO_KAFKA]
    names = list(_RAW_TO_KAFKA.values())
    if fmt.include_key:
        key = raw.column("key")
        if keys is not None:
            arrays.append(keys)
        else:
            arrays.append(key.cast(pa.string()) if fmt.key_format == "string" else key)
        names.append("_kafka_key")
    if fmt.include_headers:
        arrays.append(raw.column("headers"))
        names.append("_kafka_headers")
    out = pa.Table.from_arrays(arrays, names=names)
    for name, column in zip(decoded.column_names, decoded.columns, strict=True):
        out = out.append_column(decoded.schema.field(name), column)
    return out


def conform_to_table(rows: pa.Table, table_schema: pa.Schema | None) -> pa.Table:
    """The table's columns in its order and types (a narrower decoded type - int, float -
    is written as the table's wider one; a column the block lacks is null), then the
    block's new columns."""
    if table_schema is None:
        return rows
    arrays, fields = [], []
    for f in table_schema:
        if f.name in rows.column_names:
            column = rows.column(f.name)
            arrays.append(column if column.type == f.type else column.cast(f.type))
        else:
            arrays.append(pa.nulls(rows.num_rows, f.type))
        fields.append(f.with_nullable(True))
    for f in rows.schema:
        if f.name not in table_schema.names:
            arrays.append(rows.column(f.name))
            fields.append(f.with_nullable(True))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _dead_letters(raw: pa.Table, bad: dict[int, str]) -> pa.Table:
    if not bad:
        return DEAD_LETTER_SCHEMA.empty_table()
    idx = sorted(bad)
    picked = raw.take(pa.array(idx))
    arrays = [picked.column(r) for r in _RAW_TO_KAFKA] + [
        picked.column("key"),
        picked.column("value"),
        pa.array([bad[i] for i in idx], pa.string()),
    ]
    return pa.Table.from_arrays(arrays, schema=DEAD_LETTER_SCHEMA)


def dead_letter_rows(raw: pa.Table, bad: dict[int, str]) -> pa.Table:
    """Rows ``bad`` (index -> reason) of a raw block as dead-letter rows - also for what
    is bad before decoding (a record no route takes: ``formats.route_split``)."""
    return _dead_letters(raw, bad)
