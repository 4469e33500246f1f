"""Where an embedded broker keeps its log: memory (fast, lost on restart) or S3 (durable).

tansu's ``s3://`` engine keeps every topic, record and committed offset in a bucket, so a
broker killed and started again on the same bucket serves the same log: what outage tests
(a broker restart mid-round) need. Memory stays the default: it starts in ~10 ms and needs
no object store. See shared/notes/object-storage.md (5,000 records survive a SIGKILL).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["MEMORY", "BrokerStorage", "S3Store", "on_s3"]


class S3Store(Protocol):
    """What the S3 engine needs of an object store (``EmbeddedS3`` has it)."""

    endpoint_url: str
    access_key: str

    @property
    def secret_key(self) -> str: ...

    def new_bucket(self, prefix: str = "t") -> str: ...


@dataclass(frozen=True)
class BrokerStorage:
    """tansu's ``--storage-engine`` URL and the environment it needs (credentials stay out of
    ``repr``: a test log or status page must not show them)."""

    url: str
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def durable(self) -> bool:
        return not self.url.startswith("memory://")


MEMORY = BrokerStorage("memory://tansu/")


def on_s3(store: S3Store, bucket: str | None = None) -> BrokerStorage:
    """The S3 engine on ``bucket`` of ``store`` (a fresh bucket if none: S3 does not create
    one on first write)."""
    bucket = bucket or store.new_bucket("kafka")
    return BrokerStorage(
        f"s3://{bucket}/",
        {
            "AWS_ACCESS_KEY_ID": store.access_key,
            "AWS_SECRET_ACCESS_KEY": store.secret_key,
            "AWS_ENDPOINT": store.endpoint_url,  # tansu's name, not AWS_ENDPOINT_URL
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
        },
    )
