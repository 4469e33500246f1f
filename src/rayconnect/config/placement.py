"""Where a sink pipeline's actors and Spark executors run on a Ray cluster.

Every rayconnect actor asks for ``num_cpus=0``, so Ray's default (hybrid) policy never sees
a node fill up and puts them all on the node of whoever creates them: the driver's node,
or the enumerator's for readers. On a cluster that leaves the workers idle, makes one node
carry every reader's network and memory, and lets one lost node take the whole pipeline
down at once. ``Placement`` turns one small setting into Ray actor options:

- ``strategy="spread"`` (default): actors use Ray's ``SPREAD`` strategy and the Spark
  executors a ``SPREAD`` placement group, so reading, buffering and writing are shared by
  the nodes and a lost node takes only its share with it.
- ``strategy="pack"``: each actor on the node of the process that starts it (the driver's;
  the enumerator's for readers: so all on one node), by its ``ray.io/node-id`` label, and a
  ``PACK`` group for the executors: fewest cross-node copies. Not Ray's default policy:
  measured, it scattered zero-CPU actors over all three nodes of a test cluster.
- ``prefer={"participant": {"pool": "ingest"}}``: start that role's actors on the nodes
  whose Ray labels match (``ray start --labels='{"pool": "ingest"}'``; values in Ray's
  selector syntax: ``v``, ``!v``, ``in(a,b)``, ``!in(a,b)``). If no such node is left (it
  was lost), Ray restarts them on any node instead of waiting for one to come back. Ray
  labels, not ``NodeAffinitySchedulingStrategy(soft=True)``: measured on Ray 2.60, soft
  affinity to a node without CPUs did not hold (4 actors pinned to one node landed on 3).

Measured on a 3-node test cluster: bench/README.md ("Placement on a Ray cluster").
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from rayconnect import ray_internals
from rayconnect.errors import ConfigError

Strategy = Literal["spread", "pack"]

#: The roles of a sink pipeline that ``prefer`` may place.
ROLES: tuple[str, ...] = ("coordinator", "enumerator", "writer", "participant", "reader")

_SPARK_GROUP_STRATEGY = {"spread": "SPREAD", "pack": "PACK"}
#: The label Ray gives every node: its id.
NODE_ID_LABEL = "ray.io/node-id"


class Placement(msgspec.Struct, frozen=True):
    """Where the pipeline's actors and Spark executors run (see the module docstring)."""

    #: ``spread``: actors and executors over the alive nodes (Ray's SPREAD); ``pack``: on the node
    #: that starts them, executors in a PACK placement group
    strategy: Strategy = "spread"
    #: role (``coordinator``, ``enumerator``, ``writer``, ``participant``, ``reader``) -> node labels
    #: its actors prefer (``{"pool": "ingest"}``); a selector no alive node matches is a ConfigError
    #: at start
    prefer: dict[str, dict[str, str]] = {}

    def __post_init__(self) -> None:
        if self.strategy not in _SPARK_GROUP_STRATEGY:
            raise ConfigError(
                f"placement.strategy {self.strategy!r}: use one of {sorted(_SPARK_GROUP_STRATEGY)}"
            )
        for role, selector in self.prefer.items():
            if role not in ROLES:
                raise ConfigError(f"placement.prefer: unknown role {role!r}, use one of {ROLES}")
            problem = (
                ray_internals.label_selector_problem(selector)
                if isinstance(selector, dict) and selector
                else "give node labels to match, e.g. {'pool': 'ingest'}"
            )
            if problem:
                raise ConfigError(f"placement.prefer[{role!r}]: {problem}")

    @property
    def spark_group_strategy(self) -> str:
        """RayDP's ``placement_group_strategy`` for the executors."""
        return _SPARK_GROUP_STRATEGY[self.strategy]

    def check(self) -> None:
        """Every preferred selector matches an alive node of the connected Ray: a typo
        would otherwise silently mean "anywhere" (the preference falls back)."""
        import ray

        labels = [n.get("Labels") or {} for n in ray.nodes() if n.get("Alive")]
        for role, selector in sorted(self.prefer.items()):
            if not any(matches(selector, node) for node in labels):
                raise ConfigError(
                    f"placement.prefer[{role!r}]: no alive Ray node has the labels {selector} "
                    "(start nodes with ray start --labels=...)"
                )

    def actor_options(self, role: str) -> dict[str, Any]:
        """Ray ``.options()`` for an actor of ``role``."""
        selector = self.prefer.get(role)
        if selector is not None:
            return _preferring(selector)
        if self.strategy == "spread":
            return {"scheduling_strategy": "SPREAD"}
        return _preferring({NODE_ID_LABEL: _this_node()})


def _preferring(selector: dict[str, str]) -> dict[str, Any]:
    # Any node at all once none matches: a lost node must not stall a restart.
    return {"label_selector": dict(selector), "fallback_strategy": [{"label_selector": {}}]}


def _this_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies ``selector`` (Ray's selector syntax)."""
    for key, wanted in selector.items():
        negate = wanted.startswith("!")
        wanted = wanted.removeprefix("!")
        if wanted.startswith("in(") and wanted.endswith(")"):
            values = {v.strip() for v in wanted[3:-1].split(",")}
        else:
            values = {wanted}
        if (labels.get(key) in values) == negate:
            return False
    return True
