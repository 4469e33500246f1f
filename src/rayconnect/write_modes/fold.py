"""Folding a round's changes by key: the last change of each key wins.

A round of an upsert table holds inserts, updates and deletes, possibly several for one key.
The table must end as if they were applied one by one in offset order, so only each key's
last change matters: an update after an insert leaves the update's row, a delete after an
insert leaves nothing, an insert after a delete leaves the insert's row. Folding first means
the committer touches each key once, however many changes it had in the round.

Order is offset order within a partition, which is the order Kafka guarantees. A key is
expected to live in one partition (Kafka's default partitioner keys by the record key); when
changes of one key arrive in several partitions in the same round there is no order between
them that Kafka defines, so the fold picks one deterministically - the change from the
highest partition number, then the highest offset - and the README says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the column that says whether a change deletes its key (true) or writes its row (false)
DELETE_COLUMN = "_rayconnect_delete"

_PARTITION = "_kafka_partition"
_OFFSET = "_kafka_offset"


@dataclass(frozen=True)
class Folded:
    """A round's changes, one per key: ``rows`` to write (without the delete column) and
    ``deleted`` the key columns of the keys to remove. A key is in at most one of them."""

    rows: pa.Table
    deleted: pa.Table


def fold(changes: pa.Table, key_columns: list[str]) -> Folded:
    """The last change of each key in ``changes`` (which has the key columns, the
    ``_kafka_partition``/``_kafka_offset`` coordinates and ``DELETE_COLUMN``)."""
    needed = (*key_columns, _PARTITION, _OFFSET, DELETE_COLUMN)
    missing = [c for c in needed if c not in changes.column_names]
    if missing:
        raise ValueError(f"cannot fold changes without the columns {missing}")
    if changes.num_rows == 0:
        return _split(changes, key_columns)
    order = np.lexsort(
        (
            changes.column(_OFFSET).to_numpy(zero_copy_only=False),
            changes.column(_PARTITION).to_numpy(zero_copy_only=False),
        )
    )
    ranked = changes.take(pa.array(order)).append_column(
        "__rank", pa.array(np.arange(changes.num_rows, dtype=np.int64))
    )
    last = ranked.group_by(key_columns, use_threads=False).aggregate([("__rank", "max")])
    rows = np.sort(last.column("__rank_max").to_numpy())  # the rank is the row in ``ranked``
    return _split(ranked.take(pa.array(rows)).drop_columns(["__rank"]), key_columns)


def missing_key(changes: pa.Table, key_columns: list[str]) -> pa.BooleanArray:
    """Which changes have no key (a key column is null): they cannot apply to any row, and
    go to the dead-letter table instead of being folded into one null key."""
    mask = pa.array(np.zeros(changes.num_rows, dtype=bool))
    for name in key_columns:
        mask = pc.or_(mask, pc.is_null(changes.column(name)))
    return mask


def _split(winners: pa.Table, key_columns: list[str]) -> Folded:
    deletes = pc.fill_null(winners.column(DELETE_COLUMN), False)
    return Folded(
        rows=winners.filter(pc.invert(deletes)).drop_columns([DELETE_COLUMN]),
        deleted=winners.filter(deletes).select(key_columns),
    )
