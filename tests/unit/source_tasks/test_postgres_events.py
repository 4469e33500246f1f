"""The pure parts of the Postgres source: pgoutput messages captured from a real Postgres 15
(a transaction inserting a row with a TOASTed text, updating only its numeric to NaN - the
text then comes as 'unchanged' - and deleting it), values as JSON, change events and the
snapshot/stream progress that makes restarts exactly once."""

from __future__ import annotations

import json

import msgspec
import pytest

from rayconnect.errors import ConfigError
from rayconnect.protocol.unchanged_marker import UNCHANGED_HEADER
from rayconnect.source_tasks.postgres import PostgresSettings
from rayconnect.source_tasks.postgres.events import (
    UNAVAILABLE_VALUE,
    EventBuilder,
    RowCodec,
    TableShape,
    key_values,
)
from rayconnect.source_tasks.postgres.pgoutput import (
    Begin,
    Column,
    Commit,
    Delete,
    Relation,
    Unchanged,
    Update,
    decode,
    format_lsn,
    ms_of,
    parse_lsn,
)
from rayconnect.source_tasks.postgres.progress import Progress, Segment
from rayconnect.source_tasks.postgres.values import json_encoder

# CREATE TABLE t (id int PRIMARY KEY, big text, n numeric, ok bool); BEGIN; INSERT (1, 9.6 kB
# of md5 hex, 1.50, true); UPDATE t SET n = 'NaN'; DELETE; COMMIT - as pgoutput v1 sent it
BEGIN = "42000000000152bc6800030437930880f6000002d6"
RELATION = (
    "52000040007075626c69630074006400040169640000000017ffffffff006269670000000019ffffffff"
    "006e00000006a4ffffffff006f6b0000000010ffffffff"
)
UPDATE = "55000040004e00047400000001317574000000034e614e740000000174"
DELETE = "44000040004b00047400000001316e6e6e"
COMMIT = "4300000000000152bc68000000000152bc9800030437930880f6"

COLUMNS = (
    Column("id", 23, -1, True),
    Column("big", 25, -1, False),
    Column("n", 1700, -1, False),
    Column("ok", 16, -1, False),
)


def test_decodes_a_captured_transaction() -> None:
    begin = decode(bytes.fromhex(BEGIN))
    assert begin == Begin(final_lsn=0x152BC68, commit_ts_us=begin.commit_ts_us, xid=726)
    assert decode(bytes.fromhex(RELATION)) == Relation(16384, "public", "t", "d", COLUMNS)
    update = decode(bytes.fromhex(UPDATE))
    assert update == Update(16384, (b"1", Unchanged.TOAST, b"NaN", b"t"))
    assert decode(bytes.fromhex(DELETE)) == Delete(16384, (b"1", None, None, None), old_is_key=True)
    commit = decode(bytes.fromhex(COMMIT))
    assert commit == Commit(0x152BC68, 0x152BC98, begin.commit_ts_us)
    assert ms_of(commit.commit_ts_us) == 1795746466652  # 2026-11-27 02:27:46.652 UTC, captured


def test_unknown_and_binary_messages_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown message kind 'Z'"):
        decode(b"Z")
    with pytest.raises(ValueError, match="binary"):
        decode(bytes.fromhex("49000040004e0001") + b"b")


def test_lsn_text_round_trip() -> None:
    assert format_lsn(0x16B374D848) == "16/B374D848"
    assert parse_lsn("16/B374D848") == 0x16B374D848


@pytest.mark.parametrize(
    ("oid", "text", "value"),
    [
        (23, "-7", -7),
        (20, "9007199254740993", 9007199254740993),
        (16, "t", True),
        (16, "false", False),  # bool::text, as the snapshot reads it
        (701, "1.5", 1.5),
        (701, "Infinity", "Infinity"),
        (1700, "NaN", "NaN"),
        (1114, "2024-01-02 03:04:05.25", "2024-01-02T03:04:05.25"),
        (1184, "2024-01-02 03:04:05+00", "2024-01-02T03:04:05Z"),
        (17, "\\x00ff", "AP8="),
        (25, "ü", "ü"),
        (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        (1700, "-0.5", "-0.5"),  # unconstrained numeric: a string, every digit
        (700, "-Infinity", "-Infinity"),
        (701, "1e+20", 1e20),
        (25, 'a "quoted"\\ \n', 'a "quoted"\\ \n'),
    ],
)
def test_values_are_typed_by_column_type(oid: int, text: str, value: object) -> None:
    assert msgspec.json.decode(json_encoder(oid)(text.encode())) == value


def _events(builder: EventBuilder, shape: TableShape, *changes: tuple) -> list:
    source = builder.source(shape, lsn=0x10, txid=5, commit_ms=7, snapshot=False)
    out = []
    for n, (op, before, after, key) in enumerate(changes):
        out += builder.records(
            shape, op, before, after, key, source=source, now_ms=9,
            offset={"lsn": 16, "n": n}, source_partition={"postgres": "s"},
        )  # fmt: skip
    return out


def test_change_events_are_debezium_shaped_with_exact_numerics() -> None:
    shape = TableShape("public", "t", COLUMNS, ("id",))
    codec = RowCodec(shape)
    builder = EventBuilder("pg", lambda s, t: f"pg.{s}.{t}", True, "db")
    cells = (b"1", b"x", b"12345678901234567890.01", b"t")
    key = codec.key(cells)
    (update,) = _events(builder, shape, ("u", None, codec.row(cells), key))
    assert update.topic == "pg.public.t" and update.key == b'{"id":1}'
    # unconstrained numeric: a JSON string of every digit (column_types: a string column)
    assert b'"n":"12345678901234567890.01"' in update.value
    event = json.loads(update.value)
    assert event["op"] == "u" and event["before"] is None and event["ts_ms"] == 9
    assert event["after"] == {"id": 1, "big": "x", "n": "12345678901234567890.01", "ok": True}
    assert event["source"] == {
        "connector": "postgresql", "name": "pg", "db": "db", "schema": "public", "table": "t",
        "lsn": 16, "lsn_text": "0/10", "txId": 5, "ts_ms": 7, "snapshot": "false",
    }  # fmt: skip
    old_key = (b"1", None, None, None)  # an old key tuple ('K'): the other columns are not null
    delete, tombstone = _events(builder, shape, ("d", codec.identity(old_key), None, key))
    assert json.loads(delete.value)["before"] == {"id": 1}
    assert tombstone.key == b'{"id":1}' and tombstone.value is None
    assert key_values(key) == [1] and key_values(None) is None


def test_an_unchanged_toasted_value_is_never_claimed_null() -> None:
    """pgoutput leaves it out ('u'): taken from the whole old row if Postgres sent one
    (REPLICA IDENTITY FULL), else the placeholder - a null would say it was cleared."""
    codec = RowCodec(TableShape("public", "t", COLUMNS, ("id",)))
    new = (b"1", Unchanged.TOAST, b"NaN", b"t")
    assert json.loads(codec.row(new)) == {"id": 1, "big": UNAVAILABLE_VALUE, "n": "NaN", "ok": True}
    old = (b"1", b"long text", b"1.50", b"t")
    assert json.loads(codec.row(new, old))["big"] == "long text"
    assert json.loads(RowCodec(codec.shape, "?").row(new))["big"] == "?"
    # the header names it, whatever its type (a typed column cannot hold the placeholder)
    named = dict(codec.unchanged(new))
    assert json.loads(named[UNCHANGED_HEADER]) == ["big"]
    assert codec.unchanged(new, old) == codec.headers  # FULL: every value is in the row
    assert UNCHANGED_HEADER not in dict(codec.unchanged(old))


def test_a_table_without_a_key_keeps_order_in_partition_0() -> None:
    shape = TableShape("public", "log", COLUMNS, ())
    builder = EventBuilder("pg", lambda s, t: f"pg.{s}.{t}", True, "db")
    row = RowCodec(shape).row((b"1", None, None, None))
    assert RowCodec(shape).key((b"1", None, None, None)) is None
    records = _events(builder, shape, ("d", row, None, None))
    assert [(r.key, r.partition) for r in records] == [(None, 0)]  # no tombstone without key


def test_segments_skip_what_each_snapshot_already_holds() -> None:
    """Table read at 100 up to key 50, then (after a restart) at 300 from key 50 on."""
    p = Progress(table=0)
    p.begin_segment("public.t", 100)
    p.after = [50]
    p.begin_segment("public.t", 300)
    assert p.segments["public.t"] == [Segment(None, 100), Segment([50], 300)]
    assert p.in_snapshot("public.t", [10], 99) and not p.in_snapshot("public.t", [10], 100)
    assert p.in_snapshot("public.t", [50], 99) and not p.in_snapshot("public.t", [50], 200)
    assert p.in_snapshot("public.t", [51], 299) and not p.in_snapshot("public.t", [51], 300)
    assert not p.in_snapshot("public.other", [1], 0)
    p.begin_segment("public.t", 400)  # restarted again before any row of the last segment
    assert p.segments["public.t"] == [Segment(None, 100), Segment([50], 400)]
    assert Progress.from_offset(p.to_offset()) == p
    assert p.highest_segment_lsn() == 400


def test_restart_skips_what_was_written() -> None:
    p = Progress(lsn=500, n=2)
    assert p.already_written(400, 9) and p.already_written(500, 2)
    assert not p.already_written(500, 3) and not p.already_written(501, 0)


def test_settings_refuse_a_password_in_the_dsn_and_bad_names() -> None:
    with pytest.raises(ConfigError, match="dsn: must not hold the password"):
        PostgresSettings(dsn="host=h password=x", slot="s", tables=["t"])
    with pytest.raises(ConfigError, match="dsn: must not hold the password"):
        PostgresSettings(dsn="postgresql://u:secret@h/db", slot="s", tables=["t"])
    with pytest.raises(ConfigError, match="slot: 'Bad-Slot'"):
        PostgresSettings(dsn="host=h", slot="Bad-Slot", tables=["t"])
    with pytest.raises(ConfigError, match="tables: name the tables"):
        PostgresSettings(dsn="host=h", slot="s")
    with pytest.raises(ConfigError, match="topic_template"):
        PostgresSettings(dsn="host=h", slot="s", tables=["t"], topic_template="{nope}")
    s = PostgresSettings(dsn="host=h", slot="s", tables=["t", "x.y"])
    assert s.qualified_tables == [("public", "t"), ("x", "y")]
    assert s.topic("public", "t") == "pg.public.t" and s.publication_name == "s_pub"
