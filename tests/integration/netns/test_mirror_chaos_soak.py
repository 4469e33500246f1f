"""The database mirror's chaos soak (bench/mirror_chaos_soak.py) for 4 minutes: Postgres in
a network namespace of its own, one fault of each kind 5-10 s apart, then random ones (kills
of every role, Postgres crashes, a network cut between Postgres and the source, broker
SIGKILLs, an on-demand snapshot interrupted, truncates) under the mirror workload's write
load; after each fault and at the end every lake table equals ``SELECT *``. The 30 minutes
(a fault every 10-30 s, a bigger table to snapshot) are run on purpose
(``python bench/mirror_chaos_soak.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures.netns import why_no_namespaces

from rayconnect.demo.local_postgres import installed

sys.path.insert(0, str(Path(__file__).parents[3] / "bench"))

import mirror_chaos_soak  # noqa: E402

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(1200)
def test_four_minutes_of_faults_leave_every_table_equal_to_select_star(tmp_path):
    reason = why_no_namespaces() or (None if installed() else "PostgreSQL 15 not installed")
    if reason:
        pytest.skip(reason)
    args = mirror_chaos_soak.parse(
        ["--minutes", "4", "--seed", "7", "--each-kind-first", "--gap", "5,10",
         "--big-rows", "20000", "--out", str(tmp_path)]
    )  # fmt: skip
    report = mirror_chaos_soak.soak(args)
    assert report["violations"] == []
    assert set(report["faults_by_kind"]) == set(mirror_chaos_soak.KINDS), report["faults"]
    assert all(f["recovery_s"] is not None and "error" not in f for f in report["faults"])
    for f in report["faults"]:  # a snapshot killed midway was redone to its end
        if f["kind"] == "snapshot":
            assert 0 < f["offsets_at_kill"] < f["keys_to_read"] == f["keys_read"], f
    assert report["final"]["mirrored"] and report["final"]["changes"] > 1000
