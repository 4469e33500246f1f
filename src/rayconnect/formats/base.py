"""The one interface every value format implements.

A decoder turns a whole column of raw Kafka values (Arrow binary, one block) into a table of
columns at once - never one Python object per record on the good path. Records it cannot
decode are reported by index with a reason, so the caller can stop the partition or send
them to the dead-letter table; the decoded table then holds the other records, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa


@dataclass(frozen=True)
class Decoded:
    """What a decoder made of one block of values.

    ``columns`` has one row per good record (the inputs minus ``bad``, in input order).
    ``bad`` maps an input index to why that record could not be decoded.
    """

    columns: pa.Table
    bad: dict[int, str] = field(default_factory=dict)


class ValueDecoder(Protocol):
    """Decodes blocks of Kafka values of one format into columns."""

    def decode(self, values: pa.Array, table_schema: pa.Schema | None) -> Decoded:
        """Decode ``values`` (binary, may hold nulls). ``table_schema``: the table's current
        decoded columns (None: not known yet); a value that contradicts it is bad."""
        ...
