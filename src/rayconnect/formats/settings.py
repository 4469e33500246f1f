"""``RecordFormat``: how a source's keys and values are encoded, and what bad records do.

Built from the source's settings (``value_format``, ``key_format``, ``value_schema``,
``errors``...) and checked when built, so a wrong type name or a reserved column name is a
``ConfigError`` before any actor starts. It travels to the writer and its Spark executors,
which decode each block with it (``formats.rows``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import pyarrow as pa

from rayconnect.errors import ConfigError, require
from rayconnect.formats.types import TypeNameError, declared_fields

ValueFormat = Literal["raw", "string", "json", "avro"]
KeyFormat = Literal["raw", "string", "json"]
ErrorPolicy = Literal["stop", "dead_letter"]
Envelope = Literal["none", "debezium"]
#: how a round's rows change a table: appended, or upserted by key (``write_modes``)
WriteMode = Literal["append", "upsert"]
#: how an upsert round changes the rows it replaces (docs/guides/upserts.md#merge-on-read):
#: rewrites the files that hold them, or marks them deleted where they are
UpsertMode = Literal["copy_on_write", "merge_on_read"]
#: what an upsert table does with a Debezium truncate event: empties the table
#: (``write_modes.fold``), or makes it a dead letter (the table keeps its rows)
TruncateMode = Literal["apply", "dead_letter"]

#: Debezium's placeholder for a value a change does not carry (``unavailable.value.placeholder``)
UNAVAILABLE_VALUE = "__debezium_unavailable_value"

#: Where dead letters are staged and committed: a Delta table of its own inside the table's
#: folder. Its leading ``_`` hides it from the main table's vacuum; the main table's log
#: never names its files, so readers of the main table never see them.
DEAD_LETTER_DIR = "_dead_letters"

#: Prefix of the columns rayconnect adds; a decoded field may not start with it.
KAFKA_PREFIX = "_kafka_"


class RecordFormat(msgspec.Struct, frozen=True):
    """The decoding of one source. ``value_format="raw"`` (default) keeps today's raw table
    (cluster, topic, partition, offset, timestamp, key, value, headers) unchanged; any other
    format gives a typed table: the decoded fields plus ``_kafka_*`` coordinates."""

    value_format: ValueFormat = "raw"
    key_format: KeyFormat = "raw"
    #: json: column -> type name (``formats.types``); None = inferred from the data
    value_schema: dict[str, Any] | None = None
    #: json with ``value_schema``: the fields it does not name are inferred and become
    #: columns as they appear (schema evolution), the declared ones keep their types - so a
    #: partition column can be declared without freezing the rest. False: ignored
    infer_other_fields: bool = False
    #: key_format json: the key's fields (column -> type name, as ``value_schema``); the
    #: key becomes ``_kafka_key``, a struct of them
    key_schema: dict[str, Any] | None = None
    include_key: bool = False
    include_headers: bool = False
    errors: ErrorPolicy = "stop"
    #: a value longer than this is a bad record (0 = no limit)
    max_value_bytes: int = 0
    #: avro: the writer schema's JSON text (read from ``value_avro_schema``'s .avsc file)
    avro_schema: str | None = None
    #: the table's partition columns (``formats.partitioning``): the sink's ``partition_by``
    partition_by: tuple[str, ...] = ()
    #: where a partitioned table keeps its partition values. False (Delta): in the log and
    #: the Hive folders; files lack the partition columns and a derived one (``day(ts)``) is
    #: a column of the table. True (Iceberg): the table derives them from the files' own
    #: columns (``day(ts)`` from ``ts``'s statistics), so files keep every data column and
    #: derived values only steer which file a row goes to.
    partition_values_in_files: bool = False
    #: a Spark SQL statement over each write's decoded rows (view ``records``), or None;
    #: the pipeline's ``transform`` (``formats.transform``: its rules)
    transform: str | None = None
    #: the transform's output schema (Arrow IPC), from its analysis before start
    transform_schema: bytes | None = None
    #: ``debezium``: each value is a change event and its row is ``after`` (``before`` for
    #: a delete) - ``formats.debezium``; ``none``: the value is the row
    envelope: Envelope = "none"
    #: an upsert table's key columns (the sink's ``key_columns``); empty: append. Rows then
    #: carry whether they delete their key (``formats.upsert_rows``)
    upsert_keys: tuple[str, ...] = ()
    #: an upsert table's truncate events (``envelope: debezium``): the sink's ``truncate``
    truncate: TruncateMode = "apply"
    #: an upsert table's change events (``envelope: debezium``): a text or binary value
    #: equal to this is one the change does not carry - Postgres's unchanged TOAST
    #: (``write_modes.unchanged``: the table's value is kept). None: no placeholder
    unavailable_value: str | None = UNAVAILABLE_VALUE

    def __post_init__(self) -> None:
        require(
            (self.value_format == "avro") == (self.avro_schema is not None),
            "source.value_format avro needs source.value_avro_schema (an .avsc file), and "
            "value_avro_schema needs value_format avro",
        )
        require(self.max_value_bytes >= 0, "source.max_value_bytes must be >= 0")
        if self.value_schema is not None:
            require(
                self.value_format == "json",
                f"source.value_schema is for value_format json, not {self.value_format!r}",
            )
            require(bool(self.value_schema), "source.value_schema is empty")
            try:
                fields = declared_fields(self.value_schema, "source.value_schema")
            except TypeNameError as e:
                raise ConfigError(str(e)) from None
            reserved = [f.name for f in fields if f.name.startswith(KAFKA_PREFIX)]
            require(
                not (self.infer_other_fields and self.transform is not None),
                "source.infer_other_fields cannot take a transform (its statement is analysed "
                "against the columns known before start)",
            )
            require(
                not reserved,
                f"source.value_schema: column names starting with {KAFKA_PREFIX!r} are "
                f"rayconnect's ({reserved})",
            )
        require(
            not self.infer_other_fields or self.value_schema is not None,
            "source.infer_other_fields needs a value_schema (without one every field is "
            "inferred already)",
        )
        require(
            (self.key_format == "json") == (self.key_schema is not None),
            "source.key_format json needs source.key_schema (the key's fields), and "
            "key_schema needs key_format json",
        )
        if self.key_schema is not None:
            require(self.include_key, "source.key_format json needs include_key: true")
            require(bool(self.key_schema), "source.key_schema is empty")
            try:
                declared_fields(self.key_schema, "source.key_schema")
            except TypeNameError as e:
                raise ConfigError(str(e)) from None
        if self.transform is not None:
            require(bool(self.transform.strip()), "transform is empty")
            require(
                self.value_format in ("string", "avro")
                or (self.value_format == "json" and self.value_schema is not None),
                "transform needs rows whose columns are known before start: value_format "
                "string or avro, or json with a value_schema",
            )
        self._check_upsert()
        if self.typed:
            return
        require(not self.partition_by, "sink.partition_by needs a typed source.value_format")
        require(
            not (self.include_key or self.include_headers or self.max_value_bytes),
            "source.include_key/include_headers/max_value_bytes need a value_format other "
            "than raw (the raw table has them all)",
        )
        require(
            self.errors == "stop" and self.key_format == "raw",
            "source.errors/key_format need a value_format other than raw (nothing in a raw "
            "record can be bad)",
        )

    def _check_upsert(self) -> None:
        require(
            self.envelope == "none" or self.value_format == "json",
            f"source.envelope {self.envelope} needs value_format json, not {self.value_format!r}",
        )
        if not self.upsert_keys:
            return
        require(self.typed, "sink.write_mode upsert needs a typed source.value_format")
        require(
            self.transform is None,
            "sink.write_mode upsert cannot take a transform: a filter would keep the old row "
            "of a key whose update it drops, and a rewritten key column misses its deletes "
            "(docs/guides/upserts.md)",
        )
        reserved = [k for k in self.upsert_keys if k.startswith(KAFKA_PREFIX)]
        require(not reserved, f"sink.key_columns: {reserved} are rayconnect's columns, not keys")
        declared = self.declared_schema()
        if declared is not None and not self.infer_other_fields:
            keys = self.key_struct()
            known = set(declared.names) | ({f.name for f in keys} if keys else set())
            unknown = [k for k in self.upsert_keys if k not in known]
            require(
                not unknown,
                f"sink.key_columns: {unknown} are in neither source.value_schema nor "
                "source.key_schema",
            )

    @property
    def typed(self) -> bool:
        """Whether rows are decoded (False: today's raw table)."""
        return self.value_format != "raw"

    def transform_output(self) -> pa.Schema | None:
        """The transform's output schema as analysed (None: no transform, or not yet)."""
        if self.transform_schema is None:
            return None
        return pa.ipc.read_schema(pa.py_buffer(self.transform_schema))

    def key_struct(self) -> pa.StructType | None:
        """The type of ``_kafka_key`` with key_format json, else None."""
        if self.key_schema is None:
            return None
        return pa.struct(declared_fields(self.key_schema, "source.key_schema"))

    def declared_schema(self) -> pa.Schema | None:
        """The declared value columns (json with ``value_schema``), else None."""
        if self.value_schema is None:
            return None
        return pa.schema(declared_fields(self.value_schema, "source.value_schema"))


def typed_format(fmt: RecordFormat | None) -> RecordFormat | None:
    """``fmt`` if rows are decoded into typed columns (a table whose schema may grow), None
    for a raw table: one test, so the type checker knows the format is there when typed."""
    return fmt if fmt is not None and fmt.typed else None
