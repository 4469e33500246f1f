"""What a reader, a participant host and the enumerator report about themselves, as
typed Structs: ``PipelineHandle.status()`` gathers them (``PipelineStatus.readers`` and
``discovery``; the hosts' partitions become ``partition_status``), and the coordinator asks
the readers for their high watermarks. Every field has a default so that an actor that did
not answer is a status with only ``error`` set, as ``WriterStatus`` is.
"""

from __future__ import annotations

import msgspec

from rayconnect.protocol.enumerator import EnumeratorStatus
from rayconnect.protocol.participant import ParticipantStatus


class ReaderPartitionStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One partition of a reader."""

    #: the next offset the reader hands to the partition's participant
    position: int | None = None
    #: where its Kafka consumer fetches next (None while it has no position)
    consumer_position: int | None = None
    #: the broker's high watermark, as the reader last saw it
    high_watermark: int | None = None


class ReaderStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One reader actor (a Kafka consumer of one cluster)."""

    #: ``<cluster>/<i>``
    reader_id: str | None = None
    cluster: str | None = None
    bootstrap_servers: str | None = None
    #: the partitions (``cluster/topic/partition``) it reads
    splits: tuple[str, ...] = ()
    #: the splits it resumed at a position a host gave it after its (re)start
    resumed: tuple[str, ...] = ()
    records_read: int = 0
    bytes_read: int = 0
    #: metadata updates received from the enumerator (0: it does not read yet)
    metadata_updates: int = 0
    last_update_at: float | None = None
    started_at: float | None = None
    #: its last failure (connecting, reading, handing pieces) - or why it did not answer
    error: str | None = None
    #: ``broker unreachable since ...`` while its broker does not answer
    broker: str | None = None
    broker_unreachable_since: float | None = None
    #: outages of its broker since it started
    broker_outages: int = 0
    #: partition -> its position and high watermark
    partitions: dict[str, ReaderPartitionStatus] = {}


class HostPartitionStatus(ParticipantStatus, frozen=True, kw_only=True):
    """One partition's participant, with what its host counts of it."""

    #: records the host received for it since the host started
    records_in: int = 0
    #: flushes the host sent to the writer for it
    flushes: int = 0
    #: the host holding it
    host: str = ""


class HostStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One participant host actor: its partitions' machines."""

    host: str
    pid: int
    started_at: float
    partitions: dict[str, HostPartitionStatus] = {}


class DiscoveryStatus(EnumeratorStatus, frozen=True, kw_only=True):
    """The enumerator actor: its machine's status, and the actor's own state."""

    #: why the pipeline failed (the enumerator's ``FailPipeline``); None: it did not
    failed: str | None = None
    #: whether it resumed from its snapshot (a restarted enumerator)
    restored: bool = False
    started_at: float | None = None
