"""Value types shared by every protocol role: partitions, splits, data files, streams.

Rules of this package (checked by tests/unit/test_protocol_purity.py): pure Python plus
msgspec only. No ray, aiokafka, pyspark, raydp or deltalake import may appear here, so the
state machines can be driven by tests and simulations without any IO.

Partitions are identified by a *key* string ``"<cluster>/<topic>/<partition>"``. Kafka topic
names cannot hold ``/`` and cluster ids are validated not to, so the key is unambiguous. The
Delta ``txn`` app id of a partition is ``"<pipeline>/<key>"`` (docs/design.md, step 4).
"""

from __future__ import annotations

import re

import msgspec

from rayconnect.redact import redacted_repr

_CLUSTER_ID = re.compile(r"^[A-Za-z0-9._-]+$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid cluster id / topic / pipeline name, else raise."""
    if not _CLUSTER_ID.match(value) or (kind == "topic" and not _TOPIC.match(value)):
        raise ValueError(f"invalid {kind} {value!r}: use letters, digits, '.', '_' or '-' (no '/')")
    return value


class TopicPartition(msgspec.Struct, frozen=True, order=True):
    """One Kafka partition of one cluster: the unit a participant owns."""

    cluster: str
    topic: str
    partition: int

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.topic}/{self.partition}"

    @classmethod
    def from_key(cls, key: str) -> TopicPartition:
        cluster, topic, partition = key.rsplit("/", 2)
        return cls(cluster, topic, int(partition))

    def app_id(self, pipeline: str) -> str:
        """The Delta txn app id that stores this partition's committed offset."""
        return f"{pipeline}/{self.key}"


class FileStats(msgspec.Struct, frozen=True, omit_defaults=True):
    """Per-column statistics of a data file, in Delta's stats shape (minValues etc.)."""

    min_values: dict[str, int | float | str | None] = {}
    max_values: dict[str, int | float | str | None] = {}
    null_count: dict[str, int] = {}


class DataFile(msgspec.Struct, frozen=True):
    """A Parquet file written but not yet committed; path is relative to the table root.

    ``shared_by``: the partitions whose rows the file holds, when it holds more than one's
    (the writer puts the small flushes of one participant host's partitions into one file,
    so that a round of 1,000 partitions does not make 1,000 files). Such a file is in the
    WRITE-STATUS of each of them and may be committed only with all of them
    (``CommitState.commit_table``). Empty: the file holds the reporting partition's rows
    alone."""

    path: str
    size: int
    records: int
    modification_time_ms: int = 0
    stats: FileStats = FileStats()
    shared_by: tuple[str, ...] = ()
    #: a dead-letter file (bad records, for the dead-letter table): partition key -> its bad
    #: records in the file, counted when the file was written. Empty: a data file.
    dead_letters: dict[str, int] = {}
    #: the route table the file belongs to (``config.routes``; its path is relative to that
    #: table); None: the sink's own table
    table: str | None = None


class ClusterMetadata(msgspec.Struct, frozen=True):
    """How to reach one Kafka cluster and which of its topics belong to a stream (FLIP-246).

    ``properties`` may hold credentials (SASL passwords): its repr masks them."""

    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    properties: dict[str, str] = {}

    __repr__ = redacted_repr


class KafkaStream(msgspec.Struct, frozen=True):
    """A logical stream: the same data spread over topics of one or more clusters."""

    stream_id: str
    clusters: dict[str, ClusterMetadata]


class KafkaPartitionSplit(msgspec.Struct, frozen=True):
    """A partition assigned to a reader, with the offset it starts at (None = policy)."""

    partition: TopicPartition
    starting_offset: int | None = None
