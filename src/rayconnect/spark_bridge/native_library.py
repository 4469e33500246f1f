"""The folders Ray's Java runtime unpacks its native library into, one per Spark JVM:
``/tmp/ray/<n>``, whatever Ray's temp dir, ``n`` the time (ms) the JVM made it.

Runs that share a machine clean up the ones they left (nothing maps them any more). Until a
starting JVM has mapped the library - minutes on a loaded machine - nothing maps anything
from its folder either, and a clean-up then deletes it under the JVM (Spark fails to start:
"Couldn't rename temp file ... libcore_worker_library_java.so"). ``young`` tells those apart.
"""

from __future__ import annotations

import time


def young(folder_name: str, minutes: float = 10.0) -> bool:
    """The folder may belong to a JVM still starting: leave it to a later clean-up."""
    return folder_name.isdigit() and time.time() * 1000 - int(folder_name) < minutes * 60_000
