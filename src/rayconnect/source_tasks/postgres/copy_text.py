"""``COPY ... TO STDOUT`` text format back to each column's Postgres text (pure).

The snapshot reads rows in bulk with ``COPY (SELECT ...) TO STDOUT``: one round trip and no
per-row protocol message. Its text format is each column's output text - what ``col::text``
and pgoutput give, so ``values`` encodes it unchanged - with tabs between columns, a newline
after each row, ``\\N`` for null and backslash escapes for ``\\``, tab, newline and the other
control characters. Most values hold no backslash: they are slices of the buffer as is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rayconnect.errors import RayconnectError

_NULL = b"\\N"
_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.DOTALL)
_SIMPLE = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def _unescape_one(match: re.Match[bytes]) -> bytes:
    octal, hexa, char = match.groups()
    if octal is not None:
        return bytes((int(octal, 8) & 0xFF,))
    if hexa is not None:
        return bytes((int(hexa, 16),))
    return _SIMPLE.get(char, char)


def unescape(field: bytes) -> bytes:
    return _ESCAPE.sub(_unescape_one, field)


def parse_columns(data: bytes, width: int) -> list[Sequence[bytes | None]]:
    """Every column of a COPY text output of ``width`` columns, each a list of its rows'
    text (None: null): the whole output split at once, then sliced a column at a time; a
    column holding a backslash (a null or an escape) is unescaped value by value. Tabs and
    newlines inside values are escaped, so every raw one is a separator."""
    if not data:
        return [[] for _ in range(width)]
    cells = data[:-1].replace(b"\n", b"\t").split(b"\t")
    if len(cells) % width:
        raise RayconnectError(f"COPY text: {len(cells)} cells are not rows of {width} columns")
    columns: list[Sequence[bytes | None]] = []
    for i in range(width):
        column = cells[i::width]
        if b"\\" in b"".join(column):
            columns.append(
                [None if f == _NULL else unescape(f) if b"\\" in f else f for f in column]
            )
        else:
            columns.append(column)
    return columns


def parse_rows(data: bytes) -> list[list[bytes | None]]:
    """Every row of a COPY text output, each a list of its columns' text (None: null)."""
    if not data:
        return []
    rows: list[list[bytes | None]] = []
    append = rows.append
    for line in data.split(b"\n")[:-1]:  # every row ends with a newline
        if b"\\" not in line:
            append(line.split(b"\t"))  # type: ignore[arg-type]  # list[bytes] is a list of cells
            continue
        append(
            [None if f == _NULL else unescape(f) if b"\\" in f else f for f in line.split(b"\t")]
        )
    return rows
