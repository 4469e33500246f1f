"""Clean up after a Ray started by a test, without touching other runs' files: several test
runs (and their Rays) share this machine's /tmp/ray."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

RAY_TMP = Path("/tmp/ray")


@contextlib.contextmanager
def cleaned_ray_tmp() -> Iterator[None]:
    """Run a Ray inside: on exit (after it was shut down), remove the /tmp/ray entries and
    the Spark scratch folder it made, keeping whatever another live Ray still uses."""
    # This session's Spark JVMs keep their scratch files here (workers inherit the
    # environment at ray.init), so removing it can never touch another run's files.
    spark_tmp = Path(tempfile.mkdtemp(prefix="rayconnect-spark-test-"))
    os.environ["RAYCONNECT_SPARK_TMP"] = str(spark_tmp)
    before = set(RAY_TMP.iterdir()) if RAY_TMP.exists() else set()
    try:
        yield
    finally:
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
