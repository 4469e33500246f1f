"""The one door to Ray's private parts (pinned: ``ray==2.60.0`` in pyproject.toml).

Why they are used at all: Ray has no public API for these four needs, and each has been
stable across the 2.x releases we ran. Why one door: a Ray upgrade that moves or renames one
of them breaks here, in one small module the upgrade's author reads first, not in the actor
that happened to call it. Everything else in rayconnect uses Ray's public API only.

- the GCS key-value store (``ray.experimental.internal_kv._internal_kv_*``): what an actor's
  incarnation must tell the next one outlives the process, and the GCS is the one store
  every node of the cluster shares without extra configuration;
- an actor handle's id (``ActorHandle._actor_id``): two handles to the same actor compare
  unequal, the id is what identifies the actor;
- this process's node (``ray._private.worker._global_node``): where Ray writes its logs (the
  Spark JVMs log beside them) and its session directory (the benchmarks read it);
- the class under a library's ``@ray.remote`` class (``ActorClass.__ray_metadata__``):
  RayDP's master actor gets its JVM's Ray options from one method, overridden in a subclass;
- ``ray._private.label_utils.validate_label_selector``: Ray's own check of a node label
  selector, so a bad selector is a ConfigError at start, worded as Ray words it;
- ``ray._private.services.ConsolePopen``: how a local ``ray.init`` starts Ray's own processes
  (GCS, raylet, dashboard); :func:`ray_processes_apart` starts them in a session of their own,
  so a signal to the caller's process group (``timeout``, a supervisor) does not end them.

And one gap in Ray's typing, bridged here too: mypy does not apply class decorators, so to
it a ``@ray.remote`` class is still the plain class (no ``.options``), and Ray's own
``ActorClass[T]``/``ActorHandle[T]`` do not type an actor's methods (``.method.remote()``).
:func:`actor_class` makes an actor class what it is to Ray's callers: untyped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rayconnect.errors import RayUnavailableError


def kv_get(key: bytes, namespace: str | None = None) -> bytes | None:
    """The value stored under ``key`` in the GCS key-value store (None if absent)."""
    from ray.experimental.internal_kv import _internal_kv_get

    value = _internal_kv_get(key, namespace=namespace)
    return None if value is None else bytes(value)


def kv_put(key: bytes, value: bytes, namespace: str | None = None) -> None:
    """Store ``value`` under ``key``, replacing what was there."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, value, overwrite=True, namespace=namespace)


def kv_del(key: bytes, namespace: str | None = None) -> None:
    from ray.experimental.internal_kv import _internal_kv_del

    _internal_kv_del(key, namespace=namespace)


def kv_keys(prefix: bytes, namespace: str | None = None) -> list[bytes]:
    """The keys starting with ``prefix``."""
    from ray.experimental.internal_kv import _internal_kv_list

    return [bytes(k) for k in _internal_kv_list(prefix, namespace=namespace)]


def actor_id(handle: Any) -> str:
    """The hex id of the actor a handle points to: equal for every handle to one actor."""
    return str(handle._actor_id.hex())


def _node() -> Any:
    import ray._private.worker

    return getattr(ray._private.worker, "_global_node", None)


def logs_dir() -> str | None:
    """Where Ray writes this node's logs (None outside a Ray driver or worker)."""
    node = _node()
    return None if node is None else str(node.get_logs_dir_path())


def session_dir() -> str:
    """This Ray session's directory (``ray.init`` must have run in this process)."""
    node = _node()
    if node is None:
        raise RayUnavailableError("ray.init() has not run in this process")
    return str(node.get_session_dir_path())


def label_selector_problem(selector: dict[str, str]) -> str | None:
    """Why Ray would reject ``selector`` as a node label selector (None if it accepts it)."""
    from ray._private.label_utils import validate_label_selector

    problem = validate_label_selector(selector)
    return None if problem is None else str(problem)


def remote_class_body(remote: Any) -> type:
    """The plain class under a ``@ray.remote`` class (``ActorClass.__ray_metadata__``), to
    subclass a library's actor and override one method (RayDP's master: its JVM's namespace)."""
    body: type = remote.__ray_metadata__.modified_class.__ray_actor_class__
    return body


def actor_class(cls: type) -> Any:
    """A ``@ray.remote`` class as the ``ActorClass`` it is at run time (``.options``)."""
    return cls


@contextlib.contextmanager
def ray_processes_apart() -> Iterator[None]:
    """While inside, a local ``ray.init`` starts Ray's processes in a session (and process
    group) of their own. Why: a supervisor stops a command by signalling its whole process
    group (``timeout``, many process managers); Ray's processes in that group would die with
    the command, before it could commit its last round. Ray still ties each of them to this
    process (PDEATHSIG), and ``ray.shutdown`` at exit still ends them."""
    from ray._private import services

    started_by_ray = services.ConsolePopen

    class _Apart(started_by_ray):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    setattr(services, "ConsolePopen", _Apart)  # noqa: B010 - mypy: a class cannot be assigned
    try:
        yield
    finally:
        setattr(services, "ConsolePopen", started_by_ray)  # noqa: B010
