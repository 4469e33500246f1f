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


# -- found by the simulation (test_simulation_cuts.py) ---------------------------------------

SMALL = CommitSettings(consistent_cuts=True, flush_max_records=3, flush_max_bytes=10**6)


def steering(ready: list[Any]) -> list[str]:
    return [type(e).__name__ for e in ready if type(e).__name__ in ("Pause", "Resume", "Seek")]


def test_the_read_ahead_bound_does_not_pause_the_reader_short_of_the_cut() -> None:
    """The held batches the cut takes counted towards the read-ahead bound: the reader was
    paused after 3 of the 6 records up to the cut's marker, the round never reached its
    end, timed out, and the next round with that cut did the same - nothing was committed."""
    p = Participant(KEY, SMALL)  # a fresh participant: its marks come as it reads
    p.step(StartCommit(1, 1, {KEY: 0}, cut=100), 0.0)
    assert steering(feed(p, 0, 3)) == []  # the cut may take these: no pause
    ready = feed(p, 3, 3, cut=100)
    assert steering(ready) == []  # the cut takes them all
    ready += p.step(EndCommit(1, 1), 0.0)
    assert [(f.first_offset, f.next_offset) for f in flushes(ready)] == [(0, 3), (3, 6)]
    assert steering(feed(p, 6, 3, cut=200)) == ["Pause"]  # past the cut: bounded


def test_with_no_cut_named_the_reader_reads_on_to_a_marker() -> None:
    """A round without a cut held 3 records, paused the reader at the bound and reported no
    marker: no cut could be named, and the next round let one batch in - a batch a round."""
    p = Participant(KEY, SMALL)
    p.step(StartCommit(1, 1, {KEY: 0}), 0.0)
    assert steering(feed(p, 0, 3)) == []  # past the bound, but no marker read yet
    assert steering(feed(p, 3, 3)) == []
    assert steering(feed(p, 6, 1, cut=100)) == ["Pause"]  # a marker: the next cut can be named
    (status,) = statuses(p.step(EndCommit(1, 1), 0.0))
    assert status.cut_seen == 100 and status.cut_first == 100


def test_no_cut_is_named_below_a_partition_s_first_marker() -> None:
    """After a partial commit ``a`` stands at the end of cut 300, ``b`` still at that of cut
    100. ``b`` read the marker of 200, ``a`` its next one (400): naming the lowest, 200,
    ended ``a`` where it stood - a version labelled cut 200 holding transactions up to 300 of
    ``a`` (and the table's cut went back from 300 to 200). The cut must be at or past every
    partition's first marker past its end; START tells the partitions that floor, so that
    ``b`` reads on to it."""
    assert next_cut(["a", "b"], {"a": 400, "b": 200}, None, {"a": 400, "b": 200}) is None
    assert next_cut(["a", "b"], {"a": 500, "b": 400}, None, {"a": 400, "b": 200}) == 400
    c = coordinator()
    c.tick(100.0)
    ready = c.step(
        HostWriteStatus.of(
            [
                WriteStatus(1, 1, "a", (), 0, 0, 0, cut_seen=400, cut_first=400),
                WriteStatus(1, 1, "b", (), 0, 0, 0, cut_seen=200, cut_first=200),
            ]
        ),
        100.0,
    )
    (start,) = starts(ready)
    assert (start.cut, start.floor) == (None, 400)
    p = Participant(KEY, SMALL)
    p.step(StartCommit(1, 1, {KEY: 0}, floor=400), 0.0)
    assert steering(feed(p, 0, 3, cut=200)) == []  # below the floor: read on
    assert steering(feed(p, 3, 1, cut=400)) == ["Pause"]


def test_records_held_for_rounds_without_a_marker_are_said_in_the_status() -> None:
    p = Participant(KEY, CFG)
    for txn in range(1, 5):
        p.step(StartCommit(1, txn, {KEY: 0}), 0.0)
        if txn == 1:
            feed(p, 0, 5)  # a source that writes no markers
        p.step(EndCommit(1, txn), 0.0)
        p.step(AckCommit(1, txn, 0, {KEY: 0}), 0.0)
        assert (p.status().last_error is None) == (txn < 3)
    error = p.status().last_error
    assert error is not None and "5 records held past offset 0" in error and "cut_markers" in error


def test_a_marker_past_a_gap_is_not_kept() -> None:
    """The marker of a batch that came past a gap (dropped: the reader seeks back) was kept,
    so the marks lacked those in the gap: the cut of 200 ended after the marker of 100,
    leaving transactions up to 200 out of a version labelled 200."""
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, 1, {KEY: 0}, cut=200), 0.0)
    feed(p, 4, 2, cut=300)  # offsets 0-3 were lost on the way: seek back
    feed(p, 0, 2, cut=100)
    assert p.step(EndCommit(1, 1), 0.0) == []  # the end of cut 200 is not known yet
    (flush,) = flushes(feed(p, 2, 2, cut=200))
    assert (flush.first_offset, flush.next_offset) == (0, 4)


def test_a_recovered_coordinator_names_no_cut_at_or_below_the_table_s() -> None:
    """A new coordinator knew no committed cut: with a partition that came back (retired,
    then added) behind the table's cut of 300, it named 200 - the table's cut went back,
    and the version labelled 200 held the other partitions' transactions up to 300. The
    actor passes the newest ``rayconnect.cut_lsn`` (``recover``/``table_reloaded``)."""
    c = Coordinator("p", ["a", "b"], CommitSettings(consistent_cuts=True))
    c.recover(1, {"a": 0, "b": 0}, 0.0, committed_cut=300)
    c.tick(100.0)
    ready = c.step(
        HostWriteStatus.of([status("a", 1, 0, 0, 400), status("b", 1, 0, 0, 200)]), 100.0
    )
    (start,) = starts(ready)
    assert start.cut is None


def test_the_committed_cut_is_in_the_status_from_the_table_and_from_commits() -> None:
    """What the actor reads from the table (``RoundCommitter.committed_cut``) at recover and
    after a failed commit, and each commit's cut: ``status().committed_cut``."""

    def round_of_cut_200(c: Coordinator) -> None:
        c.tick(100.0)
        c.step(HostWriteStatus.of([status("a", 1, 0, 0, 300), status("b", 1, 0, 0, 200)]), 100.0)
        c.tick(200.0)
        ready = c.step(
            HostWriteStatus.of([status("a", 2, 0, 7, 300), status("b", 2, 0, 4, None)]), 200.0
        )
        (commit,) = [e for e in ready if isinstance(e, CommitTable)]
        assert commit.metadata.cut_lsn == 200

    c = Coordinator("p", ["a", "b"], CommitSettings(consistent_cuts=True))
    c.recover(1, {"a": 0, "b": 0}, 0.0, committed_cut=150)
    assert c.status().committed_cut == 150
    round_of_cut_200(c)
    c.commit_succeeded(1, 201.0)
    assert c.status().committed_cut == 200
    # a commit reported failed that landed after all: the table's cut, read at the reload
    c = Coordinator("p", ["a", "b"], CommitSettings(consistent_cuts=True))
    c.recover(1, {"a": 0, "b": 0}, 0.0, committed_cut=150)
    round_of_cut_200(c)
    c.commit_failed("no answer", 201.0)
    c.table_reloaded({"a": 7, "b": 4}, 202.0, committed_cut=200)
    assert c.status().committed_cut == 200


def test_the_no_markers_error_ends_when_markers_come() -> None:
    p = Participant(KEY, CFG)
    for txn in range(1, 4):
        p.step(StartCommit(1, txn, {KEY: 0}), 0.0)
        if txn == 1:
            feed(p, 0, 5)  # no marker
        p.step(EndCommit(1, txn), 0.0)
        p.step(AckCommit(1, txn, 0, {KEY: 0}), 0.0)
    held = p.status()
    assert held.unmarked and held.unmarked_rounds == 3 and held.last_error is not None
    p.step(StartCommit(1, 4, {KEY: 0}), 0.0)
    feed(p, 5, 1, cut=100)  # the source writes markers after all
    p.step(EndCommit(1, 4), 0.0)
    now = p.status()
    assert not now.unmarked and now.unmarked_rounds == 0 and now.last_error is None


def test_a_version_s_cut_is_its_pipeline_s() -> None:
    from rayconnect.tables.consistent_cut import recorded_cut

    info = {"rayconnect.pipeline": "p", "rayconnect.cut_lsn": "42"}
    assert recorded_cut(info, "p") == 42
    assert recorded_cut(info, "other") is None  # another pipeline's version
    assert recorded_cut({"rayconnect.pipeline": "p"}, "p") is None  # a partial commit
    assert recorded_cut(None, "p") is None
