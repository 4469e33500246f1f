"""Settings of a source pipeline, checked when built (before any actor starts).

Names follow Kafka 3.3's KIP-618 settings: ``exactly_once`` ~ ``exactly.once.support``
(requested / required), ``transaction_boundary`` ~ ``transaction.boundary`` (poll /
interval / connector), ``offsets_topic`` ~ ``offsets.storage.topic``; ``group`` plays the
role of the Connect group id in ``transactional_id = <group>-<pipeline>-<task>``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from rayconnect.config import ConfigError
from rayconnect.protocol.source_task import BOUNDARIES, Boundary
from rayconnect.protocol.types import check_name

ExactlyOnce = Literal["requested", "required"]
GLOBAL_OFFSETS_TOPIC = "rayconnect-offsets"


def default_offsets_topic(pipeline: str) -> str:
    return f"{GLOBAL_OFFSETS_TOPIC}-{pipeline}"


class KafkaTarget(msgspec.Struct, frozen=True):
    """The cluster a source pipeline writes to (its offsets topics live there too).
    ``properties`` are Kafka client properties (``security.protocol``...)."""

    bootstrap_servers: str
    properties: dict[str, str] = {}

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigError("target.bootstrap_servers is empty")


class SourceSettings(msgspec.Struct, frozen=True):
    name: str
    target: KafkaTarget
    tasks: int = 1
    offsets_topic: str | None = None
    global_offsets_topic: str = GLOBAL_OFFSETS_TOPIC
    transaction_boundary: Boundary = "poll"
    transaction_boundary_interval_s: float = 1.0
    exactly_once: ExactlyOnce = "requested"
    group: str = "rayconnect"
    #: how long a commit (or init) may take before the task fails (seed 000's max.block.ms)
    commit_timeout_s: float = 30.0
    producer_properties: dict[str, str] = {}

    def __post_init__(self) -> None:
        try:
            check_name("pipeline name", self.name)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.tasks < 1:
            raise ConfigError("tasks must be >= 1")
        if self.transaction_boundary not in BOUNDARIES:
            raise ConfigError(
                f"transaction_boundary must be one of {BOUNDARIES}, not "
                f"{self.transaction_boundary!r}"
            )
        if self.transaction_boundary_interval_s <= 0:
            raise ConfigError("transaction_boundary_interval_s must be > 0")
        if self.exactly_once not in ("requested", "required"):
            raise ConfigError(
                f"exactly_once must be 'requested' or 'required', not {self.exactly_once!r}"
            )
        if not self.group:
            raise ConfigError("group must not be empty")
        if self.commit_timeout_s <= 0:
            raise ConfigError("commit_timeout_s must be > 0")

    @property
    def own_offsets_topic(self) -> str:
        return self.offsets_topic or default_offsets_topic(self.name)

    def transactional_id(self, task: int) -> str:
        return f"{self.group}-{self.name}-{task}"
