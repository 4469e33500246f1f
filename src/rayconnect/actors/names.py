"""Names of a pipeline's actors, in Ray namespace ``rayconnect``.

Readable names make the Ray dashboard's actor list show the pipeline's shape, and let any
process (a new driver, ``rc.attach``, the CLI) find a running pipeline's actors by name.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from rayconnect.protocol.types import TopicPartition

if TYPE_CHECKING:
    from rayconnect.config.sink import SinkPipelineConfig

NAMESPACE = "rayconnect"


def coordinator(pipeline: str) -> str:
    return f"{pipeline}/coordinator"


def writer(pipeline: str) -> str:
    return f"{pipeline}/writer"


def participant_host(
    pipeline: str, key: str, partitions_per_host: int, topic_groups: int | None = None
) -> str:
    """The participant host of partition ``key`` (``cluster/topic/partition``):
    ``<pipeline>/participants/<cluster>/<topic>/<n>`` holds the partitions
    ``n * partitions_per_host ... (n + 1) * partitions_per_host - 1`` of that topic.

    With ``topic_groups`` (many topics: one process per topic would cost ~57 MB and a
    worker start each), the topics of a cluster share hosts: a topic belongs to group
    ``crc32(topic) % topic_groups`` and ``<pipeline>/participants/<cluster>/g<group>/<n>``
    holds partitions ``n * partitions_per_host ...`` of every topic of the group.

    A pure function of the key, so every actor (coordinator, readers, enumerator, a restarted
    host) finds a partition's host without asking anyone, and a partition that joins later
    (a topic that grows, a new topic) lands in the host its number says."""
    tp = TopicPartition.from_key(key)
    group = tp.topic
    if topic_groups is not None:
        group = f"g{zlib.crc32(tp.topic.encode()) % topic_groups}"
    return f"{pipeline}/participants/{tp.cluster}/{group}/{tp.partition // partitions_per_host}"


def host_of(config: SinkPipelineConfig, key: str) -> str:
    """The participant host of partition ``key`` in the sink pipeline ``config``."""
    return participant_host(config.name, key, config.partitions_per_host, config.topic_groups)


def reader(pipeline: str, cluster: str, index: int) -> str:
    return f"{pipeline}/reader/{cluster}/{index}"


def task(pipeline: str, index: int) -> str:
    """A source pipeline's task ``index`` (KIP-618 source task)."""
    return f"{pipeline}/task/{index}"


def pipeline_of(actor_name: str) -> str | None:
    """The pipeline an actor name belongs to, or None for an actor that is not ours."""
    head, sep, _ = actor_name.partition("/")
    return head if sep else None


def enumerator(pipeline: str) -> str:
    return f"{pipeline}/enumerator"


def reader_of(pipeline: str, reader_id: str) -> str:
    """Actor name of the enumerator's reader id ``"<cluster>/<i>"``."""
    cluster, index = reader_id.rsplit("/", 1)
    return reader(pipeline, cluster, int(index))


def role_of(actor_name: str) -> str | None:
    """The role part of an actor name (``coordinator``, ``reader``, ``task``...)."""
    parts = actor_name.split("/")
    return parts[1] if len(parts) > 1 else None
