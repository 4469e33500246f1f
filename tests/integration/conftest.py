"""Shared fixtures for tests with real parts: a local Ray that cleans up after itself, and
helpers to build pipelines over the embedded broker and check tables exactly."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import ray
from ray_tmp import cleaned_ray_tmp

_DASHBOARD: str | None = None  # this module's Ray: others may run on the machine too


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """A local Ray for one test module; removes what this Ray left under /tmp/ray."""
    with cleaned_ray_tmp():
        context = ray.init(namespace="rayconnect", log_to_driver=False, include_dashboard=True)
        global _DASHBOARD
        _DASHBOARD = f"http://{context.dashboard_url}"
        try:
            yield
        finally:
            ray.shutdown()


def actor_pid(name: str, namespace: str = "rayconnect", timeout_s: float = 30.0) -> int:
    """The PID of a live named actor, from Ray's state API."""
    from ray.util.state import list_actors

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = list_actors(
            address=_DASHBOARD, filters=[("name", "=", name), ("state", "=", "ALIVE")]
        )
        alive = [a for a in alive if a.ray_namespace == namespace and a.pid]
        if alive:
            return int(alive[0].pid)
        time.sleep(0.2)
    raise TimeoutError(f"actor {name!r} not alive after {timeout_s} s")


def kill_actor(name: str, how: str) -> None:
    """Kill a named actor so that Ray restarts it: ``ray.kill`` or SIGKILL of its process."""
    if how == "ray.kill":
        ray.kill(ray.get_actor(name, namespace="rayconnect"), no_restart=False)
    elif how == "sigkill":
        os.kill(actor_pid(name), signal.SIGKILL)
    else:
        raise ValueError(how)


@pytest.fixture
def kill():
    """``kill(name, "ray.kill" | "sigkill")``: end a named actor so Ray restarts it."""
    return kill_actor
