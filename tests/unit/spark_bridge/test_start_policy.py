"""``spark.start: when_needed``: Spark starts once writes made in the writer's process keep
it busy for a share of a window - never on a few slow writes, never before a whole window."""

from __future__ import annotations

import pytest

from rayconnect.config.spark import SparkSettings
from rayconnect.errors import ConfigError
from rayconnect.spark_bridge.start_policy import BusyWindow


def test_no_verdict_to_start_before_a_whole_window_has_passed() -> None:
    busy = BusyWindow(window_s=10, fraction=0.8)
    busy.wrote(0.0, 9.5)  # writing all the time, but only 9.5 s so far
    assert not busy.verdict(9.5).start
    busy.wrote(9.5, 10.0)
    verdict = busy.verdict(10.0)
    assert verdict.start and "10.0 s of the last 10 s" in verdict.reason


def test_a_steady_load_below_the_share_never_starts_spark() -> None:
    busy = BusyWindow(window_s=10, fraction=0.8)
    for second in range(60):  # 0.7 s of every second spent writing
        busy.wrote(second, second + 0.7)
        assert not busy.verdict(second + 1).start
    assert busy.busy_s(60) == pytest.approx(7.0)


def test_a_load_that_grows_starts_spark_once_the_window_is_busy_enough() -> None:
    busy = BusyWindow(window_s=10, fraction=0.8)
    for second in range(20):
        busy.wrote(second, second + 0.3)
    started_at = None
    for tenth in range(200, 400):  # from 20 s on, writing 0.09 of every 0.1 s
        now = tenth / 10
        busy.wrote(now, now + 0.09)
        if busy.verdict(now + 0.09).start:
            started_at = now
            break
    # the window must hold >= 8 s of writing: 0.9 of it at the new pace, from 20 s on,
    # with the old writes (0.3 of each second) counted until they leave the window
    assert started_at is not None and 27.0 <= started_at <= 29.5


def test_writes_older_than_the_window_count_only_for_their_part_inside() -> None:
    busy = BusyWindow(window_s=10, fraction=0.5)
    busy.wrote(0.0, 8.0)
    assert busy.busy_s(8.0) == pytest.approx(8.0)
    assert busy.busy_s(14.0) == pytest.approx(4.0)  # [4, 8] of it is inside [4, 14]
    assert busy.busy_s(18.0) == 0.0
    assert not busy.verdict(18.0).start


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        BusyWindow(window_s=0, fraction=0.5)
    with pytest.raises(ValueError):
        BusyWindow(window_s=10, fraction=1.5)
    with pytest.raises(ValueError, match="before it starts"):
        BusyWindow(window_s=10, fraction=0.5).wrote(2.0, 1.0)


def test_spark_settings_check_the_start_settings() -> None:
    assert SparkSettings().start == "when_needed"
    assert SparkSettings(start="when_needed").start_when_busy == 0.8
    with pytest.raises(ConfigError, match="start_when_busy"):
        SparkSettings(start_when_busy=0)
    with pytest.raises(ConfigError, match="busy_window_s"):
        SparkSettings(busy_window_s=0)
