"""Exactly once across many tables (``config.routes``): the offsets rule, pure.

Each table carries, per partition, the next offset of the records it holds (as a single
table does). With routes a partition may feed several tables, and a coordinator may die
between their commits, so the tables of one partition may disagree:

- a partition restarts from the SMALLEST offset among the tables that have it
  (``restart_offsets``) - no table misses a record;
- each table SKIPS the rows of a partition below its own offset for it (``TableRound
  .floors``) - no table gets a record twice;
- a table that gets a partition's rows for the first time is first given the round's START
  offset of that partition (``TableRound.introduce``), in a version of its own, before any
  table of the round commits: else a table committed first would carry the round's END and
  the minimum would skip the new table's rows.

A partition no route table has yet restarts from the sink's own table (its unrouted
records), which the introductions above make safe: a table that holds any of its rows has
it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec


def restart_offsets(
    tables: Mapping[str, Mapping[str, int]], own: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Partition key -> where it restarts: the smallest offset among ``tables`` (name ->
    its offsets); for a partition none of them has, the sink's ``own`` table's offset."""
    start: dict[str, int] = {}
    for offsets in tables.values():
        for key, offset in offsets.items():
            start[key] = min(offset, start.get(key, offset))
    for key, offset in (own or {}).items():
        start.setdefault(key, offset)
    return dict(sorted(start.items()))


class TableRound(msgspec.Struct, frozen=True):
    """One table's part of a round: what to introduce first, then compare-and-set."""

    #: partitions new to the table -> the round's START offset (a version of its own)
    introduce: dict[str, int]
    #: the table's own offsets the commit expects (after the introductions)
    expected: dict[str, int]
    #: the offsets the commit sets: never below what the table has
    offsets: dict[str, int]
    #: partitions whose rows below this offset the table holds already: skipped
    floors: dict[str, int]

    @property
    def moves(self) -> bool:
        """Whether the commit moves any offset (else, without files, it is left out)."""
        return self.offsets != self.expected


def table_lag(offsets: Mapping[str, int], hws: Mapping[str, int | None]) -> int | None:
    """Records of a route table's partitions not in it yet: the sum over its ``offsets``
    of high watermark - its offset (None: a partition's high watermark is not known)."""
    marks = [hws.get(key) for key in offsets]
    if any(hw is None for hw in marks):
        return None
    return sum(max((hw or 0) - offsets[key], 0) for key, hw in zip(offsets, marks, strict=True))


def table_round(
    own: Mapping[str, int],
    partitions: Iterable[str],
    starts: Mapping[str, int],
    ends: Mapping[str, int],
) -> TableRound:
    """Table with offsets ``own`` in a round whose ``partitions`` brought it rows (or dead
    letters), read from ``starts`` up to ``ends``."""
    introduce: dict[str, int] = {}
    expected: dict[str, int] = {}
    offsets: dict[str, int] = {}
    floors: dict[str, int] = {}
    for key in sorted(set(partitions)):
        start = starts[key]
        have = own.get(key)
        if have is None:
            have = introduce[key] = start
        expected[key] = have
        offsets[key] = max(have, ends[key])
        if have > start:
            floors[key] = have
    return TableRound(introduce, expected, offsets, floors)


def idle_partitions(
    tables: Mapping[str, Mapping[str, int]], fed: Iterable[str], ends: Mapping[str, int]
) -> dict[str, set[str]]:
    """Table -> the partitions it holds that the round moved past its offset without a
    record for any table (no rows, no dead letters: commit markers, an aborted tail, change
    events that change nothing). Nothing of those went anywhere, so every table holding
    such a partition may move to the round's end - else a caught-up table would show lag
    for ever (the last offset of a transactional topic is a marker)."""
    skip = set(fed)
    idle: dict[str, set[str]] = {}
    for name, offsets in tables.items():
        moved = {
            k for k, have in offsets.items() if k not in skip and k in ends and ends[k] > have
        }
        if moved:
            idle[name] = moved
    return idle


def round_starts(expected: Mapping[str, int | None], starts: Mapping[str, int]) -> dict[str, int]:
    """Where each partition's round started: its START offset, or - a partition the
    tables never had - where its participant began (``CommitTable.starts``)."""
    return {k: v if v is not None else starts[k] for k, v in expected.items()}
