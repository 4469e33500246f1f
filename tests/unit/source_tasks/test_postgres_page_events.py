"""The snapshot's column-at-a-time encoder writes what the row-at-a-time one writes, byte for
byte: random pages of COPY text over many types, with nulls, escapes and the values the
whole-column shortcuts must leave to the per-value path (NaN, BC timestamps, quotes,
control characters)."""

from __future__ import annotations

import random

import pytest

from rayconnect.source_tasks.postgres.copy_text import parse_columns, parse_rows
from rayconnect.source_tasks.postgres.events import RowCodec, TableShape, read_events
from rayconnect.source_tasks.postgres.page_events import PageCodec
from rayconnect.source_tasks.postgres.pgoutput import Column

COLUMNS = (
    Column("id", 20, -1, True),
    Column("n", 23, -1, False),
    Column("x", 701, -1, False),
    Column("d", 1700, -1, False),
    Column("at", 1184, -1, False),
    Column("ts", 1114, -1, False),
    Column("s", 25, -1, False),
    Column("ok", 16, -1, False),
    Column("raw", 17, -1, False),
    Column("xs", 1007, -1, False),
)
SOURCE = b'{"connector":"postgresql","lsn":1,"snapshot":"true"}'


def _value(rng: random.Random, column: Column, nulls: bool, specials: bool) -> str | None:
    if nulls and column.name != "id" and rng.random() < 0.1:
        return None
    special = specials and rng.random() < 0.15
    match column.name:
        case "id" | "n":
            return str(rng.randint(-(10**9), 10**9))
        case "x":
            return (
                rng.choice(["NaN", "Infinity", "-Infinity", "1e+300"])
                if special
                else repr(rng.uniform(-1e6, 1e6))
            )
        case "d":
            return "NaN" if special else f"{rng.randint(-999, 999)}.{rng.randint(0, 99):02d}"
        case "at":
            suffix = " BC" if special else ""
            return f"20{rng.randint(10, 99)}-01-02 03:04:05.{rng.randint(0, 999)}+00{suffix}"
        case "ts":
            return f"2026-01-02 03:04:0{rng.randint(0, 9)}"
        case "s":
            pool = ['"', "\\", "\t", "\n", "\x01", "é", "%", "%b", "\u2028"] if special else ["a"]
            return "".join(rng.choice(pool + ["row ", "x"]) for _ in range(rng.randint(0, 8)))
        case "ok":
            return rng.choice(["true", "false"])
        case "raw":
            return "\\x" + bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))).hex()
        case _:
            return "{" + ",".join(rng.choice(["1", "NULL", "-3"]) for _ in range(3)) + "}"


def _copy_text(rows: list[list[str | None]]) -> bytes:
    """Rows as ``COPY ... TO STDOUT`` writes them (text format)."""

    def field(v: str | None) -> str:
        if v is None:
            return "\\N"
        return (
            v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
        )

    return "".join("\t".join(field(v) for v in row) + "\n" for row in rows).encode()


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("key", [("id",), ("s", "id"), ()])
def test_columns_encode_as_rows_do(seed: int, key: tuple[str, ...]) -> None:
    rng = random.Random(seed)
    columns = COLUMNS[: rng.randint(1, len(COLUMNS))] if seed % 2 else COLUMNS
    if not all(k in {c.name for c in columns} for k in key):
        key = ()
    shape = TableShape("public", "t%", columns, key)
    # whole columns without nulls or special values take the shortcuts
    nulls, specials = seed % 3 != 0, seed % 4 != 0
    rows = [[_value(rng, c, nulls, specials) for c in columns] for _ in range(rng.randint(0, 60))]
    data = _copy_text(rows)
    by_row = read_events(RowCodec(shape), parse_rows(data), SOURCE, 17)
    by_column = PageCodec(shape).events(parse_columns(data, len(columns)), SOURCE, 17)
    assert by_column == by_row


def test_copy_columns_are_the_rows_transposed() -> None:
    rows = [["1", None, "a\\tb"], ["2", "x", ""]]
    data = _copy_text(rows)  # type: ignore[arg-type]
    assert [list(c) for c in parse_columns(data, 3)] == [
        list(c) for c in zip(*parse_rows(data), strict=True)
    ]
    assert parse_columns(b"", 3) == [[], [], []]
