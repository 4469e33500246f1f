"""A pgoutput row straight to its JSON and its key, compiled once per table shape (pure).

The stream's rate is set by what each change costs in Python. Decoding a TupleData into
cells (``pgoutput``) and then writing the cells as JSON (``events.RowCodec.row``) walks the
columns twice, with a loop, a list and a call per value. A row reader does both in one
pass of straight-line code made for the table's columns: no loop, no cell list, an
integer's text used as is without a call. It covers the rows that are only values and
NULLs; it answers None for anything else (an unchanged TOASTed value, a column count
that is not the shape's), and the caller takes the general path, which writes the same
bytes (``tests/unit/source_tasks/test_postgres_row_reader.py`` holds the two equal).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from rayconnect.source_tasks.postgres.values import Encode, same_text

#: a TupleData at a position of a message -> (the row's JSON object, its key's), or None
#: when the row needs the general path
RowReader = Callable[[bytes, int], "tuple[bytes, bytes | None] | None"]

_CELL = """\
    k = buf[p]
    if k == 116:
        (z,) = i32(buf, p + 1)
        p += 5 + z
        v{i} = {encode}
    elif k == 110:
        v{i} = b"null"
        p += 1
    else:
        return None
"""


def compile_reader(
    fields: Sequence[bytes], encoders: Sequence[Encode], key: Sequence[int], names: Sequence[bytes]
) -> RowReader | None:
    """The reader of rows whose columns are written ``fields[i]`` (``{"a":`` first, then
    ``,"b":``) and ``encoders[i]``, keyed by the columns at ``key`` (``names[i]``:
    ``"a":``); None for a table without columns (the general path writes ``{}``)."""
    n = len(fields)
    if not n:
        return None
    namespace: dict[str, object] = {
        "i32": struct.Struct(">i").unpack_from,
        "h16": struct.Struct(">h").unpack_from,
        "join": b"".join,
    }
    lines = [
        "def read(buf, p):",
        f"    if h16(buf, p)[0] != {n}:",
        "        return None",
        "    p += 2",
    ]
    for i, encode in enumerate(encoders):
        namespace[f"e{i}"] = encode
        namespace[f"f{i}"] = fields[i]
        value = "buf[p - z : p]" if encode is same_text else f"e{i}(buf[p - z : p])"
        lines.append(_CELL.format(i=i, encode=value).rstrip("\n"))
    row = ", ".join(f"f{i}, v{i}" for i in range(n))
    lines.append(f"    row = join(({row}, b'}}'))")
    if key:
        parts = []
        for j, i in enumerate(key):
            namespace[f"k{j}"] = (b"{" if j == 0 else b",") + names[i]
            parts.append(f"k{j}, v{i}")
        lines.append(f"    return row, join(({', '.join(parts)}, b'}}'))")
    else:
        lines.append("    return row, None")
    exec(compile("\n".join(lines) + "\n", "<row_reader>", "exec"), namespace)  # noqa: S102
    reader: RowReader = namespace["read"]  # type: ignore[assignment]
    return reader
