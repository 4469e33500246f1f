"""An upsert round into a Delta table: one MERGE, one version, the round's txn ids in it.

delta-rs's MERGE is copy-on-write (the files holding a round's keys are read, the matched rows
deleted or replaced, the files rewritten: remove + add in one commit); its early filter skips
the files whose key statistics exclude every key of the round, and the partitions none of its
keys is in (a partition column that is a key column: ``t.p = s.p`` becomes ``p IN (the
round's values)``), so a round costs the files it touches, not the table. That filter needs
``streamed_exec=False`` (delta-rs derives it from the source's statistics, which a streamed
source has none of); the round is an in-memory table anyway. A partition column that is not
in the key cannot prune: an update may move its key to another partition, whose old row must
be found wherever it is (key statistics only). delta-rs writes no deletion vectors (1.6.6), so copy-on-write is the choice
here; measured: 100k changes into a 1M-row table of one file in 0.26 s, into a 10M-row table
of 10 files with keys spread over all of them 1.8 s (every file rewritten).

Exactly once: the MERGE commits with the round's txn actions (``CommitProperties``), so the
rows and the offsets land in one version; delta-rs's conflict checker fails the commit when a
concurrent commit set one of those app ids (a rival coordinator's round or epoch claim) or
rewrote a file this MERGE read (OPTIMIZE, an outside DELETE): one side fails, cleanly.

A round with a truncate (``Folded.truncated``) is no MERGE: every row the table held goes,
so it is an overwrite - one version that removes every file and adds the round's rows (the
changes after the truncate, folded), with the same txn actions; nothing of the table is read.
A round with per-partition truncates (``Folded.truncated_partitions``) is the round's MERGE
with one more clause: a table row no change of the round matches is deleted if it came
from one of those partitions (its ``_kafka_*`` columns; a matched one is the round's to
update or delete anyway). That clause reads every file (no early filter can skip a file by
what the round does not hold), so such a round costs the table; truncates are rare.

delta-rs commits no version for a MERGE (or a DELETE) that changes no file - a partition's
truncate with none of its rows left, deletes of keys the table does not hold - so such a
MERGE is followed by a version of the round's txn actions alone: every round lands its
offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rayconnect.protocol.types import TopicPartition
from rayconnect.write_modes.fold import PARTITION_COLUMNS, Folded
from rayconnect.write_modes.rows import with_delete_flag

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties

_SOURCE, _TARGET = "s", "t"


def merge_round(
    dt: DeltaTable,
    folded: Folded,
    key_columns: Sequence[str],
    commit_properties: CommitProperties,
    post_commithook_properties: PostCommitHookProperties | None = None,
) -> dict[str, int]:
    """MERGE ``folded`` into ``dt`` (a ``deltalake.DeltaTable``) and commit it with
    ``commit_properties``; returns delta-rs's merge metrics (rows and files touched). A
    truncating round overwrites the table instead (no metrics)."""
    if folded.truncated:
        from deltalake import write_deltalake

        write_deltalake(
            dt,
            folded.rows,
            mode="overwrite",
            partition_by=dt.metadata().partition_columns or None,
            commit_properties=commit_properties,
            post_commithook_properties=post_commithook_properties,
        )
        return {}
    source, flag = with_delete_flag(folded)
    on = " AND ".join(f"{_TARGET}.`{c}` = {_SOURCE}.`{c}`" for c in key_columns)
    keep = f"NOT {_SOURCE}.`{flag}`"
    merger = (
        dt.merge(
            source,
            on,
            source_alias=_SOURCE,
            target_alias=_TARGET,
            # the round is in memory already; streamed execution would turn off the early
            # filter that skips the files (and partitions) none of the round's keys can be in
            streamed_exec=False,
            commit_properties=commit_properties,
            post_commithook_properties=post_commithook_properties,
        )
        .when_matched_delete(f"{_SOURCE}.`{flag}`")
        .when_matched_update_all(keep, except_cols=[flag])
        .when_not_matched_insert_all(keep, except_cols=[flag])
    )
    if folded.truncated_partitions:
        merger = merger.when_not_matched_by_source_delete(
            _from_partitions(folded.truncated_partitions)
        )
    metrics = dict(merger.execute())
    if not (metrics.get("num_target_files_added") or metrics.get("num_target_files_removed")):
        # delta-rs commits no version for a MERGE that changes no file (a truncate of a
        # partition with no rows left, deletes of absent keys): the round's txn actions
        # must land all the same, in a version of no files
        dt.create_write_transaction(
            [],
            "append",
            folded.rows.schema,
            commit_properties=commit_properties,
            post_commithook_properties=post_commithook_properties,
        )
    return metrics


def _from_partitions(partitions: frozenset[TopicPartition]) -> str:
    """A predicate on the target's rows: from one of ``partitions`` (by its
    ``PARTITION_COLUMNS``). Topics are letters, digits, '.', '_', '-', but a cluster id is
    whatever the pipeline's metadata calls it: strings are SQL literals with quotes doubled
    (Python's repr would quote ``o'k`` with double quotes, an identifier in SQL)."""
    return " OR ".join(
        "("
        + " AND ".join(
            f"{_TARGET}.`{column}` = {_sql_literal(value)}"
            for column, value in zip(
                PARTITION_COLUMNS, (tp.cluster, tp.topic, tp.partition), strict=True
            )
        )
        + ")"
        for tp in sorted(partitions)
    )


def _sql_literal(value: object) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"
