"""protocol/range_watch.py: a split past its log's end is reported after a second look,
once per position."""

from __future__ import annotations

from rayconnect.protocol.range_watch import PastEnd, RangeWatch

A, B = "local/t/0", "local/t/1"


def test_a_position_past_the_end_is_reported_at_the_second_look_once() -> None:
    watch = RangeWatch()
    assert watch.check([(A, 50, 15), (B, 10, 15)]) == []  # first look: maybe a stale mark
    assert watch.check([(A, 50, 15), (B, 10, 15)]) == [PastEnd(A, 50, 15)]
    assert watch.check([(A, 50, 15)]) == [PastEnd(A, 50, 15)]  # not told yet: again
    watch.told(A, 50)
    assert watch.check([(A, 50, 15)]) == []


def test_a_split_that_moves_or_catches_up_starts_over() -> None:
    watch = RangeWatch()
    watch.check([(A, 50, 15)])
    assert watch.check([(A, 60, 15)]) == []  # sought elsewhere: look again
    assert watch.check([(A, 60, 70)]) == []  # the log grew past it
    assert watch.check([(A, 60, 15)]) == []
    assert watch.check([(A, 60, 15)]) == [PastEnd(A, 60, 15)]
    assert watch.check([(A, None, 15), (B, 3, None)]) == []  # nothing known: nothing said


def test_a_refused_split_is_reported_at_once_and_once() -> None:
    watch = RangeWatch()
    assert watch.refused(A, 50)
    watch.told(A, 50)
    assert not watch.refused(A, 50)
    assert watch.refused(A, 7)
