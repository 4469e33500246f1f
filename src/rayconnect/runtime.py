"""The Ray a pipeline runs in: connecting, finding a pipeline's named actors, waiting on them.

Pipelines are held by named, detached actors in namespace ``rayconnect``, never by the
driver; so every way in (the two pipeline APIs, ``rc.attach``, the CLI) finds a pipeline the
same way: by listing the named actors whose names start with ``<pipeline>/``.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

import ray

from rayconnect.actors import names
from rayconnect.actors.directory import pipeline_actor_names
from rayconnect.errors import RayUnavailableError
from rayconnect.protocol.status import ActorStatus


def ensure_ray(address: str | None = None, *, own_session: bool = False) -> None:
    """Use the Ray this process is connected to, or connect/start one (namespace rayconnect).

    ``own_session``: a Ray started here runs its processes in a session of their own, out of
    this process's group (for the CLI: a supervisor's signal to the group reaches the CLI,
    which commits a last round, but not Ray, which that round needs)."""
    if ray.is_initialized():
        return
    from rayconnect.ray_internals import ray_processes_apart

    with ray_processes_apart() if own_session else contextlib.nullcontext():
        ray.init(address=address, namespace=names.NAMESPACE, log_to_driver=False)


def check_reachable(address: str | None, timeout_s: float = 3.0) -> None:
    """Raise ConnectionError if ``host:port`` does not accept connections: ``ray.init`` to a
    dead address retries for minutes instead of failing."""
    if not address or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise ConnectionError(f"nothing listens at {address}: {e}") from None


def check_ray(address: str | None) -> None:
    """Raise ``RayUnavailableError`` if nothing listens at a Ray ``host:port`` address."""
    try:
        check_reachable(address)
    except ConnectionError as e:
        raise RayUnavailableError(str(e)) from None


def connect(address: str | None) -> None:
    """Connect to a running Ray (``auto`` unless told); ``RayUnavailableError`` if none."""
    if not ray.is_initialized():
        check_ray(address)
        try:
            ensure_ray(address or "auto")
        except (ConnectionError, RuntimeError) as e:  # ray.init finds no cluster
            raise RayUnavailableError(str(e)) from None


def task_actor_names(pipeline: str) -> list[str]:
    """A source pipeline's live ``<pipeline>/task/<i>`` actors, by index."""
    return pipeline_actor_names(pipeline, "task")


def wait_for(
    status: Callable[[], dict[str, Any]],
    predicate: Callable[[dict[str, Any]], bool],
    *,
    what: str,
    timeout_s: float,
    poll_s: float,
    transient: tuple[type[BaseException], ...] = (Exception,),
) -> dict[str, Any]:
    """Poll ``status()`` until ``predicate`` holds; a status call failing with ``transient``
    (an actor restarting) is polled again. TimeoutError names ``what`` and the last status."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            last = status()
            if predicate(last):
                return last
        except transient:
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"{what}: condition not met in {timeout_s} s: {last}")


def actor_statuses(pipeline: str) -> tuple[ActorStatus, ...]:
    """The pipeline's actors with their state (ALIVE, RESTARTING, ...), pid, node and
    restarts, from Ray's state API (``?``/None for each when it has no dashboard)."""
    wanted = pipeline_actor_names(pipeline)
    try:
        from ray.util.state import list_actors

        found = {
            a.name: a
            for a in list_actors(
                address=ray.get_runtime_context().gcs_address,  # never guess among clusters
                filters=[("ray_namespace", "=", names.NAMESPACE)],
                limit=10_000,
                timeout=10,
                detail=True,
            )
            if a.name in wanted and a.state != "DEAD"
        }
    except Exception:  # state API unavailable (no dashboard): names only
        found = {}
    return tuple(
        ActorStatus(
            name=name,
            state=getattr(found.get(name), "state", "?"),
            pid=getattr(found.get(name), "pid", None),
            node=(getattr(found.get(name), "node_id", None) or "")[:8] or None,
            restarts=getattr(found.get(name), "num_restarts", None),
        )
        for name in wanted
    )


class Handle:
    """What both pipeline handles share: a name (so a handle survives actor restarts) and
    waiting on their ``status()``. ``kind`` names the pipeline in errors; a status call
    failing with one of ``transient`` (an actor restarting) is retried."""

    kind = "pipeline"
    transient: tuple[type[BaseException], ...] = (Exception,)

    def __init__(self, name: str) -> None:
        self.name = name

    def status(self, timeout_s: float = 30.0) -> Any:
        raise NotImplementedError

    def wait_for(
        self,
        predicate: Callable[[Any], bool],
        timeout_s: float = 120.0,
        poll_s: float = 0.5,
    ) -> Any:
        """Poll ``status()`` until ``predicate(status)`` holds; raise TimeoutError otherwise."""
        return wait_for(
            self.status,
            predicate,
            what=f"{self.kind} {self.name!r}",
            timeout_s=timeout_s,
            poll_s=poll_s,
            transient=self.transient,
        )
