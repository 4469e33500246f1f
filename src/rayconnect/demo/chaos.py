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


def actor_pid(name: str, namespace: str = NAMESPACE, timeout_s: float = 30.0) -> int:
    """The PID of a live named actor, asked of the actor itself (``__ray_call__`` runs a
    function on it). Not through Ray's state API: that needs the dashboard of the Ray the
    actor runs in, which a driver connected to an existing Ray (``ray start``, RAY_ADDRESS)
    may not know or reach; a call that waits for a restarting actor also returns the PID of
    the new process, never the dead one's."""
    actor = ray.get_actor(name, namespace=namespace)
    deadline = time.monotonic() + timeout_s
    while True:
        pid: ray.ObjectRef[int] = actor.__ray_call__.remote(_own_pid)
        try:
            return ray.get(pid, timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.ActorUnavailableError:
            # restarting (a kill moments ago, on a loaded machine): Ray refuses the call
            # rather than queueing it; ask again until the successor answers
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _own_pid(_actor: object) -> int:
    return os.getpid()


def kill_actor(name: str, how: str) -> int | None:
    """End a named actor so that Ray restarts it; the PID killed (SIGKILL) or None (ray.kill)."""
    if how == "ray.kill":
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
        return None
    if how == "sigkill":
        pid = actor_pid(name)
        os.kill(pid, signal.SIGKILL)
        return pid
    raise ValueError(f"how must be one of {HOW}, got {how!r}")
