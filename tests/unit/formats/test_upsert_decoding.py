"""An upsert table's blocks decoded without IO: each row's key and delete flag, from plain
records (a tombstone deletes, its key from the record key) and from Debezium change events
(tombstones skipped without a dead letter), and the changes that cannot apply as dead
letters with their reason; the settings that cannot work refused before start."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from test_json_decoding import dead_letters_by_offset, raw

from rayconnect.errors import ConfigError
from rayconnect.formats.partitioning import split
from rayconnect.formats.rows import BadRecordError, decode_block, partition_specs
from rayconnect.formats.settings import RecordFormat
from rayconnect.protocol.truncate_marker import PARTITION_TRUNCATE_HEADERS, TRUNCATE_HEADER
from rayconnect.write_modes.fold import (
    DELETE_COLUMN,
    LSN_COLUMN,
    PARTITION_TRUNCATE_COLUMN,
    TRUNCATE_COLUMN,
)

KEYED = dict(
    value_format="json",
    key_format="json",
    key_schema={"id": "long"},
    include_key=True,
    errors="dead_letter",
    upsert_keys=("id",),
)


def _rows(block) -> list[tuple]:
    return [
        (r["_kafka_offset"], r["id"], r.get("v"), r[DELETE_COLUMN]) for r in block.rows.to_pylist()
    ]


def _raw_keyed(items: list[tuple[bytes | None, bytes | None]]) -> pa.Table:
    table = raw([v for _, v in items])
    return table.set_column(
        table.column_names.index("key"), "key", pa.array([k for k, _ in items], pa.binary())
    )


def test_plain_records_upsert_and_a_tombstone_deletes_the_key_the_record_key_names():
    block = decode_block(
        _raw_keyed(
            [
                (b'{"id":1}', b'{"id":1,"v":"a"}'),
                (b'{"id":2}', None),  # tombstone: the key from the record key
                (b'{"id":3}', b'{"v":"c"}'),  # the row lacks its key: the record key's
            ]
        ),
        RecordFormat(**KEYED),
        None,
    )
    assert _rows(block) == [(0, 1, "a", False), (1, 2, None, True), (2, 3, "c", False)]
    assert block.dead_letters.num_rows == 0


def test_a_change_with_no_key_anywhere_is_a_dead_letter_with_the_reason():
    fmt = RecordFormat(value_format="json", errors="dead_letter", upsert_keys=("id",))
    block = decode_block(raw([b'{"id":1,"v":"a"}', b'{"v":"b"}', None]), fmt, None)
    assert _rows(block) == [(0, 1, "a", False)]
    assert block.dead_letters.column("_kafka_offset").to_pylist() == [1, 2]
    assert set(block.dead_letters.column("reason").to_pylist()) == {
        "key column(s) ['id']: not all in the row or the record key"
    }
    with pytest.raises(BadRecordError, match="key column"):
        decode_block(
            raw([b'{"v":"b"}']), RecordFormat(value_format="json", upsert_keys=("id",)), None
        )


def test_debezium_events_become_rows_and_deletes_and_tombstones_change_nothing():
    events = [
        {"op": "r", "after": {"id": 1, "v": "a"}},
        {"op": "u", "before": None, "after": {"id": 1, "v": "b"}},
        {"op": "d", "before": {"id": 1, "v": None}, "after": None},
        None,  # Debezium's tombstone after the delete
        {"op": "c", "after": {"v": "no id"}},
        {"op": "q", "after": {"id": 5}},
    ]
    fmt = RecordFormat(
        value_format="json", envelope="debezium", errors="dead_letter", upsert_keys=("id",)
    )
    block = decode_block(
        raw([None if e is None else json.dumps(e).encode() for e in events]), fmt, None
    )
    assert _rows(block) == [(0, 1, "a", False), (1, 1, "b", False), (2, 1, None, True)]
    assert dead_letters_by_offset(block) == {
        4: "key column(s) ['id']: not all in the row or the record key",
        5: "debezium envelope: op must be one of c, r, u, d, not 'q'",
    }


@pytest.mark.parametrize("truncate", ["apply", "dead_letter"])
def test_a_debezium_truncate_is_a_keyless_change_or_a_dead_letter(truncate: str):
    events = [
        {"op": "c", "after": {"id": 1, "v": "a"}},
        {"op": "t", "before": None, "after": None, "source": {"table": "t"}},
        {"op": "c", "after": {"id": 2, "v": "b"}},
    ]
    fmt = RecordFormat(
        **dict(KEYED, envelope="debezium"),
        truncate=truncate,  # type: ignore[arg-type]
    )
    block = decode_block(raw([json.dumps(e).encode() for e in events], key=b'{"id":1}'), fmt, None)
    rows = block.rows.to_pylist()
    if truncate == "apply":
        assert [(r["_kafka_offset"], r[TRUNCATE_COLUMN]) for r in rows] == [
            (0, False),
            (1, True),
            (2, False),
        ]
        assert rows[1]["v"] is None and block.dead_letters.num_rows == 0
    else:
        assert [r["_kafka_offset"] for r in rows] == [0, 2]
        assert TRUNCATE_COLUMN not in block.rows.column_names
        assert block.dead_letters.column("reason").to_pylist() == [
            "debezium envelope: op 't' (truncate/message) changes no row by key "
            "(truncate: dead_letter)"
        ]


def test_a_truncate_with_rayconnects_header_truncates_its_partition_other_headers_the_table():
    truncate = b'{"op":"t","before":null,"after":null,"source":{"lsn":9}}'
    values = raw([truncate, truncate, truncate, b'{"op":"c","after":{"id":1}}'], key=b'{"id":1}')
    marker = [{"key": k, "value": v} for k, v in PARTITION_TRUNCATE_HEADERS]
    headers = [marker, [{"key": TRUNCATE_HEADER, "value": b"other"}], [], marker[:0]]
    values = values.set_column(
        values.column_names.index("headers"),
        values.schema.field("headers"),
        pa.array(headers, values.schema.field("headers").type),
    )
    block = decode_block(values, RecordFormat(**dict(KEYED, envelope="debezium")), None)
    rows = block.rows
    assert rows.column(PARTITION_TRUNCATE_COLUMN).to_pylist() == [True, False, False, False]
    assert rows.column(TRUNCATE_COLUMN).to_pylist() == [False, True, True, False]
    assert block.dead_letters.num_rows == 0
    only_marker = decode_block(
        values.slice(0, 1), RecordFormat(**dict(KEYED, envelope="debezium")), None
    )
    assert TRUNCATE_COLUMN not in only_marker.rows.column_names


def test_each_events_source_lsn_is_kept_to_order_truncates_unless_dead_lettered():
    events = [
        {"op": "c", "after": {"id": 1}, "source": {"lsn": 7, "table": "t"}},
        {"op": "c", "after": {"id": 2}},
    ]
    values = raw([json.dumps(e).encode() for e in events], key=b'{"id":1}')
    block = decode_block(values, RecordFormat(**dict(KEYED, envelope="debezium")), None)
    assert block.rows.column(LSN_COLUMN).to_pylist() == [7, None]
    kept = RecordFormat(**dict(KEYED, envelope="debezium"), truncate="dead_letter")
    assert LSN_COLUMN not in decode_block(values, kept, None).rows.column_names


def test_a_block_of_a_truncate_alone_keeps_no_untyped_key_column():
    fmt = RecordFormat(
        value_format="json", envelope="debezium", errors="dead_letter", upsert_keys=("id",)
    )
    block = decode_block(raw([b'{"op":"t","before":null,"after":null}']), fmt, None)
    assert block.rows.column(TRUNCATE_COLUMN).to_pylist() == [True]
    assert "id" not in block.rows.column_names and block.dead_letters.num_rows == 0


def test_append_tables_are_unchanged_by_the_upsert_path():
    block = decode_block(raw([b'{"id":1}', None]), RecordFormat(value_format="json"), None)
    assert DELETE_COLUMN not in block.rows.column_names and block.rows.num_rows == 2


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            dict(value_format="avro", avro_schema="{}", envelope="debezium", upsert_keys=("id",)),
            "needs value_format json",
        ),
        (dict(value_format="raw", upsert_keys=("id",)), "typed"),
        (dict(value_format="json", upsert_keys=("_kafka_offset",)), "rayconnect's columns"),
        (dict(value_format="json", value_schema={"v": "string"}, upsert_keys=("id",)), "neither"),
    ],
)
def test_settings_an_upsert_table_cannot_take_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        RecordFormat(**settings)


@pytest.mark.parametrize("values_in_files", [False, True])
def test_a_partitioned_upsert_tables_change_files_are_unsplit_with_their_partition_values(
    values_in_files: bool,
):
    """The committer reads a round's change files back and its MERGE writes the partitions:
    a file holds every partition value (a key that moved must carry its new one); the
    derived ``day`` column too where the table has it (Delta), not where the table derives
    it from ``ts`` (Iceberg)."""
    fmt = RecordFormat(
        **dict(KEYED, value_schema={"id": "long", "region": "string", "ts": "timestamp"}),
        partition_by=("region", "day=day(ts)"),
        partition_values_in_files=values_in_files,
    )
    values = [
        b'{"id":1,"region":"north","ts":"2024-05-01T23:00:00Z"}',
        b'{"id":2,"region":"south","ts":"2024-05-02T01:00:00Z"}',
        None,
    ]
    rows = decode_block(raw(values, key=b'{"id":1}'), fmt, None).rows
    pieces = split(rows, partition_specs(fmt), values_in_files, whole=True)
    assert [folder for folder, _ in pieces] == [""]
    staged = pieces[0][1]
    assert staged.column("region").to_pylist() == ["north", "south", None]
    assert staged.column(DELETE_COLUMN).to_pylist() == [False, False, True]
    assert ("day" in staged.column_names) is not values_in_files
    if not values_in_files:
        assert [str(d) for d in staged.column("day").to_pylist()[:2]] == [
            "2024-05-01",
            "2024-05-02",
        ]
