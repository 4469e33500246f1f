"""Finding and ending the processes of a private Ray (its temp dir in their command lines)
without touching other Rays on the machine: free ports, process trees, kill by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections import defaultdict
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pids: set[int]) -> set[int]:
    """``pids`` and every process below them."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children[int(fields[1])].append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    """A process's command line, arguments joined by spaces ('' once it is gone)."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def pids_of(marker: str) -> set[int]:
    """Processes whose command line mentions ``marker`` (a private Ray's temp dir), and their
    descendants (workers, a job's driver and its broker, Spark's JVMs)."""
    own = {
        int(path.parent.name)
        for path in Path("/proc").glob("[0-9]*/cmdline")
        if marker in cmdline(int(path.parent.name))
    }
    own.discard(os.getpid())
    return descendants(own) - {os.getpid()}


def kill_pids(pids: set[int], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is still there after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)
