"""The coordinator's housekeeping (protocol/housekeeping.py): probes, upkeep and give-up as
chores of a pure machine, time as an input."""

from __future__ import annotations

import pytest

from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.housekeeping import (
    ROUNDS,
    TABLE_STORE,
    Housekeeping,
    ProbeStore,
    RunUpkeep,
    StopRounds,
)
from rayconnect.protocol.upkeep import (
    CompactSettings,
    Job,
    LogSettings,
    RouteUpkeep,
    UpkeepSchedule,
)


def housekeeping(give_up_after_s: float | None = 60.0) -> Housekeeping:
    schedule = UpkeepSchedule(
        CompactSettings(min_files=2, every_s=10.0), LogSettings(tidy_every_s=100.0), now=0.0
    )
    return Housekeeping(schedule, give_up_after_s, now=0.0)


def test_one_probe_at_a_time_and_a_silent_one_counts_as_failing() -> None:
    h = housekeeping()
    assert h.tick(0.0) == [ProbeStore(5.0)]
    assert h.tick(1.0) == [] and h.next_deadline() == 5.0
    assert h.tick(5.0) == [] and h.describe(5.0) == ["table store failing for 0 s: no answer"]
    assert h.tick(9.0) == []  # still out: no second probe
    assert h.probe_finished(None, now=10.0) == [] and h.outages == ()
    assert h.next_deadline() == 12.0
    assert h.tick(12.0) == [ProbeStore(5.0)]
    h.probe_finished("503 Slow Down", now=12.5)
    assert [o.reason for o in h.outages] == ["503 Slow Down"]


def test_upkeep_runs_only_once_the_rounds_run() -> None:
    h = housekeeping()
    h.tick(0.0)
    with pytest.raises(ProtocolError):
        h.round_finished(files=5, now=1.0)  # no round before recovery
    assert h.tick(100.0) == []  # tidy due, but the coordinator has not recovered
    assert h.recovered(101.0) == [RunUpkeep(Job.TIDY)]
    h.round_finished(files=2, now=102.0)
    assert h.tick(111.0) == [RunUpkeep(Job.COMPACT)]
    h.upkeep_finished(Job.COMPACT, None, now=112.0)
    h.upkeep_finished(Job.TIDY, "OSError: gone", now=112.0)
    status = h.upkeep_status()
    assert (status.compactions, status.tidies_failed, status.running) == (1, 1, ())


def routed(min_files: dict[str, int]) -> Housekeeping:
    """Housekeeping of a routed sink whose table ``t`` compacts at ``min_files[t]`` files
    (``min_files`` by rule), 10 s apart, and tidies every 100 s; its own table never."""

    def schedule_of(table: str, now: float) -> UpkeepSchedule:
        compact = CompactSettings(min_files=min_files[table], every_s=10.0)
        return UpkeepSchedule(compact, LogSettings(tidy_every_s=100.0), now)

    own = UpkeepSchedule(CompactSettings(enabled=False), LogSettings(tidy_every_s=3600.0), 0.0)
    return Housekeeping(own, None, now=0.0, routes=RouteUpkeep(schedule_of))


def test_route_tables_get_upkeep_each_on_its_own_schedule_one_job_at_a_time() -> None:
    h = routed({"a": 2, "b": 2, "c": 50})
    h.recovered(0.0)
    with pytest.raises(ValueError):
        h.upkeep_finished(Job.COMPACT, None, 1.0, table="a")  # not running
    h.tables_committed({"a": 3, "b": 1}, 5.0)  # each table's clock starts at its first commit
    assert h.tick(14.0) == [] and h.tick(15.0) == [RunUpkeep(Job.COMPACT, "a")]
    h.tables_committed({"b": 1, "c": 49}, 16.0)
    assert h.tick(30.0) == []  # b is due, but a's compaction still runs: one at a time
    h.upkeep_finished(Job.COMPACT, None, 31.0, table="a")
    assert h.tick(31.0) == [RunUpkeep(Job.COMPACT, "b")]
    h.upkeep_finished(Job.COMPACT, None, 32.0, table="b")
    assert h.tick(40.0) == []  # c: 49 files of its 50
    h.tables_committed({"a": 2, "c": 1}, 41.0)
    # a (again) and c are both due: c first, the one after the table served last (b)
    assert h.tick(41.0) == [RunUpkeep(Job.COMPACT, "c")]
    h.upkeep_finished(Job.COMPACT, "CommitFailedError: lost a race", 42.0, table="c")
    assert h.tick(42.0) == [RunUpkeep(Job.COMPACT, "a")]
    h.upkeep_finished(Job.COMPACT, None, 43.0, table="a")
    # 100 s after each table's first commit its tidy is due: one table at a time again
    assert h.tick(105.0) == [RunUpkeep(Job.TIDY, "b")]
    h.upkeep_finished(Job.TIDY, None, 106.0, table="b")
    # c next: its given-up compaction is due again first (one job of a table at a time)
    assert h.tick(116.0) == [RunUpkeep(Job.COMPACT, "c")]
    h.upkeep_finished(Job.COMPACT, None, 117.0, table="c")
    assert h.tick(117.0) == [RunUpkeep(Job.TIDY, "a")]  # then a, and c's tidy after it
    h.upkeep_finished(Job.TIDY, None, 118.0, table="a")
    assert h.tick(118.0) == [RunUpkeep(Job.TIDY, "c")]
    status = h.route_upkeep_status()
    assert {t: (s.compactions, s.compactions_given_up, s.tidies) for t, s in status.items()} == {
        "a": (2, 0, 1),
        "b": (1, 0, 1),
        "c": (1, 1, 0),
    }
    assert status["c"].files_since_compaction == 0 and status["c"].running == ("tidy",)
    assert h.upkeep_status().compactions == 0  # the sink's own table: none


def test_rounds_discarded_without_a_break_give_up_once() -> None:
    h = housekeeping(give_up_after_s=60.0)
    h.recovered(0.0)
    h.probe_finished(None, now=0.1)
    assert h.round_discarded("txn 1: timed out", now=10.0) == []
    h.round_finished(files=0, now=20.0)  # a break: the outage is over
    h.round_discarded("txn 3: conflict", now=30.0)
    assert h.tick(89.0) == [ProbeStore(5.0)]  # probes go on; the store is fine
    h.probe_finished(None, now=89.5)
    assert h.tick(90.0) == [StopRounds(h.gave_up or "")]
    assert (h.gave_up or "").startswith(f"gave up: {ROUNDS} failing for 60 s")
    assert h.tick(200.0) == [] and h.round_discarded("late", now=201.0) == []
    assert h.table_broken("dropped", now=202.0) == []  # the first reason stands


def test_a_broken_table_stops_at_once_and_a_reader_outage_counts_from_its_own_since() -> None:
    h = housekeeping(give_up_after_s=60.0)
    h.recovered(0.0)
    assert h.failing("broker c1", "unreachable", now=50.0, since=-20.0) == [
        StopRounds(
            "gave up: broker c1 failing for 70 s without a break (give_up_after_s=60): unreachable"
        )
    ]
    h = housekeeping(give_up_after_s=None)
    h.failing(TABLE_STORE, "recovery failed", now=0.0)
    assert h.tick(10_000.0) == [ProbeStore(5.0)]  # never gives up
    assert h.table_broken("offsets moved backwards", now=1.0) == [
        StopRounds("table broken: offsets moved backwards")
    ]
    assert h.recovered(2.0) == []  # a recovery that finished after it: nothing to do
