"""The simulated sink (test_simulation.py) with consistent cuts (protocol/cut_marks.py).

The same world, faults and invariants I1-I4, but the coordinators and participants run with
``consistent_cuts`` and the source writes cut markers: each ``produce`` is one database
transaction (a fresh LSN) into one partition, and now and then a marker with a higher LSN
goes into EVERY partition at once (one Kafka transaction). The reader ends each piece at a
marker at most and names it (``cut_lsn``); a marker is no row of the table.

Added invariants (I5): a version whose metadata has ``cut_lsn=L`` ends every partition it
covers right after that partition's last marker with LSN <= L (at 0 when none), so the
table holds exactly the transactions <= L; a partial version has no cut; the table's cut
never goes backwards. Liveness: with faults stopped and a last marker written, every record
is committed.
"""

from __future__ import annotations

import random
from collections import defaultdict

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from test_simulation import (
    CCFG,
    FAULTS,
    PCFG,
    PipelineSim,
    run_long_schedule,
    stateful_settings,
)

MARKER = True


class CutSim(PipelineSim):
    """``PipelineSim`` whose source writes cut markers and whose sink takes cuts."""

    ccfg = msgspec.structs.replace(CCFG, consistent_cuts=True)
    pcfg = msgspec.structs.replace(PCFG, consistent_cuts=True)
    #: a round takes at most about a read-ahead bound (3 records here) past its cut: a
    #: backlog of markers drains a few a round
    liveness_rounds = 200

    def __init__(self) -> None:
        super().__init__()
        #: each partition's log: (is a marker, LSN) by offset
        self.log: defaultdict[str, list[tuple[bool, int]]] = defaultdict(list)
        self.lsn = 0  # the source database's last commit LSN
        self.checked = 0  # the table's commits I5 has checked
        self.table_cut: int | None = None  # the cut of the newest version that has one
        self.cut_versions = 0

    # -- the source ---------------------------------------------------------------------------

    def is_row(self, key: str, offset: int) -> bool:
        return not self.log[key][offset][0]

    def piece_end(self, key: str, first: int, next_: int) -> int:
        log = self.log[key]
        return next((o + 1 for o in range(first, next_) if log[o][0]), next_)

    def cut_lsn(self, key: str, next_: int) -> int | None:
        marker, lsn = self.log[key][next_ - 1]
        return lsn if marker else None

    def source_step(self, rng: random.Random) -> None:
        if rng.random() < 0.3:
            self.write_marker()
        else:
            super().source_step(rng)

    def source_done(self) -> None:
        self.write_marker()

    #: the liveness check writes a marker after 3 rounds that committed nothing: after a
    #: partial commit, the partitions it moved on need a marker past them before the others
    #: can catch up with a cut (``test_after_a_partial_commit_one_last_marker_is_not_enough``)
    idle_markers = True
    _idle: tuple[int, int] = (-1, 0)  # (commits, liveness rounds since they changed)

    def source_idle(self) -> None:
        commits, rounds = self._idle
        rounds = rounds + 1 if len(self.table.commits) == commits else 0
        if self.idle_markers and rounds >= 3:
            self.write_marker()
            rounds = 0
        self._idle = (len(self.table.commits), rounds)

    def produce(self, k: int, count: int) -> None:
        key = self.keys[k % len(self.keys)]
        self.lsn += 1
        self.log[key].extend([(not MARKER, self.lsn)] * count)
        self.produced[key] += count

    @rule()
    def write_marker(self) -> None:
        """A Kafka transaction ends at a database commit: a marker in every partition."""
        self.lsn += 1
        for key in self.keys:
            self.log[key].append((MARKER, self.lsn))
            self.produced[key] += 1

    # -- invariants ---------------------------------------------------------------------------

    def check(self) -> None:
        super().check()
        self.i5_every_cut_version_holds_exactly_the_transactions_up_to_its_cut()

    def cut_end(self, key: str, cut: int) -> int:
        """Right after ``key``'s last marker with LSN <= ``cut`` (0: none)."""
        ends = [o + 1 for o, (marker, lsn) in enumerate(self.log[key]) if marker and lsn <= cut]
        return max(ends, default=0)

    @invariant()
    def i5_every_cut_version_holds_exactly_the_transactions_up_to_its_cut(self) -> None:
        for c in self.table.commits[self.checked :]:
            cut = c.metadata.cut_lsn
            assert not (c.metadata.partial and cut is not None), c.metadata
            if cut is None:
                continue
            assert self.table_cut is None or cut >= self.table_cut, (self.table_cut, cut)
            self.table_cut = cut
            self.cut_versions += 1
            for key, offset in c.offsets.items():
                log = self.log[key]
                assert offset == self.cut_end(key, cut), (key, cut, offset, log)
                assert all(lsn <= cut for _, lsn in log[:offset]), (key, cut, offset)
                assert all(lsn > cut for _, lsn in log[offset:]), (key, cut, offset)
        self.checked = len(self.table.commits)


CutSim.TestCase.settings = stateful_settings(60)
TestCutSimulation = CutSim.TestCase

schedules = given(
    n=st.integers(min_value=1, max_value=4),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    faults=st.sets(st.sampled_from(FAULTS), min_size=1),
    fault_rate=st.sampled_from([0.05, 0.15, 0.3]),
)


@settings(max_examples=50, derandomize=True, deadline=None)
@schedules
def test_long_random_schedules_with_cuts(
    n: int, seed: int, faults: set[str], fault_rate: float
) -> None:
    """``test_long_random_schedules`` with cut markers and consistent cuts."""
    run_long_schedule(CutSim(), n, seed, faults, fault_rate)


@pytest.mark.slow
@settings(max_examples=2_000, deadline=None)
@schedules
def test_many_long_random_schedules_with_cuts(
    n: int, seed: int, faults: set[str], fault_rate: float
) -> None:
    """The same, many more and not derandomized: a search for bugs."""
    run_long_schedule(CutSim(), n, seed, faults, fault_rate)


def test_cut_versions_are_committed() -> None:
    """The mode commits cuts at all (not only empty rounds): a calm run, markers now and
    then, ends with every record in versions that are cuts."""
    sim = CutSim()
    sim.init(3)
    for step in range(30):
        sim.produce(step, 1 + step % 4)
        if step % 5 == 4:
            sim.write_marker()
        sim.calm_period(20)
        sim.check()
    sim.teardown()
    sim.check()
    assert sim.cut_versions >= 3 and sim.table_cut == sim.lsn


@pytest.mark.xfail(strict=True, reason="known gap: a cut needs a marker past EVERY partition")
def test_after_a_partial_commit_one_last_marker_is_not_enough() -> None:
    """Found by the simulation, not fixed: a partial commit moved some partitions on to the
    source's last marker; the others stay behind it. With no marker after it, the partitions
    in front report none past their end, so no cut is ever named and the rest is never
    committed - until the source writes another marker (any database commit does)."""
    sim = CutSim()
    sim.idle_markers = False
    faults = {"chore", "network", "read_paused", "replay", "retire", "shared", "steer", "stop"}
    run_long_schedule(sim, 4, 5181, faults, 0.15)
