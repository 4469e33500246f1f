"""What a local Ray leaves under /tmp/ray, and removing it once that Ray is gone.

Other agents' Rays share /tmp/ray: only what appeared since a snapshot and is not mapped by a
live process is removed.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

RAY_TMP = Path("/tmp/ray")


def ray_tmp_now() -> set[Path]:
    """What is under /tmp/ray now: give it to ``remove_ray_tmp_since`` after the run."""
    return set(RAY_TMP.iterdir()) if RAY_TMP.exists() else set()


def remove_ray_tmp_since(before: set[Path]) -> None:
    """Remove what a finished Ray (ours) left under /tmp/ray since ``before``."""
    mapped = _mapped_files()
    for path in ray_tmp_now() - before:
        # Another Ray on this machine may have made it meanwhile: keep what is in use.
        if path.is_dir() and not path.is_symlink() and not _in_use(path, mapped):
            shutil.rmtree(path, ignore_errors=True)
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
