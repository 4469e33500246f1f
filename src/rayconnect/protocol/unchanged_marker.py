"""Which columns a change event does not carry: the record header ``rayconnect.unchanged``.

Postgres does not send a TOASTed value an UPDATE did not change (default replica identity).
rayconnect's Postgres source puts Debezium's placeholder in ``after`` for such a text value,
as Debezium does; a column whose type cannot hold that string (a decimal, a list, a date)
gets null - which alone would claim the value was cleared. So the source also names every
such column in this header (a JSON list of names), and an upsert sink keeps the table's
value for each (``write_modes.unchanged``). Written here once, read there once.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

#: the Kafka header naming the columns a change does not carry (a JSON list of names)
UNCHANGED_HEADER = "rayconnect.unchanged"

_names = msgspec.json.Decoder(list[str])


def unchanged_headers(columns: Sequence[str]) -> tuple[tuple[str, bytes], ...]:
    """The headers of a change that does not carry ``columns`` (none when it carries all)."""
    return ((UNCHANGED_HEADER, msgspec.json.encode(list(columns))),) if columns else ()


def unchanged_columns(value: bytes | None) -> list[str]:
    """The column names an ``UNCHANGED_HEADER`` value lists."""
    return _names.decode(value) if value else []
