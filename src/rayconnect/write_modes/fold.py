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
truncate. That order does not reach across rounds (docs/guides/upserts.md#truncate).

rayconnect's Postgres source writes a truncate as one copy per partition of the topic
(``protocol.truncate_marker``; ``PARTITION_TRUNCATE_COLUMN`` true): the copy in a partition
removes the rows that partition brought - the table's (``Folded.truncated_partitions``:
its ``_kafka_cluster``/``_kafka_topic``/``_kafka_partition``) and the round's before it in
offset order - and nothing of other partitions, whose own copies do that for them in
whichever round they are read. A key always hashes to one partition, so this is exact
across rounds with no order between partitions at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.protocol.types import TopicPartition
from rayconnect.write_modes.unchanged import UNCHANGED_PREFIX, fill_in_round

#: the column that says whether a change deletes its key (true) or writes its row (false)
DELETE_COLUMN = "_rayconnect_delete"
#: the column that marks a truncate of the whole table (present only in a block that has one)
TRUNCATE_COLUMN = "_rayconnect_truncate"
#: the column that marks a truncate of the rows of its own partition (likewise)
PARTITION_TRUNCATE_COLUMN = "_rayconnect_truncate_partition"
#: the truncate columns: a truncate row is about no key
TRUNCATE_COLUMNS = (TRUNCATE_COLUMN, PARTITION_TRUNCATE_COLUMN)
#: the change event's source position (Debezium's ``source.lsn``), to order a truncate
#: against other partitions' changes; null where an event has none
LSN_COLUMN = "_rayconnect_lsn"
#: the columns of a round's changes that are the write mode's, never the table's (and the
#: marks of values a change does not carry: ``unchanged.UNCHANGED_PREFIX``)
CHANGE_COLUMNS = (DELETE_COLUMN, *TRUNCATE_COLUMNS, LSN_COLUMN)


def is_change_column(name: str) -> bool:
    """Whether ``name`` is a column of a round's changes that the table never holds."""
    return name in CHANGE_COLUMNS or name.startswith(UNCHANGED_PREFIX)

_CLUSTER = "_kafka_cluster"
_TOPIC = "_kafka_topic"
_PARTITION = "_kafka_partition"
#: the columns that say which partition a row of the table came from (what a partition's
#: truncate removes by)
PARTITION_COLUMNS = (_CLUSTER, _TOPIC, _PARTITION)
_OFFSET = OFFSET_COLUMN = "_kafka_offset"
_TIMESTAMP = "_kafka_timestamp"


@dataclass(frozen=True)
class Folded:
    """A round's changes, one per key: ``rows`` to write (without the delete column) and
    ``deleted`` the key columns of the keys to remove. A key is in at most one of them.
    ``truncated``: the round truncates the table first - every row it held goes, then
    ``rows`` are written (``deleted`` then changes nothing). Else ``truncated_partitions``:
    the table's rows that came from these partitions go first (by their ``_kafka_*``
    columns), then ``rows`` are written and ``deleted`` removed."""

    rows: pa.Table
    deleted: pa.Table
    truncated: bool = False
    truncated_partitions: frozenset[TopicPartition] = frozenset()


def fold(changes: pa.Table, key_columns: list[str]) -> Folded:
    """The last change of each key in ``changes`` (which has the key columns, the
    ``_kafka_partition``/``_kafka_offset`` coordinates and ``DELETE_COLUMN``)."""
    changes, truncated, partitions = after_truncate(changes)
    if (
        truncated or partitions
    ) and changes.num_rows == 0:  # (a block of truncates alone may lack the keys)
        for name in key_columns:
            if name not in changes.column_names:
                changes = changes.append_column(name, pa.nulls(0))
    needed = (*key_columns, _PARTITION, _OFFSET, DELETE_COLUMN)
    missing = [c for c in needed if c not in changes.column_names]
    if missing:
        raise ValueError(f"cannot fold changes without the columns {missing}")
    if changes.num_rows == 0:
        return _split(changes, key_columns, truncated, partitions)
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
    winners = fill_in_round(ranked, rows, key_columns).drop_columns(["__rank"])
    return _split(winners, key_columns, truncated, partitions)


def after_truncate(changes: pa.Table) -> tuple[pa.Table, bool, frozenset[TopicPartition]]:
    """The changes the truncates in ``changes`` leave (the module's rules), without the
    truncates and the ordering columns; whether one truncated the whole table; and, if
    none did, the partitions whose rows the table drops."""
    marks = [c for c in (*TRUNCATE_COLUMNS, LSN_COLUMN) if c in changes.column_names]
    flags = _flags(changes, TRUNCATE_COLUMN)
    removed, partitions = _before_partition_truncates(changes)
    if flags.any():
        removed |= _before_table_truncates(changes, flags)
    kept = changes.filter(pa.array(~removed)) if removed.any() else changes
    truncated = bool(flags.any())
    return kept.drop_columns(marks), truncated, frozenset() if truncated else partitions


def _flags(changes: pa.Table, name: str) -> np.ndarray:
    if name not in changes.column_names:
        return np.zeros(changes.num_rows, dtype=bool)
    return np.asarray(pc.fill_null(changes.column(name), False).to_numpy(zero_copy_only=False))


def _before_partition_truncates(changes: pa.Table) -> tuple[np.ndarray, frozenset[TopicPartition]]:
    """The per-partition truncates and the changes before them in their own partition
    (offset order); and those partitions."""
    flags = _flags(changes, PARTITION_TRUNCATE_COLUMN)
    removed = flags.copy()
    if not flags.any():
        return removed, frozenset()
    needed = [c for c in (*PARTITION_COLUMNS, _OFFSET) if c not in changes.column_names]
    if needed:
        raise ValueError(f"cannot place a partition's truncate without the columns {needed}")
    cluster, topic, partition, offset = (
        changes.column(c).to_numpy(zero_copy_only=False) for c in (*PARTITION_COLUMNS, _OFFSET)
    )
    partitions = set()
    for t in np.flatnonzero(flags):
        same = (cluster == cluster[t]) & (topic == topic[t]) & (partition == partition[t])
        removed |= same & (offset < offset[t])
        partitions.add(TopicPartition(str(cluster[t]), str(topic[t]), int(partition[t])))
    return removed, frozenset(partitions)


def _before_table_truncates(changes: pa.Table, flags: np.ndarray) -> np.ndarray:
    """The whole-table truncates (``flags``) and the changes before them: the module's
    order (offset in their partition; else LSN, else timestamp)."""
    if _TIMESTAMP not in changes.column_names:
        raise ValueError(f"cannot order a truncate without the column {_TIMESTAMP!r}")
    partition = changes.column(_PARTITION).to_numpy(zero_copy_only=False)
    offset = changes.column(_OFFSET).to_numpy(zero_copy_only=False)
    stamp = pc.cast(changes.column(_TIMESTAMP), pa.int64()).to_numpy(zero_copy_only=False)
    lsn = (
        changes.column(LSN_COLUMN)
        if LSN_COLUMN in changes.column_names
        else pa.nulls(changes.num_rows, pa.int64())
    )
    has_lsn = pc.is_valid(lsn).to_numpy(zero_copy_only=False)
    lsn_values = pc.fill_null(lsn, 0).to_numpy(zero_copy_only=False)
    removed = flags.copy()
    for t in np.flatnonzero(flags):
        by_lsn = has_lsn & has_lsn[t]
        earlier = np.where(by_lsn, lsn_values < lsn_values[t], stamp < stamp[t])
        removed |= np.where(partition == partition[t], offset < offset[t], earlier)
    return removed


def missing_key(changes: pa.Table, key_columns: list[str]) -> pa.BooleanArray:
    """Which changes have no key (a key column is null): they cannot apply to any row, and
    go to the dead-letter table instead of being folded into one null key."""
    mask = pa.array(np.zeros(changes.num_rows, dtype=bool))
    for name in key_columns:
        mask = pc.or_(mask, pc.is_null(changes.column(name)))
    return mask


def _split(
    winners: pa.Table,
    key_columns: list[str],
    truncated: bool,
    partitions: frozenset[TopicPartition],
) -> Folded:
    deletes = pc.fill_null(winners.column(DELETE_COLUMN), False)
    return Folded(
        rows=winners.filter(pc.invert(deletes)).drop_columns([DELETE_COLUMN]),
        deleted=winners.filter(deletes).select(key_columns),
        truncated=truncated,
        truncated_partitions=partitions,
    )
