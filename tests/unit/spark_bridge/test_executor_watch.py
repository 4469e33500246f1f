"""The writer's watchdog verdicts (spark_bridge/executor_watch.py), without Spark or Ray."""

from rayconnect.spark_bridge.executor_watch import ExecutorWatch


def test_all_executors_is_healthy():
    assert ExecutorWatch(2, 2, 60).observe(0.0, 2).problem is None


def test_a_short_gap_is_reported_and_restarts_only_after_the_bound():
    watch = ExecutorWatch(2, 2, 60)
    first = watch.observe(100.0, 1)
    assert first.problem.startswith("degraded: 1 of 2") and not first.restart
    assert not watch.observe(159.0, 1).restart
    assert watch.observe(160.0, 1).restart


def test_a_replaced_executor_resets_the_clock():
    watch = ExecutorWatch(2, 2, 60)
    watch.observe(0.0, 1)
    assert watch.observe(30.0, 2).problem is None
    assert not watch.observe(80.0, 1).restart  # a new gap: counted from 80 s
    assert watch.observe(140.0, 0).restart


def test_a_lost_master_restarts_at_once():
    verdict = ExecutorWatch(2, 2, 60).observe(0.0, None)
    assert verdict.restart and "master" in verdict.problem


def test_started_with_fewer_is_degraded_but_never_restarted_for():
    watch = ExecutorWatch(3, 2, 60)
    for t in (0.0, 100.0, 1000.0):
        verdict = watch.observe(t, 2)
        assert not verdict.restart
        assert verdict.problem.startswith("degraded: 2 of 3")
    assert watch.observe(1001.0, 1).problem.startswith("degraded: 1 of 3")
    assert watch.observe(1061.0, 1).restart
