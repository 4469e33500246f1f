"""Kill a pipeline's named actors the way failures kill them, so that Ray restarts them.

Two ways, because they fail differently: ``ray.kill`` (no_restart=False) ends the actor
through Ray, which knows at once; SIGKILL of the actor's worker process is a crash Ray
learns about from the dead process. Used by the demo's chaos step and by the tests.
"""

from __future__ import annotations

import os
import signal
import time

import ray

from rayconnect.actors.names import NAMESPACE

HOW = ("ray.kill", "sigkill")


def actor_pid(
    name: str, dashboard: str | None, namespace: str = NAMESPACE, timeout_s: float = 30.0
) -> int:
    """The PID of a live named actor, from Ray's state API at ``dashboard`` (http://host:port)."""
    from ray.util.state import list_actors

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = list_actors(
            address=dashboard, filters=[("name", "=", name), ("state", "=", "ALIVE")]
        )
        alive = [a for a in alive if a.ray_namespace == namespace and a.pid]
        if alive:
            return int(alive[0].pid)
        time.sleep(0.2)
    raise TimeoutError(f"actor {name!r} not alive after {timeout_s} s")


def kill_actor(name: str, how: str, dashboard: str | None = None) -> int | None:
    """End a named actor so that Ray restarts it; the PID killed (SIGKILL) or None (ray.kill)."""
    if how == "ray.kill":
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
        return None
    if how == "sigkill":
        pid = actor_pid(name, dashboard)
        os.kill(pid, signal.SIGKILL)
        return pid
    raise ValueError(f"how must be one of {HOW}, got {how!r}")
