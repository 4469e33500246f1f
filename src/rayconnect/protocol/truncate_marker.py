"""What a Debezium truncate event truncates: the whole table, or the rows of its partition.

A truncate event alone (Debezium's, one on some partition) is ordered against the table's
other partitions only by what the events carry, and not at all across rounds
(docs/guides/upserts.md#truncate). rayconnect's Postgres source writes instead one copy of
the event to every partition of the table's topic, in one Kafka transaction, each with the
header ``rayconnect.truncate: partition``: the copy in partition p truncates the rows that
partition p brought (a key always hashes to the same partition), at its offset - exact,
whatever the round each partition's copy is read in. The header is decoded here once into
a ``TruncateScope``; nothing else reads it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

#: the Kafka header that marks a truncate event as one of a per-partition set
TRUNCATE_HEADER = "rayconnect.truncate"
_PARTITION = b"partition"


class TruncateScope(enum.Enum):
    """``TABLE``: a truncate without the marker (Debezium's), of the whole table.
    ``PARTITION``: rayconnect's, one per partition, of the rows of its own partition."""

    TABLE = "table"
    PARTITION = "partition"


#: the headers of each per-partition copy (the Postgres source writes them)
PARTITION_TRUNCATE_HEADERS: tuple[tuple[str, bytes], ...] = ((TRUNCATE_HEADER, _PARTITION),)


def scope_of(headers: Iterable[Mapping[str, Any]] | None) -> TruncateScope:
    """The scope of a truncate event with these Kafka headers (Arrow's ``{"key", "value"}``
    rows); an unknown value of the header is a whole-table truncate, as without one."""
    for header in headers or ():
        if header.get("key") == TRUNCATE_HEADER and header.get("value") == _PARTITION:
            return TruncateScope.PARTITION
    return TruncateScope.TABLE
