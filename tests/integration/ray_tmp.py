"""A private temp root for every Ray a test starts, removed whole at the end.

Several test runs (a CI rehearsal, an engineer's module, a benchmark) share this machine.
When they all used /tmp/ray, one run's cleanup could delete a live session of another (its
sockets, its JVMs' native libraries), and ``session_latest`` pointed at whichever started
last. With ``RAY_TMPDIR`` set before ``ray.init`` / ``Cluster``, Ray puts everything -
sessions, the address file, ``session_latest`` - under our own folder, and every process it
starts (raylets, workers, the Spark JVMs they launch) inherits it; so the cleanup is one
``rmtree`` that cannot touch anything else.

One thing escapes it: Ray's Java runtime (in each Spark JVM) unpacks its 40 MB native library
into /tmp/ray/<number>/ whatever the temp dir. Those folders, when new and no longer mapped
by any process, are removed too."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rayconnect.spark_bridge.native_library import young


@contextlib.contextmanager
def cleaned_ray_tmp() -> Iterator[Path]:
    """Run a Ray inside (start it inside, shut it down before leaving): yields the private
    root, which holds Ray's ``ray/`` folder and Spark's scratch folder."""
    # Short on purpose: Ray's unix socket paths live below it and must stay under 108 bytes.
    before = _native_library_dirs()
    root = Path(tempfile.mkdtemp(prefix="rc-ray-", dir="/tmp"))
    spark_tmp = root / "spark"
    spark_tmp.mkdir()
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAYCONNECT_SPARK_TMP")}
    os.environ["RAY_TMPDIR"] = str(root)
    os.environ["RAYCONNECT_SPARK_TMP"] = str(spark_tmp)
    try:
        yield root
    finally:
        time.sleep(0.5)  # processes that were told to stop let go of their files
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
        mapped = _mapped_files()
        for path in _native_library_dirs() - before:
            if f"{path}/" not in mapped and not young(path.name):
                shutil.rmtree(path, ignore_errors=True)


def _native_library_dirs() -> set[Path]:
    shared = Path("/tmp/ray")
    return {p for p in shared.iterdir() if p.name.isdigit()} if shared.is_dir() else set()


def _mapped_files() -> str:
    """Every file some live process has mapped (a JVM's native libraries, for one)."""
    maps = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                maps.append((proc / "maps").read_text())
    return "\n".join(maps)
