"""Reserve the CPUs of the writer's Spark executors (a Ray placement group), with a bound.

RayDP's own ``placement_group_strategy`` waits for its group with ``ray.get(pg.ready())``
and no timeout: a writer restarted after a node loss on a cluster that has no room for
every executor any more would wait forever, silently, while every round's writes hang. So
the writer reserves the group itself and hands it to RayDP:

1. all ``wanted`` executors, for up to ``wait_s`` (a lost node's bundles are re-placed by
   Ray within that time when there is room);
2. else the most that fit now (``wanted - 1`` down to 1, a few seconds each): Spark starts
   degraded, and the writer's status says so;
3. else nothing: the caller reports why and tries again (writes are refused meanwhile, with
   that reason, instead of hanging).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: How long a smaller group may take to be placed once the full one did not fit: the CPUs
#: are either free now or not.
FEWER_WAIT_S = 5.0


@dataclass(frozen=True)
class Reservation:
    """A placed group of ``count`` bundles (one per executor)."""

    group: Any  # ray.util.placement_group.PlacementGroup
    count: int


def reserve_executors(
    wanted: int, cores: int, memory: str, strategy: str, wait_s: float
) -> Reservation | None:
    """The executors' placement group (``SPREAD``/``PACK``): ``wanted`` bundles if they fit
    within ``wait_s``, else as many as fit now, else None."""
    for count in range(wanted, 0, -1):
        group = _placed_group(count, cores, memory, strategy, wait_s if count == wanted else 0)
        if group is not None:
            return Reservation(group, count)
    return None


def _placed_group(count: int, cores: int, memory: str, strategy: str, wait_s: float) -> Any:
    import ray
    from raydp.utils import parse_memory_size

    bundle = {"CPU": cores, "memory": parse_memory_size(memory)}
    group = ray.util.placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    if group.wait(max(wait_s, FEWER_WAIT_S)):
        return group
    ray.util.remove_placement_group(group)
    return None


def release(reservation: Reservation | None) -> None:
    """Give the CPUs back (RayDP removes only groups it made itself)."""
    if reservation is not None:
        import ray

        ray.util.remove_placement_group(reservation.group)


def no_room(cores: int, memory: str, wait_s: float, writes_go_on: bool = False) -> str:
    """The reason shown while not even one executor fits; ``writes_go_on``: the writer
    writes in its own process meanwhile (``spark.start: when_needed``)."""
    meanwhile = "writes go on in the writer's process" if writes_go_on else "writes are refused"
    return (
        f"waiting for CPUs: no Ray node had room for one Spark executor ({cores} CPU, "
        f"{memory}) within spark.executor_wait_s={wait_s:g}; {meanwhile} until one fits"
    )
