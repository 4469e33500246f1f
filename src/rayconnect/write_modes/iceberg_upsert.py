"""An upsert round into an Iceberg table: delete the round's keys, append its rows, in the
transaction that carries the round's offsets - one atomic catalog commit.

pyiceberg (0.12) writes no equality or position deletes of its own accord: its DELETE is
copy-on-write (files whose statistics exclude every key are not read; a file whose rows all
match is dropped whole; others rewritten without the matched rows). So a round is a
copy-on-write overwrite of the files holding its keys, then an append of the new rows; both
are staged in the committer's transaction, which the catalog swaps in only on exactly the
metadata it read (no retry, no rebase: ``tables/iceberg.py``), so a concurrent rewrite of one
of those files or a rival coordinator's commit fails this one, never both landing.

A round with a truncate (``Folded.truncated``) deletes every row instead of the round's keys
(whole files dropped from the manifests, none read or rewritten), then appends its rows:
the same one catalog commit. A round with per-partition truncates
(``Folded.truncated_partitions``) deletes, with its keys, every row from those partitions
(their ``_kafka_*`` columns) in the same DELETE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from rayconnect.protocol.types import TopicPartition
from rayconnect.write_modes.fold import PARTITION_COLUMNS, Folded


def upsert_round(
    tx: Any,
    folded: Folded,
    key_columns: Sequence[str],
    summary: Mapping[str, str],
) -> None:
    """Stage ``folded`` in ``tx`` (a pyiceberg ``Transaction``): every key of the round
    deleted (every row, if the round truncates the table), then the round's rows appended
    with ``summary`` as the snapshot's summary."""
    if folded.truncated:
        from pyiceberg.expressions import AlwaysTrue

        tx.delete(AlwaysTrue(), snapshot_properties=dict(summary))
        tx.append(folded.rows, snapshot_properties=dict(summary))
        return
    keys = pa.concat_tables([folded.rows.select(list(key_columns)), folded.deleted])
    matches = [_match(keys, key_columns)] if keys.num_rows else []
    if folded.truncated_partitions:
        matches.append(_match(_of_partitions(folded.truncated_partitions), PARTITION_COLUMNS))
    if matches:
        from pyiceberg.expressions import Or

        match = Or(*matches) if len(matches) > 1 else matches[0]
        tx.delete(match, snapshot_properties=dict(summary))
    if folded.rows.num_rows or not keys.num_rows:  # (a snapshot with the summary, always)
        tx.append(folded.rows, snapshot_properties=dict(summary))


def _of_partitions(partitions: frozenset[TopicPartition]) -> pa.Table:
    """The partitions as values of the table's ``PARTITION_COLUMNS``, one row each."""
    ordered = sorted(partitions)
    cluster, topic, partition = PARTITION_COLUMNS
    return pa.table(
        {
            cluster: [tp.cluster for tp in ordered],
            topic: [tp.topic for tp in ordered],
            partition: pa.array([tp.partition for tp in ordered], pa.int32()),
        }
    )


def _match(keys: pa.Table, key_columns: Sequence[str]) -> Any:
    """An Iceberg filter matching exactly ``keys``: pyiceberg's own upsert's (``In`` for one
    key column, an ``Or`` of ``And``s for several)."""
    from pyiceberg.table.upsert_util import create_match_filter

    return create_match_filter(keys, list(key_columns))
