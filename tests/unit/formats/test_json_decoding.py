"""The JSON decoder and the typed rows of a block, without IO: exact columns, exact bad
records, the ``_kafka_*`` coordinates, and the evolution rules the committer applies."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from rayconnect.errors import ConfigError
from rayconnect.formats.evolution import compatible, merge
from rayconnect.formats.json import JsonDecoder, _ndjson
from rayconnect.formats.rows import (
    DEAD_LETTER_SCHEMA,
    BadRecordError,
    DecodedBlock,
    decode_block,
    initial_schema,
)
from rayconnect.formats.settings import RecordFormat
from rayconnect.formats.string import StringDecoder
from rayconnect.schema import RAW_RECORD_SCHEMA

UTC = dt.UTC


def raw(values: list[bytes | None], start: int = 0, key: bytes | None = b"k") -> pa.Table:
    n = len(values)
    return pa.Table.from_pydict(
        {
            "cluster": ["c"] * n,
            "topic": ["t"] * n,
            "partition": [3] * n,
            "offset": list(range(start, start + n)),
            "timestamp": [1_700_000_000_000_000] * n,
            "key": [key] * n,
            "value": values,
            "headers": [[]] * n,
        },
        schema=RAW_RECORD_SCHEMA,
    )


def dead_letters_by_offset(block: DecodedBlock) -> dict[int, str]:
    """A decoded block's dead letters: offset -> reason."""
    letters = block.dead_letters
    return dict(
        zip(
            letters.column("_kafka_offset").to_pylist(),
            letters.column("reason").to_pylist(),
            strict=True,
        )
    )


def test_ndjson_joins_values_and_blanks_newlines_inside_them() -> None:
    values = pa.array([b'{"a":\n1}', b"", b'{"b":2}'], pa.binary()).slice(0)
    assert _ndjson(values).to_pybytes() == b'{"a": 1}\n\n{"b":2}\n'
    sliced = pa.array([b"x", b'{"a":1}', b"{}"], pa.binary()).slice(1)
    assert _ndjson(sliced).to_pybytes() == b'{"a":1}\n{}\n'


def test_inferred_nested_types_and_tombstones() -> None:
    values = pa.array(
        [b'{"id":1,"tags":["a"],"addr":{"city":"X"}}', None, b'{"id":2,"score":1.5}'],
        pa.binary(),
    )
    out = JsonDecoder().decode(values, None)
    assert out.bad == {}
    assert out.columns.schema.field("tags").type == pa.list_(pa.string())
    assert out.columns.schema.field("addr").type == pa.struct([("city", pa.string())])
    assert out.columns.to_pylist() == [
        {"id": 1, "tags": ["a"], "addr": {"city": "X"}, "score": None},
        {"id": None, "tags": None, "addr": None, "score": None},
        {"id": 2, "tags": None, "addr": None, "score": 1.5},
    ]


def test_declared_schema_timestamps_iso_and_epoch_millis() -> None:
    fmt = RecordFormat(
        value_format="json",
        value_schema={"id": "long", "at": "timestamp", "ms": "timestamp_millis", "n": "int"},
    )
    values = pa.array(
        [b'{"id":1,"at":"2024-05-01T10:00:00Z","ms":1714557600000,"n":7,"extra":"x"}'],
        pa.binary(),
    )
    out = JsonDecoder(fmt.declared_schema()).decode(values, None)
    assert out.bad == {}
    at = dt.datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert out.columns.to_pylist() == [{"id": 1, "at": at, "ms": at, "n": 7}]  # extra ignored
    assert out.columns.schema.field("n").type == pa.int32()


def test_bad_records_are_named_and_the_rest_decoded_in_order() -> None:
    table = pa.schema([("id", pa.int64())])
    values = pa.array(
        [b'{"id":1}', b"\xff garbage", b'{"id":"not a number"}', b"", b"[1,2]", b'{"id":5}'],
        pa.binary(),
    )
    out = JsonDecoder().decode(values, table)
    assert sorted(out.bad) == [1, 2, 3, 4]
    assert out.bad[3] == "empty value"
    assert out.columns.column("id").to_pylist() == [1, 5]


def test_new_fields_disagreeing_within_a_block_first_type_wins() -> None:
    values = pa.array([b'{"x":1}', b'{"x":"one"}', b'{"x":2}'], pa.binary())
    out = JsonDecoder().decode(values, None)
    assert list(out.bad) == [1] and "conflicts" in out.bad[1]
    assert out.columns.column("x").to_pylist() == [1, 2]


def test_string_decoder_names_invalid_utf8() -> None:
    out = StringDecoder().decode(pa.array([b"ok", b"\xff", None], pa.binary()), None)
    assert list(out.bad) == [1]
    assert out.columns.column("value").to_pylist() == ["ok", None]


def test_rows_have_kafka_coordinates_and_dead_letters_keep_raw_bytes() -> None:
    fmt = RecordFormat(
        value_format="json", errors="dead_letter", include_key=True, key_format="string"
    )
    block = decode_block(raw([b'{"a":1}', b"bad", b'{"a":2,"b":"x"}'], start=10), fmt, None)
    assert block.rows.column_names[:6] == [
        "_kafka_cluster",
        "_kafka_topic",
        "_kafka_partition",
        "_kafka_offset",
        "_kafka_timestamp",
        "_kafka_key",
    ]
    assert block.rows.column("_kafka_offset").to_pylist() == [10, 12]
    assert block.rows.column("_kafka_key").to_pylist() == ["k", "k"]
    assert block.rows.column("b").to_pylist() == [None, "x"]
    assert block.dead_letters.schema == DEAD_LETTER_SCHEMA
    dead = block.dead_letters.to_pylist()
    assert [(d["_kafka_offset"], d["value"], d["key"]) for d in dead] == [(11, b"bad", b"k")]
    assert "JSON" in dead[0]["reason"]


def test_stop_policy_raises_with_the_first_bad_offset() -> None:
    fmt = RecordFormat(value_format="json")
    with pytest.raises(BadRecordError) as err:
        decode_block(raw([b'{"a":1}', b"nope", b"nope"], start=40), fmt, None)
    assert (err.value.key, err.value.offset) == ("c/t/3", 41)
    again = BadRecordError.from_text(str(err.value))
    assert (again.key, again.offset, again.reason) == ("c/t/3", 41, err.value.reason)


def test_rows_conform_to_the_table_columns_and_types() -> None:
    fmt = RecordFormat(value_format="json", errors="dead_letter")
    table = pa.schema(list(initial_schema(fmt)) + [("old", pa.string()), ("n", pa.float64())])
    block = decode_block(raw([b'{"n":1,"new":true}', b'{"n":"x"}']), fmt, table)
    assert block.rows.schema.names[-3:] == ["old", "n", "new"]
    assert block.rows.schema.field("n").type == pa.float64()
    assert block.rows.column("n").to_pylist() == [1.0]
    assert block.dead_letters.column("_kafka_offset").to_pylist() == [1]


def test_reserved_prefix_in_the_data_is_a_bad_record() -> None:
    fmt = RecordFormat(value_format="json", errors="dead_letter")
    block = decode_block(raw([b'{"a":1}', b'{"_kafka_offset":9}']), fmt, None)
    assert block.rows.column("_kafka_offset").to_pylist() == [0]
    assert block.dead_letters.column("_kafka_offset").to_pylist() == [1]


def test_max_value_bytes() -> None:
    fmt = RecordFormat(value_format="string", errors="dead_letter", max_value_bytes=3)
    block = decode_block(raw([b"abc", b"abcd", None]), fmt, None)
    assert block.rows.column("value").to_pylist() == ["abc", None]
    assert "max_value_bytes" in block.dead_letters.column("reason")[0].as_py()


def test_evolution_rules() -> None:
    table = pa.schema([("a", pa.int64()), ("f", pa.float64()), ("s", pa.string())])
    merged, conflicts = merge(table, pa.schema([("a", pa.int32()), ("z", pa.bool_())]))
    assert conflicts == [] and merged.names == ["a", "f", "s", "z"]
    assert merge(table, pa.schema([("s", pa.int64())]))[1] == [
        "column 's' is int64 in the data, string in the table"
    ]
    assert compatible(pa.float32(), pa.float64()) and not compatible(pa.int64(), pa.int32())
    assert merge(table, pa.schema([("n", pa.null())]))[0] == table  # no type: nothing added


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"value_format": "json", "value_schema": {"a": "lng"}}, "unknown type 'lng'"),
        ({"value_format": "string", "value_schema": {"a": "long"}}, "for value_format json"),
        ({"value_format": "json", "value_schema": {"_kafka_x": "long"}}, "rayconnect's"),
        ({"errors": "dead_letter"}, "other than raw"),
        ({"value_format": "avro"}, "needs source.value_avro_schema"),
    ],
)
def test_format_settings_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RecordFormat(**settings)


def test_partition_specs_derived_columns_and_folders() -> None:
    from rayconnect.formats.partitioning import split, values_of
    from rayconnect.formats.rows import partition_specs

    fmt = RecordFormat(
        value_format="json",
        value_schema={"country": "string", "at": "timestamp"},
        errors="dead_letter",
        partition_by=("day=day(at)", "country"),
    )
    assert [(s.name, s.source, s.transform) for s in partition_specs(fmt)] == [
        ("day", "at", "day"),
        ("country", "country", "identity"),
    ]
    assert initial_schema(fmt).field("day").type == pa.date32()
    block = decode_block(
        raw(
            [
                b'{"country":"DE","at":"2026-11-23T23:59:00Z"}',
                b'{"country":"DE","at":"2026-11-24T00:00:00Z"}',
                b'{"at":"2026-11-24T01:00:00Z"}',
                b'{"country":"a/b"}',
            ]
        ),
        fmt,
        None,
    )
    parts = {folder: rows for folder, rows in split(block.rows, partition_specs(fmt))}
    assert sorted(parts) == [
        "day=2026-11-23/country=DE",
        "day=2026-11-24/country=DE",
        "day=2026-11-24/country=__HIVE_DEFAULT_PARTITION__",
        "day=__HIVE_DEFAULT_PARTITION__/country=a%2Fb",
    ]
    assert all(
        "day" not in t.column_names and "country" not in t.column_names for t in parts.values()
    )
    assert values_of(
        "staging/x/_rc_group=0/day=__HIVE_DEFAULT_PARTITION__/country=a%2Fb/p.parquet"
    ) == {
        "day": None,
        "country": "a/b",
    }


@pytest.mark.parametrize(
    ("partition_by", "message"),
    [
        (("nope",), "no column 'nope'"),
        (("d=day(name)",), "not a timestamp"),
        (("at",), "cannot be a partition"),
        (("d=week(at)",), "neither a column"),
    ],
)
def test_partition_by_is_checked(partition_by: tuple[str, ...], message: str) -> None:
    from rayconnect.formats.rows import partition_specs

    fmt = RecordFormat(
        value_format="json",
        value_schema={"name": "string", "at": "timestamp"},
        partition_by=partition_by,
    )
    with pytest.raises(ConfigError, match=message):
        partition_specs(fmt)


def test_a_struct_that_gained_a_field_is_a_bad_record_not_a_failed_commit() -> None:
    fmt = RecordFormat(value_format="json", errors="dead_letter")
    table = pa.schema(list(initial_schema(fmt)) + [("a", pa.struct([("x", pa.int64())]))])
    block = decode_block(raw([b'{"a":{"x":1}}', b'{"a":{"x":2,"y":"new"}}']), fmt, table)
    assert block.rows.column("a").to_pylist() == [{"x": 1}]
    assert "in the table" in block.dead_letters.column("reason")[0].as_py()


def test_derived_partition_column_in_the_table_is_not_decoded_twice() -> None:
    fmt = RecordFormat(
        value_format="json", errors="dead_letter", partition_by=("day=day(_kafka_timestamp)",)
    )
    table = initial_schema(fmt)
    block = decode_block(raw([b'{"v":1}', b'{"day":"x"}']), fmt, table)
    assert block.rows.column_names.count("day") == 1
    assert block.rows.column("v").to_pylist() == [1]
    assert "derived partition column" in block.dead_letters.column("reason")[0].as_py()


def test_partitions_on_raw_are_refused_and_iceberg_keeps_values_in_files(tmp_path) -> None:
    import rayconnect as rc

    meta = rc.StaticMetadataService(
        (rc.KafkaStream("s", {"c": rc.ClusterMetadata("x:1", ("t",))}),)
    )
    iceberg = rc.IcebergSink(
        "db.t", warehouse=str(tmp_path), partition_by=("d=day(_kafka_timestamp)",)
    )
    fmt = rc.SinkPipeline(
        "p", rc.KafkaSource(meta, value_format="json"), iceberg
    ).config.record_format()
    assert fmt.partition_values_in_files and fmt.partition_by == ("d=day(_kafka_timestamp)",)
    assert "d" not in initial_schema(fmt).names  # Iceberg derives it from _kafka_timestamp
    with pytest.raises(ConfigError, match="partition_by needs a typed"):
        rc.SinkPipeline("p", rc.KafkaSource(meta), iceberg)
    raw_parted = rc.DeltaSink(str(tmp_path / "t"), partition_by=("_kafka_partition",))
    with pytest.raises(ConfigError, match="partition_by needs a typed"):
        rc.SinkPipeline("p", rc.KafkaSource(meta), raw_parted)
    ok = rc.DeltaSink(str(tmp_path / "t"), partition_by=("d=hour(_kafka_timestamp)",))
    pipeline = rc.SinkPipeline("p", rc.KafkaSource(meta, value_format="string"), ok)
    assert pipeline.config.record_format().partition_by == ("d=hour(_kafka_timestamp)",)
    assert "d" in initial_schema(pipeline.config.record_format()).names  # a Delta column


def test_json_keys_become_a_struct_and_a_bad_key_makes_its_record_bad() -> None:
    fmt = RecordFormat(
        value_format="json",
        value_schema={"a": "long"},
        key_format="json",
        key_schema={"tenant": "string", "id": "long"},
        include_key=True,
        errors="dead_letter",
    )
    block = raw([b'{"a":1}', b'{"a":2}', b'{"a":3}', b"bad"])
    keys = [b'{"tenant":"x","id":7}', b"not json", b'{"id":9}', b'{"tenant":"y","id":1}']
    block = block.set_column(5, "key", pa.array(keys, pa.binary()))
    out = decode_block(block, fmt, initial_schema(fmt))
    assert initial_schema(fmt).field("_kafka_key").type == pa.struct(
        [("tenant", pa.string()), ("id", pa.int64())]
    )
    assert out.rows.column("_kafka_key").to_pylist() == [
        {"tenant": "x", "id": 7},
        {"tenant": None, "id": 9},
    ]
    assert out.rows.column("a").to_pylist() == [1, 3]
    dead = out.dead_letters.to_pylist()
    assert [d["_kafka_offset"] for d in dead] == [1, 3]
    assert dead[0]["reason"].startswith("key: ") and dead[0]["key"] == b"not json"
    assert not dead[1]["reason"].startswith("key: ")  # a good key, a bad value


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"key_format": "json", "include_key": True}, "needs source.key_schema"),
        ({"key_schema": {"id": "long"}, "include_key": True}, "key_schema needs key_format json"),
        ({"key_format": "json", "key_schema": {"id": "long"}}, "needs include_key"),
        ({"key_format": "json", "key_schema": {"id": "lng"}, "include_key": True}, "lng"),
    ],
)
def test_json_key_settings_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RecordFormat(value_format="string", **settings)


def test_declared_columns_keep_their_types_and_other_fields_are_inferred() -> None:
    """``infer_other_fields``: a declared partition column, the rest of the schema evolving."""
    from rayconnect.formats.rows import partition_specs

    fmt = RecordFormat(
        value_format="json",
        value_schema={"id": "long", "region": "string"},
        infer_other_fields=True,
        partition_by=("region",),
        errors="dead_letter",
    )
    assert [s.name for s in partition_specs(fmt)] == ["region"]
    first = decode_block(raw([b'{"id": 1, "region": "n", "x": 2.5}']), fmt, None)
    table = first.rows.schema
    assert [(f.name, f.type) for f in table if not f.name.startswith("_kafka_")] == [
        ("id", pa.int64()),
        ("region", pa.string()),
        ("x", pa.float64()),
    ]
    later = decode_block(
        raw([b'{"id": "2"}', b'{"id": 3, "x": "s"}', b'{"id": 4, "y": true, "x": 1}'], start=1),
        fmt,
        table,
    )
    assert later.rows.select(["id", "x", "y"]).to_pylist() == [{"id": 4, "x": 1.0, "y": True}]
    assert later.dead_letters.column("_kafka_offset").to_pylist() == [1, 2]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(infer_other_fields=True), "needs a value_schema"),
        (
            dict(value_schema={"id": "long"}, infer_other_fields=True, transform="SELECT 1"),
            "cannot take a transform",
        ),
    ],
)
def test_infer_other_fields_settings_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RecordFormat(value_format="json", **settings)


def test_a_partition_column_of_an_inferred_schema_asks_for_its_type() -> None:
    from rayconnect.formats.rows import partition_specs

    with pytest.raises(ConfigError, match="declare its type.*infer_other_fields"):
        partition_specs(RecordFormat(value_format="json", partition_by=("region",)))
