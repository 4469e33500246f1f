"""Shared fixtures for tests with real parts: a local Ray that cleans up after itself, one
embedded S3 (SeaweedFS) per test session - with an Iceberg REST catalog (its table bucket
``TABLE_BUCKET``; tests keep apart by namespace) - and helpers to build pipelines over the embedded
broker and check tables exactly."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray_tmp import cleaned_ray_tmp

from rayconnect.config.rest_catalog import RestCatalog
from rayconnect.demo import chaos
from rayconnect.kafka.broker_storage import on_s3
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.storage.embedded_s3 import EmbeddedS3

#: the session store's table bucket: its Iceberg REST catalog
TABLE_BUCKET = "rc-lake"


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """A local Ray for one test module, under a temp root of its own (removed after)."""
    with cleaned_ray_tmp():
        ray.init(namespace="rayconnect", log_to_driver=False, include_dashboard=True)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture
def kill():
    """``kill(name, "ray.kill" | "sigkill")``: end a named actor so Ray restarts it."""
    return chaos.kill_actor


@pytest.fixture(scope="session")
def embedded_s3() -> Iterator[EmbeddedS3]:
    """One SeaweedFS S3 for the whole session (~2-10 s to start); tests keep apart by bucket
    (by namespace in its REST catalog)."""
    with EmbeddedS3(table_buckets=(TABLE_BUCKET,)) as s3:
        yield s3


@pytest.fixture
def rest_catalog(embedded_s3: EmbeddedS3, tmp_path: Path) -> RestCatalog:
    """The session store's Iceberg REST catalog; its credential in a file (every process of
    a test's pipeline reads it there)."""
    credential = tmp_path / "iceberg-credential"
    credential.write_text(embedded_s3.iceberg_credential + "\n")
    return RestCatalog(
        embedded_s3.iceberg_url, f"s3://{TABLE_BUCKET}/", credential_file=str(credential)
    )


@pytest.fixture
def rest_namespace() -> str:
    """A namespace of its own in the REST catalog (made by the first commit)."""
    return f"ns{uuid.uuid4().hex[:10]}"


@pytest.fixture
def s3_bucket(embedded_s3: EmbeddedS3) -> str:
    """A fresh, empty bucket on the session's embedded S3."""
    return embedded_s3.new_bucket()


@pytest.fixture
def durable_broker(embedded_s3: EmbeddedS3, tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker (cluster ``local``) whose log is in a fresh bucket of the session's S3: it
    can be killed and started again (same port) without losing a record."""
    storage = on_s3(embedded_s3)
    with EmbeddedBroker("local", log_dir=tmp_path / "kafka", storage=storage) as broker:
        yield broker
