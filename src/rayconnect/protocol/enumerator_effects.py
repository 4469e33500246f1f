"""Effects of the enumerator (FLIP-246 discovery), in the style of ``protocol/effects.py``.

Kept apart from effects.py so the commit protocol's ``Effect`` union does not grow cases its
actors never see. The enumerator actor carries out a ``Ready`` IN ORDER; the order within
one Ready is part of the contract (see ``protocol/enumerator.py``, "Ordering contract"):

    StopReaders -> AssignPartitions -> StartReaders -> SendMetadataUpdate

Reader ids are ``"<cluster>/<i>"``, ``0 <= i < readers_per_cluster``; the actor names the
reader actor ``<pipeline>/reader/<cluster>/<i>``. Split keys are partition keys
(``"<cluster>/<topic>/<partition>"``). ``ClusterMetadata.properties`` may hold credentials:
log these effects through ``rayconnect.redact.redact``.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from rayconnect.protocol.messages import MetadataUpdateEvent
from rayconnect.protocol.types import ClusterMetadata


# Subclasses say frozen=True again: msgspec inherits it, mypy (dataclass_transform) does not.
class _EnumeratorEffect(msgspec.Struct, frozen=True, tag=True):
    pass


class PollMetadata(_EnumeratorEffect, frozen=True):
    """Poll the KafkaMetadataService (``rayconnect.metadata.poll_service``) and report with
    ``metadata_polled``. Never more than one is outstanding."""


class DiscoverPartitions(_EnumeratorEffect, frozen=True):
    """List the partitions of ``cluster``'s topics (``kafka.discovery.discover_partitions``)
    and answer with ``partitions_discovered`` or ``discovery_failed``, passing
    ``request_id`` back: a newer request for the same cluster makes older answers stale."""

    cluster_id: str
    cluster: ClusterMetadata
    request_id: int


class StopReaders(_EnumeratorEffect, frozen=True):
    """Stop (kill) these readers of ``cluster_id``; they must deliver nothing more once this
    effect is done. Stopping a reader that does not exist is fine."""

    cluster_id: str
    reader_ids: tuple[str, ...]


class StartReaders(_EnumeratorEffect, frozen=True):
    """Start one reader per entry of ``assignment`` (reader id -> its split keys) with
    ``cluster``'s address and properties, replacing any reader of that id still running.
    A started reader asks ``GetMetadataUpdateEvent`` and reads nothing until answered."""

    cluster_id: str
    cluster: ClusterMetadata
    assignment: dict[str, tuple[str, ...]]


class SendMetadataUpdate(_EnumeratorEffect, frozen=True):
    """Deliver ``event`` to the running reader ``reader_id``: ``event.splits`` is its
    complete split set (it starts the new ones and drops any it holds that are missing)."""

    reader_id: str
    event: MetadataUpdateEvent


class AssignPartitions(_EnumeratorEffect, frozen=True):
    """The pipeline's partitions change: ``added`` join (participants start, coordinator
    ``add_partitions``), ``retired`` leave AFTER what they read is committed (coordinator
    ``retire_partitions``, which emits ``PartitionsRetired`` when they are gone). See the
    ordering contract in ``protocol/enumerator.py``."""

    added: tuple[str, ...]
    retired: tuple[str, ...]


class FailPipeline(_EnumeratorEffect, frozen=True):
    """The metadata service failed ``discovery_failure_threshold`` times in a row."""

    reason: str


EnumeratorEffect: TypeAlias = (
    PollMetadata
    | DiscoverPartitions
    | StopReaders
    | StartReaders
    | SendMetadataUpdate
    | AssignPartitions
    | FailPipeline
)
EnumeratorReady: TypeAlias = list[EnumeratorEffect]
