"""Implementations of the ``rayconnect`` commands (the parser lives in ``rayconnect.cli``).

Each command is ``command(args) -> exit code``; exit codes are documented in ``rayconnect.cli``.
"""

from __future__ import annotations

import socket

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REQUIREMENT, EXIT_NOT_FOUND = 0, 1, 2, 3, 4


def check_reachable(address: str | None, timeout_s: float = 3.0) -> None:
    """Raise ConnectionError if ``host:port`` does not accept connections: ``ray.init`` to a
    dead address retries for minutes instead of failing."""
    if not address or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise ConnectionError(f"nothing listens at {address}: {e}") from None


def connect(address: str | None) -> None:
    """Connect to a running Ray (``auto`` unless told); raise ConnectionError if none."""
    import ray

    from rayconnect.api import ensure_ray

    if not ray.is_initialized():
        check_reachable(address)
        ensure_ray(address or "auto")
