"""The demo's live view and verdict, without IO: what it prints from pipeline statuses, how it
counts rounds over coordinator restarts, when it calls a kill recovered, and when the demo
calls a table exactly once."""

from __future__ import annotations

import io

from status_sample import pipeline_status

from rayconnect.demo.sink import DemoResult
from rayconnect.demo.source import SourceDemoResult
from rayconnect.demo.view import LiveView
from rayconnect.protocol.status import PipelineStatus

KEYS = [f"local/demo-events/{p}" for p in range(3)]


def _status(epoch: int, rounds: int, offsets: list[int], hws: list[int]) -> PipelineStatus:
    return pipeline_status(
        epoch=epoch,
        rounds={"committed": rounds, "partial": 0, "discarded": 1},
        offsets=dict(zip(KEYS, offsets, strict=True)),
        lag={k: h - o for k, o, h in zip(KEYS, offsets, hws, strict=True)},
        table_version=7,
    )


def test_a_line_shows_rounds_records_lag_per_partition_and_version() -> None:
    out = io.StringIO()
    view = LiveView(out)
    view.status(_status(1, 4, [100, 200, 1_300], [100, 250, 2_500]), produced=4_000)
    line = out.getvalue()
    assert "rounds 4 committed / 1 discarded" in line
    assert "records 1,600 committed / 4,000 produced" in line
    assert "lag p0=0 p1=50 p2=1,200" in line
    assert "table v7" in line
    assert line.count("\n") == 1 and "\r" not in line


def test_rounds_add_up_over_coordinator_epochs_and_partitions_sort_numerically() -> None:
    view = LiveView(io.StringIO())
    view.status(_status(1, 5, [1, 1, 1], [1, 1, 1]), produced=3)
    view.status(_status(2, 0, [1, 1, 1], [1, 1, 1]), produced=3)  # restarted: counts from 0
    view.status(_status(2, 2, [1, 1, 1], [1, 1, 1]), produced=3)
    assert view.rounds == (7, 2)
    out = io.StringIO()
    many = LiveView(out)
    keys = [f"local/t/{p}" for p in (10, 2, 1)]
    many.status(pipeline_status(lag=dict.fromkeys(keys, 0)), produced=0)
    assert "lag p1=0 p2=0 p10=0" in out.getvalue()


def test_a_kill_is_recovered_once_everything_produced_before_it_is_committed() -> None:
    out = io.StringIO()
    view = LiveView(out)
    view.killed("writer", "SIGKILL", "pid 42", produced=900)
    assert "CHAOS   SIGKILL writer (pid 42)" in out.getvalue()
    view.status(_status(1, 3, [300, 300, 299], [400, 400, 400]), produced=1_200)
    assert "RECOVERED" not in out.getvalue() and view.recoveries == {}
    view.status(_status(1, 4, [300, 300, 300], [400, 400, 400]), produced=1_200)
    assert "RECOVERED from the writer kill" in out.getvalue()
    assert list(view.recoveries) == ["writer"]


def _result(**changes) -> DemoResult:
    wm = dict.fromkeys(KEYS, 10)
    fields = dict(
        rows=30,
        distinct=30,
        offsets=dict(wm),
        expected=dict(wm),
        produced=dict(wm),
        exact=True,
        version=5,
        elapsed_s=1.0,
        table="/t",
    )
    return DemoResult(**{**fields, **changes})


def test_exactly_once_needs_rows_distinct_offsets_and_produced_to_match_the_watermarks() -> None:
    assert _result().ok
    assert not _result(rows=31).ok  # a duplicate
    assert not _result(distinct=29, rows=29).ok  # a record missing
    assert not _result(exact=False).ok  # right counts, wrong offsets
    assert not _result(offsets={**dict.fromkeys(KEYS, 10), KEYS[0]: 9}).ok  # txn behind
    assert not _result(produced={**dict.fromkeys(KEYS, 10), KEYS[2]: 11}).ok  # broker lost one


def _source(**changes) -> SourceDemoResult:
    fields = dict(
        partitions=2,
        per_partition=3,
        seqs={0: [0, 1, 2], 1: [0, 1, 2]},
        offsets={'{"generator":0}': {"seq": 2}, '{"generator":1}': {"seq": 2}},
        written=7,
    )
    return SourceDemoResult(**{**fields, **changes})


def test_source_exactly_once_needs_each_partition_once_in_order_and_offsets_at_the_end() -> None:
    assert _source().ok and _source().visible == 6
    assert not _source(seqs={0: [0, 1, 2], 1: [0, 1, 1, 2]}).ok  # a duplicate
    assert not _source(seqs={0: [0, 2, 1], 1: [0, 1, 2]}).ok  # out of order
    assert not _source(seqs={0: [0, 1, 2]}).ok  # a partition missing
    assert not _source(offsets={'{"generator":0}': {"seq": 2}}).ok  # an offset not committed
    assert not _source(offsets={'{"generator":0}': {"seq": 2}, '{"generator":1}': {"seq": 1}}).ok
