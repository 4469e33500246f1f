"""Shared fixtures for tests with real parts: a local Ray that cleans up after itself, one
embedded S3 (SeaweedFS) per test session, and helpers to build pipelines over the embedded
broker and check tables exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray_tmp import cleaned_ray_tmp

from rayconnect.cli import chaos
from rayconnect.kafka.broker_storage import on_s3
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.storage.embedded_s3 import EmbeddedS3

_DASHBOARD: str | None = None  # this module's Ray: others may run on the machine too


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """A local Ray for one test module; removes what this Ray left under /tmp/ray."""
    with cleaned_ray_tmp():
        context = ray.init(namespace="rayconnect", log_to_driver=False, include_dashboard=True)
        global _DASHBOARD
        _DASHBOARD = f"http://{context.dashboard_url}"
        try:
            yield
        finally:
            ray.shutdown()


def actor_pid(name: str, namespace: str = "rayconnect", timeout_s: float = 30.0) -> int:
    """The PID of a live named actor, from this module's Ray's state API."""
    return chaos.actor_pid(name, _DASHBOARD, namespace, timeout_s)


def kill_actor(name: str, how: str) -> None:
    """Kill a named actor so that Ray restarts it: ``ray.kill`` or SIGKILL of its process."""
    chaos.kill_actor(name, how, _DASHBOARD)


@pytest.fixture
def kill():
    """``kill(name, "ray.kill" | "sigkill")``: end a named actor so Ray restarts it."""
    return kill_actor


@pytest.fixture(scope="session")
def embedded_s3() -> Iterator[EmbeddedS3]:
    """One SeaweedFS S3 for the whole session (~2-10 s to start); tests keep apart by bucket."""
    with EmbeddedS3() as s3:
        yield s3


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
