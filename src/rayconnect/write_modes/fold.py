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

A truncate (a Debezium ``op: "t"`` event, ``TRUNCATE_COLUMN`` true) is about no key: it
removes every row the table held before the round and every change of the round before it,
and the changes after it apply on the emptied table. "Before" is offset order in the
truncate's own partition. In the round's other partitions, where Kafka defines no order, it
is the source's position where both events carry one (``LSN_COLUMN``, Postgres's
``source.lsn``: a TRUNCATE locks its table, so every change of the table committed before it
has a lower LSN and every later one a higher), else the record timestamp. A tie (the same
LSN: the truncating transaction's own changes, as rayconnect's source gives the commit's
LSN; the same millisecond) keeps the change rather than lose one that may follow the
truncate. docs/guides/upserts.md#truncate says what a reader sees across rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the column that says whether a change deletes its key (true) or writes its row (false)
DELETE_COLUMN = "_rayconnect_delete"
#: the column that marks a truncate of the whole table (present only in a block that has one)
TRUNCATE_COLUMN = "_rayconnect_truncate"
#: the change event's source position (Debezium's ``source.lsn``), to order a truncate
#: against other partitions' changes; null where an event has none
LSN_COLUMN = "_rayconnect_lsn"
#: the columns of a round's changes that are the write mode's, never the table's
CHANGE_COLUMNS = (DELETE_COLUMN, TRUNCATE_COLUMN, LSN_COLUMN)

_PARTITION = "_kafka_partition"
_OFFSET = "_kafka_offset"
_TIMESTAMP = "_kafka_timestamp"


@dataclass(frozen=True)
class Folded:
    """A round's changes, one per key: ``rows`` to write (without the delete column) and
    ``deleted`` the key columns of the keys to remove. A key is in at most one of them.
    ``truncated``: the round truncates the table first - every row it held goes, then
    ``rows`` are written (``deleted`` then changes nothing)."""

    rows: pa.Table
    deleted: pa.Table
    truncated: bool = False


def fold(changes: pa.Table, key_columns: list[str]) -> Folded:
    """The last change of each key in ``changes`` (which has the key columns, the
    ``_kafka_partition``/``_kafka_offset`` coordinates and ``DELETE_COLUMN``)."""
    changes, truncated = after_truncate(changes)
    if truncated and changes.num_rows == 0:  # (a block of truncates alone may lack the keys)
        for name in key_columns:
            if name not in changes.column_names:
                changes = changes.append_column(name, pa.nulls(0))
    needed = (*key_columns, _PARTITION, _OFFSET, DELETE_COLUMN)
    missing = [c for c in needed if c not in changes.column_names]
    if missing:
        raise ValueError(f"cannot fold changes without the columns {missing}")
    if changes.num_rows == 0:
        return _split(changes, key_columns, truncated)
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
    return _split(ranked.take(pa.array(rows)).drop_columns(["__rank"]), key_columns, truncated)


def after_truncate(changes: pa.Table) -> tuple[pa.Table, bool]:
    """The changes a truncate in ``changes`` leaves (none that a truncate follows: the
    module's rule), without the truncates and the ordering columns; and whether there was
    one."""
    marks = [c for c in (TRUNCATE_COLUMN, LSN_COLUMN) if c in changes.column_names]
    if TRUNCATE_COLUMN not in marks:
        return changes.drop_columns(marks), False
    flags = pc.fill_null(changes.column(TRUNCATE_COLUMN), False).to_numpy(zero_copy_only=False)
    if not flags.any():
        return changes.drop_columns(marks), False
    if _TIMESTAMP not in changes.column_names:
        raise ValueError(f"cannot order a truncate without the column {_TIMESTAMP!r}")
    partition = changes.column(_PARTITION).to_numpy(zero_copy_only=False)
    offset = changes.column(_OFFSET).to_numpy(zero_copy_only=False)
    stamp = pc.cast(changes.column(_TIMESTAMP), pa.int64()).to_numpy(zero_copy_only=False)
    lsn = (
        changes.column(LSN_COLUMN)
        if LSN_COLUMN in marks
        else pa.nulls(changes.num_rows, pa.int64())
    )
    has_lsn = pc.is_valid(lsn).to_numpy(zero_copy_only=False)
    lsn_values = pc.fill_null(lsn, 0).to_numpy(zero_copy_only=False)
    removed = flags.copy()
    for t in np.flatnonzero(flags):
        by_lsn = has_lsn & has_lsn[t]
        earlier = np.where(by_lsn, lsn_values < lsn_values[t], stamp < stamp[t])
        removed |= np.where(partition == partition[t], offset < offset[t], earlier)
    return changes.filter(pa.array(~removed)).drop_columns(marks), True


def missing_key(changes: pa.Table, key_columns: list[str]) -> pa.BooleanArray:
    """Which changes have no key (a key column is null): they cannot apply to any row, and
    go to the dead-letter table instead of being folded into one null key."""
    mask = pa.array(np.zeros(changes.num_rows, dtype=bool))
    for name in key_columns:
        mask = pc.or_(mask, pc.is_null(changes.column(name)))
    return mask


def _split(winners: pa.Table, key_columns: list[str], truncated: bool) -> Folded:
    deletes = pc.fill_null(winners.column(DELETE_COLUMN), False)
    return Folded(
        rows=winners.filter(pc.invert(deletes)).drop_columns([DELETE_COLUMN]),
        deleted=winners.filter(deletes).select(key_columns),
        truncated=truncated,
    )
