"""Consistent cuts, pure: the marker arithmetic (protocol/cut_marks.py), a participant
holding what lies past its cut, and the coordinator naming each round's cut."""

from __future__ import annotations

from typing import Any

import pytest

from rayconnect.protocol.coordinator import Coordinator
from rayconnect.protocol.cut_marks import CutMarks, next_cut
from rayconnect.protocol.effects import (
    COORDINATOR,
    Broadcast,
    CommitTable,
    Flush,
    SendMessage,
)
from rayconnect.protocol.messages import (
    AckCommit,
    EndCommit,
    HostWriteStatus,
    StartCommit,
    WriteStatus,
)
from rayconnect.protocol.participant import Participant, State
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile

KEY = "c1/t/0"
CFG = CommitSettings(consistent_cuts=True, flush_max_records=1000, flush_max_bytes=10**6)


def marks(*pairs: tuple[int, int]) -> CutMarks:
    m = CutMarks()
    for end, lsn in pairs:
        m.seen(end, lsn)
    return m


def test_a_cut_ends_after_the_last_marker_at_or_below_it() -> None:
    m = marks((10, 100), (20, 200), (30, 300))
    assert m.end_for(200, 0) == 20
    assert m.end_for(250, 0) == 20  # a partition made later lacks some markers
    assert m.end_for(300, 0) == 30
    assert m.end_for(50, 0) == 0  # every record past the start is newer: nothing
    assert m.end_for(200, 20) == 20  # started at the cut already
    assert m.end_for(None, 10) == 10  # no cut: the round takes nothing


def test_a_cut_end_is_unknown_until_a_marker_at_or_past_it_was_read() -> None:
    m = marks((10, 100))
    assert m.end_for(200, 0) is None  # records after offset 10 may still be <= 200
    m.seen(25, 230)
    assert m.end_for(200, 0) == 10
    assert m.end_for(230, 0) == 25


def test_markers_read_twice_count_once_and_committed_ones_are_forgotten() -> None:
    m = marks((10, 100), (20, 200))
    m.seen(10, 100)  # read again after a seek
    assert len(m) == 2
    m.forget_through(10)
    assert len(m) == 1 and m.highest(None) == 200
    assert m.highest(20) is None  # nothing past offset 20


def test_the_next_cut_is_the_lowest_highest_marker_of_all_partitions() -> None:
    assert next_cut(["a", "b"], {"a": 300, "b": 200}, committed=100) == 200
    assert next_cut(["a", "b"], {"a": 300}, committed=100) is None  # b read none
    assert next_cut(["a", "b"], {"a": 300, "b": None}, committed=100) is None
    assert next_cut(["a", "b"], {"a": 300, "b": 200}, committed=200) is None  # not past it
    assert next_cut(["a"], {"a": 300}, committed=None) == 300


def feed(p: Participant, first: int, n: int, cut: int | None = None) -> list[Any]:
    """``n`` records at ``first``; ``cut``: the batch ends with a marker of that LSN."""
    return p.records(first, first + n, n, 10 * n, f"b@{first}", 0.0, cut_lsn=cut)


def flushes(ready: list[Any]) -> list[Flush]:
    return [e for e in ready if isinstance(e, Flush)]


def statuses(ready: list[Any]) -> list[WriteStatus]:
    return [
        e.message
        for e in ready
        if isinstance(e, SendMessage) and e.to == COORDINATOR and isinstance(e.message, WriteStatus)
    ]


def test_a_round_without_a_cut_takes_nothing_and_reports_the_markers_read() -> None:
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, 1, {KEY: 0}), 0.0)
    assert feed(p, 0, 5, cut=100) == []  # held: no cut named yet
    assert feed(p, 5, 5, cut=200) == []
    ready = p.step(EndCommit(1, 1), 0.0)
    (status,) = statuses(ready)
    assert (status.first_offset, status.next_offset, status.records) == (0, 0, 0)
    assert status.cut_seen == 200
    assert p.status().read_ahead_records == 10


def test_the_next_round_takes_exactly_the_held_batches_up_to_its_cut() -> None:
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, 1, {KEY: 0}), 0.0)
    feed(p, 0, 5, cut=100)
    feed(p, 5, 5, cut=200)
    feed(p, 10, 3)  # after the last marker: its cut is not known yet
    p.step(EndCommit(1, 1), 0.0)
    p.step(AckCommit(1, 1, 0, {KEY: 0}), 0.0)
    p.step(StartCommit(1, 2, {KEY: 0}, cut=100), 0.0)
    ready = p.step(EndCommit(1, 2), 0.0)
    (flush,) = flushes(ready)
    assert (flush.first_offset, flush.next_offset, flush.batches) == (0, 5, ("b@0",))
    ready = p.flushed(flush.flush_id, [DataFile("f", 5, 1)], 0.0)
    (status,) = statuses(ready)
    assert (status.first_offset, status.next_offset, status.records) == (0, 5, 5)
    assert status.cut_seen == 200  # the marker held past the round's end
    assert p.status().read_ahead_records == 8


def test_an_end_before_the_cut_was_read_waits_for_it() -> None:
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, 1, {KEY: 0}, cut=200), 0.0)  # a restarted participant: no marks
    feed(p, 0, 5, cut=100)
    assert p.step(EndCommit(1, 1), 0.0) == []  # the end of cut 200 is not known yet
    assert p.state is State.ENDING
    feed(p, 5, 5)  # still unknown: these may belong to the cut or not
    ready = feed(p, 10, 5, cut=300)  # past the cut: it ends after the marker of 100
    (flush,) = flushes(ready)
    assert (flush.first_offset, flush.next_offset) == (0, 5)
    (status,) = statuses(p.flushed(flush.flush_id, [], 0.0))
    assert (status.next_offset, status.cut_seen) == (5, 300)


def test_a_cut_reached_after_end_flushes_and_reports() -> None:
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, 1, {KEY: 0}, cut=200), 0.0)
    feed(p, 0, 5, cut=100)
    assert p.step(EndCommit(1, 1), 0.0) == []
    ready = feed(p, 5, 5, cut=200)  # the cut's own marker
    (flush,) = flushes(ready)
    assert (flush.first_offset, flush.next_offset, flush.records) == (0, 10, 10)
    (status,) = statuses(p.flushed(flush.flush_id, [], 0.0))
    assert (status.next_offset, status.cut_seen) == (10, None)


def test_a_gap_in_held_batches_seeks_back_and_a_stale_batch_is_dropped() -> None:
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, 1, {KEY: 0}, cut=100), 0.0)
    ready = feed(p, 5, 5)  # offsets 0-4 were lost on the way
    assert [type(e).__name__ for e in ready] == ["Seek"]
    assert feed(p, 3, 2) == []  # from before the seek
    feed(p, 0, 5, cut=100)
    ready = p.step(EndCommit(1, 1), 0.0)
    (flush,) = flushes(ready)
    assert flush.next_offset == 5


def coordinator() -> Coordinator:
    c = Coordinator("p", ["a", "b"], CommitSettings(consistent_cuts=True))
    c.recover(1, {"a": 0, "b": 0}, 0.0)
    return c


def starts(ready: list[Any]) -> list[StartCommit]:
    return [
        e.message for e in ready if isinstance(e, Broadcast) and isinstance(e.message, StartCommit)
    ]


def status(key: str, txn: int, first: int, next_: int, cut_seen: int | None) -> WriteStatus:
    files = (DataFile(f"{key}-{txn}", next_ - first, 1, shared_by=(key,)),) if next_ > first else ()
    return WriteStatus(1, txn, key, files, first, next_, next_ - first, cut_seen)


def test_the_coordinator_names_a_cut_every_partition_read_and_records_it() -> None:
    c = coordinator()
    c.tick(100.0)  # round 1 (no cut) ends
    ready = c.step(
        HostWriteStatus.of([status("a", 1, 0, 0, 300), status("b", 1, 0, 0, 200)]), 100.0
    )
    (start,) = starts(ready)  # round 1 was empty: round 2 at once, cut at the lower marker
    assert start.cut == 200
    c.tick(200.0)
    ready = c.step(
        HostWriteStatus.of([status("a", 2, 0, 7, 300), status("b", 2, 0, 4, None)]), 200.0
    )
    (commit,) = [e for e in ready if isinstance(e, CommitTable)]
    assert commit.metadata.cut_lsn == 200
    assert commit.metadata.as_table_metadata()["rayconnect.cut_lsn"] == "200"
    (start,) = starts(c.commit_succeeded(1, 201.0))
    assert start.cut is None  # b read no marker past its end: no cut yet


def test_a_partial_commit_records_no_cut() -> None:
    c = coordinator()
    c.tick(100.0)
    c.step(HostWriteStatus.of([status("a", 1, 0, 0, 300), status("b", 1, 0, 0, 200)]), 100.0)
    c.tick(200.0)
    c.step(status("a", 2, 0, 7, 300), 200.0)
    ready = c.tick(200.0 + CommitSettings().write_timeout_s + 1)  # b never reports
    (commit,) = [e for e in ready if isinstance(e, CommitTable)]
    assert commit.metadata.partial and commit.metadata.cut_lsn is None


def test_a_reader_picks_the_newest_cut_every_table_reached() -> None:
    from rayconnect.tables.consistent_cut import NoCutError, pick_cut

    histories = {
        # orders committed the round of cut 300; lines not yet (its coordinator died between)
        "orders": [(0, None), (1, 100), (2, 200), (3, None), (4, 300)],
        "lines": [(0, None), (1, 100), (2, 200)],
        # no rows in the last rounds: its offsets moved past the markers all the same
        "users": [(5, 100), (6, 200), (7, 300)],
    }
    cut = pick_cut(histories)
    assert cut.lsn == 200
    assert cut.versions == {"orders": 2, "lines": 2, "users": 6}
    with pytest.raises(NoCutError, match="lines"):
        pick_cut({"orders": [(1, 100)], "lines": [(0, None)]})
