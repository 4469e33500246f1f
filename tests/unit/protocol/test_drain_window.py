"""DrainWindow (protocol/drain_window.py): a backlog told apart from steady traffic, pure."""

from __future__ import annotations

import pytest

from rayconnect.protocol.drain_window import DrainWindow


@pytest.mark.parametrize(
    ("records", "nbytes", "first", "second"),
    [(100, 10_000, (60, 600), (40, 400)), (1_000_000, 1000, (1, 999), (1, 1))],
    ids=["records", "bytes"],
)
def test_reports_within_the_window_add_up_to_a_flush(
    records: int, nbytes: int, first: tuple[int, int], second: tuple[int, int]
) -> None:
    w = DrainWindow(window_s=10.0, records=records, nbytes=nbytes)
    w.drained(*first, now=1.0)
    assert not w.ends_round(1.0)
    w.drained(*second, now=2.0)
    assert w.ends_round(2.0)


def test_reports_older_than_the_window_no_longer_count() -> None:
    w = DrainWindow(window_s=10.0, records=100, nbytes=10_000)
    w.drained(90, 0, now=0.0)
    w.drained(20, 0, now=10.5)  # the 90 expired at 10
    assert not w.ends_round(10.5)
    w.drained(80, 0, now=11.0)
    assert w.ends_round(11.0)
    assert not w.ends_round(30.0)  # everything expired


def test_only_a_report_since_the_last_end_can_end_a_round() -> None:
    """A round that ended on a backlog does not end the next one by the same reports: only
    what was drained after its END (the next round's data) can."""
    w = DrainWindow(window_s=10.0, records=100, nbytes=10_000)
    w.drained(150, 0, now=1.0)
    assert w.ends_round(1.0)
    w.round_ended()
    assert not w.ends_round(1.5)  # the window is full, but nothing new was drained
    w.drained(1, 0, now=2.0)
    assert w.ends_round(2.0)  # still a backlog draining: rounds follow at write speed
