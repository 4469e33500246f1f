"""The chaos soak (bench/chaos_soak.py) for 5 minutes: a random fault every 10-30 s under a
sink and a source pipeline across test hosts; no violation, every fault recovered. The full
30 minutes is run on purpose (``python bench/chaos_soak.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures.netns import why_no_namespaces

sys.path.insert(0, str(Path(__file__).parents[3] / "bench"))

import chaos_soak  # noqa: E402

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(1200)
def test_five_minutes_of_random_faults_break_nothing(tmp_path):
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    report = chaos_soak.soak(chaos_soak.parse(["--minutes", "5", "--out", str(tmp_path)]))
    assert report["violations"] == []
    assert report["faults"], "no fault was injected"
    assert all(f["recovery_s"] is not None for f in report["faults"]), report["faults"]
    final = report["final"]
    assert final["table_rows"] + final["broker_lost_offsets"] == final["high_watermarks"] > 0
