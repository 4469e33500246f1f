"""``partition_by=[...]`` of a Delta or Iceberg sink: table partitions of a typed table.

An entry is a column (``country``, ``_kafka_partition``) or a derived one,
``name=day(col)`` (a date) or ``name=hour(col)`` (``YYYY-MM-DD-HH``, a string) of a
timestamp column (``_kafka_timestamp`` or a declared ``timestamp``). The executors add the
derived columns to each block and write one file per table partition per group, in
Hive-style folders (``name=value/``); the partition columns are not in the files - Delta
keeps their values in the add actions, which the committer reads back from the folders.
Iceberg (``RecordFormat.partition_values_in_files``) gets the same entries as a partition
spec (``day``/``hour``/``identity`` transforms of the source column): its files keep every
data column, derived values only choose the folder, and the table reads each file's
partition from its column statistics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.errors import ConfigError

_DERIVED = re.compile(r"^\s*(\w+)\s*=\s*(day|hour)\s*\(\s*(\w+)\s*\)\s*$")
_PLAIN = re.compile(r"^\s*(\w+)\s*$")
#: Delta's (and Hive's) folder value for a null partition value
NULL_VALUE = "__HIVE_DEFAULT_PARTITION__"
#: Types whose values make sensible folder names
_PARTITION_TYPES = (pa.types.is_string, pa.types.is_integer, pa.types.is_date, pa.types.is_boolean)


@dataclass(frozen=True)
class PartitionSpec:
    """One table partition column: ``name``, made from ``source`` by ``transform``."""

    name: str
    source: str
    transform: str  # identity | day | hour

    def arrow_type(self, source_type: pa.DataType) -> pa.DataType:
        if self.transform == "day":
            return pa.date32()
        if self.transform == "hour":
            return pa.string()
        return source_type


def parse(entries: tuple[str, ...], columns: pa.Schema) -> list[PartitionSpec]:
    """The specs of ``partition_by`` against the table's known columns (ConfigError)."""
    specs: list[PartitionSpec] = []
    for entry in entries:
        derived, plain = _DERIVED.match(entry), _PLAIN.match(entry)
        if derived:
            spec = PartitionSpec(derived[1], derived[3], derived[2])
        elif plain:
            spec = PartitionSpec(plain[1], plain[1], "identity")
        else:
            raise ConfigError(
                f"sink.partition_by: {entry!r} is neither a column nor 'name=day(col)' / "
                "'name=hour(col)'"
            )
        if spec.source not in columns.names:
            raise ConfigError(
                f"sink.partition_by: {entry!r}: no column {spec.source!r} known before the "
                f"data arrives (known: {columns.names}); declare its type in "
                "source.value_schema - with source.infer_other_fields: true the fields you do "
                "not declare are still inferred, and the table still grows with them"
            )
        t = columns.field(spec.source).type
        if spec.transform != "identity" and not pa.types.is_timestamp(t):
            raise ConfigError(
                f"sink.partition_by: {entry!r}: {spec.source!r} is {t}, not a timestamp"
            )
        if spec.transform == "identity" and not any(check(t) for check in _PARTITION_TYPES):
            raise ConfigError(
                f"sink.partition_by: {entry!r}: a {t} column cannot be a partition; "
                "use a string, integer, date or boolean column, or day()/hour() of a timestamp"
            )
        if spec.transform != "identity" and spec.name in columns.names:
            raise ConfigError(f"sink.partition_by: {entry!r}: column {spec.name!r} exists")
        specs.append(spec)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"sink.partition_by: a column twice in {names}")
    return specs


def derived_fields(specs: list[PartitionSpec], columns: pa.Schema) -> list[pa.Field]:
    """The columns the table gets from the derived specs."""
    return [
        pa.field(s.name, s.arrow_type(columns.field(s.source).type))
        for s in specs
        if s.transform != "identity"
    ]


def with_derived(rows: pa.Table, specs: list[PartitionSpec]) -> pa.Table:
    """``rows`` plus the derived partition columns (vectorized)."""
    for s in specs:
        if s.transform == "identity":
            continue
        ts = rows.column(s.source)
        if s.transform == "day":
            column = pc.cast(ts, pa.date32())  # the UTC date
        else:
            column = pc.strftime(ts, format="%Y-%m-%d-%H")
        rows = rows.append_column(pa.field(s.name, column.type), column)
    return rows


def split(
    rows: pa.Table, specs: list[PartitionSpec], values_in_files: bool = False, whole: bool = False
) -> list[tuple[str, pa.Table]]:
    """``rows`` per table partition: (Hive folder path ``a=1/b=x``, rows without the
    partition columns - or, ``values_in_files`` (Iceberg), without the derived ones only:
    the table derives every partition value from the file's own columns). One pass over
    the unique values, not one per row.

    ``whole``: one piece, unsplit, with every column the table has (derived ones too,
    unless ``values_in_files``) - an upsert round's change files, which the table never
    references: the committer reads them back and its MERGE (or DELETE + APPEND) writes the
    table's partitions, and a key that moved partition must carry its new values."""
    if whole:
        derived = [s.name for s in specs if s.transform != "identity"]
        return [("", rows.drop_columns(derived) if values_in_files else rows)]
    if not specs:
        return [("", rows)]
    texts = [_as_text(rows.column(s.name)) for s in specs]
    key = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, "\x00")
    encoded = pc.dictionary_encode(key).combine_chunks()
    names = [s.name for s in specs]
    drop = [s.name for s in specs if s.transform != "identity"] if values_in_files else names
    out = []
    for code, value in enumerate(encoded.dictionary.to_pylist()):
        parts = value.split("\x00") if len(texts) > 1 else [value]
        folder = "/".join(f"{n}={_escape(v)}" for n, v in zip(names, parts, strict=True))
        picked = rows.filter(pc.equal(encoded.indices, code))
        out.append((folder, picked.drop_columns(drop)))
    return out


def values_of(path: str) -> dict[str, str | None]:
    """The partition values in a file's path (its ``name=value`` folders)."""
    values: dict[str, str | None] = {}
    for segment in path.split("/")[:-1]:
        name, eq, value = segment.partition("=")
        if eq and not name.startswith("_rc_"):
            text = unquote(value)
            values[name] = None if text == NULL_VALUE else text
    return values


def _as_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Partition values as Delta writes them (dates ISO, booleans true/false); nulls as
    Hive's marker."""
    if pa.types.is_boolean(column.type):
        text = pc.if_else(column, "true", "false")
    else:
        text = pc.cast(column, pa.string())
    return pc.fill_null(text, "\x01")


def _escape(value: str) -> str:
    return NULL_VALUE if value == "\x01" else quote(value, safe="-_.:")
