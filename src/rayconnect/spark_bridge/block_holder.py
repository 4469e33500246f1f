"""``BlockHolder``: the actor that lends one write's block refs to its Spark tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rayconnect import ray_internals
from rayconnect.spark_bridge.blocks import Block

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@ray.remote(num_cpus=0)
class BlockHolder:
    """Lends the refs of one write to the Spark tasks, and lets go of them afterwards.

    Spark's Python workers are separate Ray drivers: they can only get an object by asking a
    live Ray process that holds its ref. RayDP's own ``to_spark`` parks refs in its master
    actor and never drops them (every batch ever written would stay pinned in the object
    store), so the writer uses this holder and calls ``drop`` after each job.
    """

    def __init__(self) -> None:
        self._writes: dict[str, list[Block]] = {}
        self._reports: dict[str, dict[int, tuple[int, list[tuple[int, str]]]]] = {}

    def put(self, write_id: str, refs: list[Block]) -> None:
        self._writes[write_id] = refs

    def get(self, write_id: str, indexes: list[int]) -> list[Block]:
        refs = self._writes[write_id]
        return [refs[i] for i in indexes]

    def report(
        self, write_id: str, task: int, attempt: int, written: list[tuple[int, str]]
    ) -> None:
        """Files a task wrote beside its rows (a transform's dead letters). A task that is
        retried reports again with a higher attempt; the last attempt's report wins."""
        reports = self._reports.setdefault(write_id, {})
        if task not in reports or reports[task][0] < attempt:
            reports[task] = (attempt, written)

    def reported(self, write_id: str) -> list[tuple[int, str]]:
        return [row for _, written in self._reports.get(write_id, {}).values() for row in written]

    def drop(self, write_id: str) -> None:
        self._writes.pop(write_id, None)
        self._reports.pop(write_id, None)


@dataclass(frozen=True)
class HolderRef:
    """A session's block holder: its handle, and the name and namespace a Spark task (a
    separate Ray driver) looks it up by."""

    handle: ray.actor.ActorHandle[Any]
    name: str
    namespace: str


_holders: dict[str, HolderRef] = {}


def holder_of(spark: SparkSession) -> HolderRef:
    """This session's block holder (created on first use).

    Owned by the process running the session (the writer actor), so it dies with it; and
    placed on its node, so that no other node's loss can take it (and every later write).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = f"{spark.sparkContext.appName}_RC_BLOCKS"
    if name not in _holders:
        context = ray.get_runtime_context()
        namespace = context.namespace
        handle = (
            ray_internals.actor_class(BlockHolder)
            .options(
                name=name,
                namespace=namespace,
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    context.get_node_id(), soft=False
                ),
            )
            .remote()
        )
        _holders[name] = HolderRef(handle, name, namespace)
    return _holders[name]
