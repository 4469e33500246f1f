"""The upkeep schedule (pure, time as input), its settings' checks, and the reload's check
that offsets never move backwards."""

from __future__ import annotations

import msgspec
import pytest

import rayconnect as rc
from rayconnect.errors import ConfigError
from rayconnect.protocol.upkeep import CompactSettings, Job, LogSettings, UpkeepSchedule
from rayconnect.tables.base import TableBrokenError, check_not_behind


def schedule(**compact: object) -> UpkeepSchedule:
    settings = CompactSettings(**{"min_files": 10, "every_s": 60.0, **compact})  # type: ignore[arg-type]
    return UpkeepSchedule(settings, LogSettings(tidy_every_s=600.0), now=0.0)


def test_compaction_waits_for_files_and_time() -> None:
    s = schedule()
    s.committed(9, 100.0)
    assert s.due(100.0) == []  # 9 < min_files
    s.committed(1, 101.0)
    assert s.due(101.0) == [Job.COMPACT]
    assert s.due(500.0) == []  # one at a time (and tidy: not yet due at 500 < 600)
    s.committed(4, 102.0)  # committed while it ran: not in its snapshot
    s.finished(Job.COMPACT, True, 110.0)
    assert s.status().files_since_compaction == 4
    s.committed(20, 120.0)
    assert s.due(150.0) == []  # 60 s after the last start (101)
    assert s.due(161.0) == [Job.COMPACT]


def test_given_up_compaction_keeps_its_files_and_comes_back() -> None:
    s = schedule()
    s.committed(10, 1.0)
    assert s.due(60.0) == [Job.COMPACT]
    s.finished(Job.COMPACT, False, 61.0, "CommitFailedError: lost to a DELETE")
    status = s.status()
    assert status.compactions_given_up == 1 and status.files_since_compaction == 10
    assert status.last_error == "compact: CommitFailedError: lost to a DELETE"
    assert s.due(100.0) == []
    assert s.due(120.0) == [Job.COMPACT]


def test_tidy_runs_on_its_own_clock_and_compaction_can_be_off() -> None:
    s = schedule(enabled=False)
    s.committed(1000, 1.0)
    assert s.due(599.0) == []
    assert s.due(600.0) == [Job.TIDY]
    assert s.due(1199.0) == []  # running
    s.finished(Job.TIDY, False, 700.0, "boom")
    assert s.due(1199.0) == []
    assert s.due(1200.0) == [Job.TIDY]
    s.finished(Job.TIDY, True, 1201.0)
    assert (s.status().tidies, s.status().tidies_failed) == (1, 1)


def test_finishing_a_job_that_is_not_running_is_a_bug() -> None:
    with pytest.raises(ValueError, match="not running"):
        schedule().finished(Job.COMPACT, True, 1.0)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"compact": {"min_files": 1}}, "min_files"),
        ({"compact": {"target_file_mb": 0}}, "target_file_mb"),
        ({"compact": {"zorder_by": ["offset", "offset"]}}, "twice"),
        ({"compact": {"zorder_by": ["tenant"]}}, "zorder_by: no column"),
        ({"log": {"checkpoint_interval": 0}}, "checkpoint_interval"),
        ({"log": {"log_retention_hours": 0}}, "log_retention_hours"),
    ],
)
def test_bad_settings_are_config_errors(block: dict, message: str) -> None:
    """In Python (a ConfigError naming the setting) and in a pipeline file alike."""
    with pytest.raises(ConfigError, match=message):
        rc.DeltaSink(
            "/tmp/t",
            compact=CompactSettings(**block.get("compact", {})),
            log=LogSettings(**block.get("log", {})),
        )
    with pytest.raises(msgspec.ValidationError, match=message):
        msgspec.convert({"type": "delta", "path": "/t", **block}, rc.DeltaSink)


def test_settings_decode_from_a_pipeline_file_block() -> None:
    sink = msgspec.convert(
        {
            "type": "delta",
            "path": "/tmp/t",
            "compact": {"target_file_mb": 64, "zorder_by": ["partition"]},
            "log": {"checkpoint_interval": 50},
        },
        rc.DeltaSink,
    )
    assert sink.compact == CompactSettings(target_file_mb=64, zorder_by=("partition",))
    assert sink.log.checkpoint_interval == 50 and sink.log.log_retention_hours == 168.0


def test_offsets_moving_backwards_or_vanishing_break_the_table() -> None:
    check_not_behind({"a": 5}, {"a": 5, "b": 1})
    check_not_behind({"a": 5}, {"a": 9})
    with pytest.raises(TableBrokenError, match="a: was 5, now 4"):
        check_not_behind({"a": 5}, {"a": 4})
    with pytest.raises(TableBrokenError, match="a: was 5, now None"):
        check_not_behind({"a": 5}, {})
