"""Finding a pipeline's live named actors in Ray's namespace ``rayconnect``.

One listing, used by everything that looks a pipeline's actors up by name - the pipeline
APIs, ``rc.attach``, the CLI and the coordinator (its table-lag gauge asks the readers) - so
they all agree on what a pipeline's actors are.
"""

from __future__ import annotations

from typing import Any

import ray

from rayconnect.actors import names

#: Where a sink pipeline's roles sort in listings (``stop`` ends the enumerator and the
#: coordinator first, then the others together).
_ROLE_ORDER = {"enumerator": 0, "coordinator": 1, "reader": 2, "participants": 3, "writer": 4}


def get_actor(name: str) -> Any | None:
    """The live named actor, or None."""
    try:
        return ray.get_actor(name, namespace=names.NAMESPACE)
    except ValueError:
        return None


def pipeline_actor_names(pipeline: str, role: str | None = None) -> list[str]:
    """Every live named actor of a pipeline (only ``role``'s if given), in this order:
    enumerator, coordinator, readers, participants, writer; source tasks by index."""
    found = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == names.NAMESPACE and names.pipeline_of(a["name"]) == pipeline
    ]
    if role is not None:
        found = [n for n in found if names.role_of(n) == role]
    return sorted(found, key=_listing_key)


def pipeline_actors(pipeline: str, role: str) -> list[Any]:
    """The live actors of a pipeline's ``role`` (one that ends meanwhile is left out)."""
    return [a for a in map(get_actor, pipeline_actor_names(pipeline, role)) if a is not None]


def _listing_key(name: str) -> tuple[int, str, int]:
    role = names.role_of(name) or ""
    last = name.rsplit("/", 1)[1]
    return (
        _ROLE_ORDER.get(role, 9),
        name if not last.isdigit() else name.rsplit("/", 1)[0],
        int(last) if last.isdigit() else 0,
    )
