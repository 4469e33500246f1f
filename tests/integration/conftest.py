"""Shared fixtures for tests with real parts: a local Ray that cleans up after itself, one
embedded S3 (SeaweedFS) per test session, and helpers to build pipelines over the embedded
broker and check tables exactly."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from rayconnect.cli import chaos
from rayconnect.storage.embedded_s3 import EmbeddedS3

RAY_TMP = Path("/tmp/ray")
_DASHBOARD: str | None = None  # this module's Ray: others may run on the machine too


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """A local Ray for one test module; removes what this Ray left under /tmp/ray."""
    # This session's Spark JVMs keep their scratch files here (workers inherit the
    # environment at ray.init), so removing it can never touch another run's files.
    spark_tmp = Path(tempfile.mkdtemp(prefix="rayconnect-spark-test-"))
    os.environ["RAYCONNECT_SPARK_TMP"] = str(spark_tmp)
    before = set(RAY_TMP.iterdir()) if RAY_TMP.exists() else set()
    context = ray.init(namespace="rayconnect", log_to_driver=False, include_dashboard=True)
    global _DASHBOARD
    _DASHBOARD = f"http://{context.dashboard_url}"
    try:
        yield
    finally:
        ray.shutdown()
        time.sleep(0.5)
        mapped = _mapped_files()
        for path in (set(RAY_TMP.iterdir()) if RAY_TMP.exists() else set()) - before:
            # Another Ray on this machine may have made it meanwhile: keep what is in use.
            if path.is_dir() and not path.is_symlink() and not _in_use(path, mapped):
                shutil.rmtree(path, ignore_errors=True)
        os.environ.pop("RAYCONNECT_SPARK_TMP", None)
        shutil.rmtree(spark_tmp, ignore_errors=True)
        # Ray (and RayDP's Java agent, which writes its logs through it) follows
        # session_latest; a link to a removed session breaks the next Spark start.
        for link in ("session_latest", "prom_metrics_service_discovery.json"):
            path = RAY_TMP / link
            if path.is_symlink() and not path.exists():
                path.unlink()


def _mapped_files() -> str:
    """Every file some live process has mapped (a JVM's native libraries, for one)."""
    maps = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                maps.append((proc / "maps").read_text())
    return "\n".join(maps)


def _in_use(path: Path, mapped: str) -> bool:
    return f"{path}/" in mapped


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
