"""What ``status`` shows of a Spark that failed to start: the exception lines of an error that
crossed Ray and py4j, not the first and last lines of a 60-line Java trace."""

from __future__ import annotations

from rayconnect.actors.writer import _causes

RAYDP_START_FAILURE = """ray::RayDPSparkMaster.start_up() (pid=20173, ip=192.0.2.2, actor_id=b89d)
  File "/venv/lib/python3.11/site-packages/raydp/spark/ray_cluster_master.py", line 72
    self._create_app_master(extra_classpath)
py4j.protocol.Py4JJavaError: An error occurred while calling o0.startUpAppMaster.
: java.lang.IllegalArgumentException: Actor of name RAY_APP_MASTER exists
\tat io.ray.shaded.com.google.common.base.Preconditions.checkArgument(Preconditions.java:143)
\tat io.ray.api.call.ActorCreator.remote(ActorCreator.java:48)
\tat java.base/java.lang.Thread.run(Thread.java:840)
Caused by: java.io.IOException: the raylet went away
\tat io.ray.runtime.Foo.bar(Foo.java:1)"""


def test_the_exception_lines_of_a_java_trace_are_kept_in_order() -> None:
    assert _causes(RuntimeError(RAYDP_START_FAILURE)) == (
        "py4j.protocol.Py4JJavaError: An error occurred while calling o0.startUpAppMaster.; "
        "java.lang.IllegalArgumentException: Actor of name RAY_APP_MASTER exists; "
        "Caused by: java.io.IOException: the raylet went away"
    )


def test_an_error_without_exception_lines_keeps_its_first_and_last_lines() -> None:
    assert _causes(ValueError("no executor fits")) == "no executor fits"
    assert _causes(ValueError("first\n  middle\nlast")) == "first ... last"
    assert len(_causes(RuntimeError("X: " + "y" * 1000))) <= 400
