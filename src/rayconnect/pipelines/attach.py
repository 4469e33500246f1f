"""``rc.attach(name)``: a handle on a running pipeline of either kind, found by name."""

from __future__ import annotations

from rayconnect.actors import names
from rayconnect.actors.directory import get_actor
from rayconnect.errors import PipelineNotFoundError
from rayconnect.pipelines.sink import PipelineHandle
from rayconnect.pipelines.source import SourcePipelineHandle
from rayconnect.runtime import ensure_ray, task_actor_names


def attach(name: str, *, address: str | None = None) -> PipelineHandle | SourcePipelineHandle:
    """A ``PipelineHandle`` for a sink pipeline (found by its coordinator), else a
    ``SourcePipelineHandle`` for a source pipeline (found by its tasks), from any process
    connected to the same Ray."""
    ensure_ray(address or "auto")
    if get_actor(names.coordinator(name)) is not None:
        return PipelineHandle(name)
    if task_actor_names(name):
        return SourcePipelineHandle(name)
    raise PipelineNotFoundError(f"no running pipeline named {name!r}")
