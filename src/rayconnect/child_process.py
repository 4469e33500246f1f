"""Helper processes that must die with us: the embedded broker (tansu) and object store (weed).

Why the care: a helper outliving its test run keeps ports, memory and disk, and confuses the
next run. So a child dies with its parent in every case we can arrange:

* ``stop_child``: SIGTERM, then SIGKILL after a grace period;
* normal interpreter exit: an ``atexit`` hook stops every registered child still running;
* the parent is SIGKILLed or crashes: on Linux the child asks the kernel for
  ``PR_SET_PDEATHSIG = SIGKILL`` before it ``exec``s.

PDEATHSIG fires when the *thread* that forked the child exits, not the process. A child
started from a short-lived worker thread (an executor, a test helper thread) would be killed
as soon as that thread finished. So we only fork from the main thread or from one private
daemon thread that lives as long as the process (``spawn``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

__all__ = [
    "CLEAN_EXITS",
    "ChildProcess",
    "StartStop",
    "free_port",
    "register",
    "spawn",
    "stop_child",
    "tail",
    "unregister",
]

_PR_SET_PDEATHSIG = 1

#: Exit codes of a child that was stopped, not crashed: 0, or killed by SIGINT/SIGTERM.
CLEAN_EXITS = (0, 130, 143, -signal.SIGINT, -signal.SIGTERM)


def _make_preexec() -> Callable[[], None] | None:
    """Build the child-side hook that ties the child's life to ours (Linux only).

    libc is loaded here, in the parent: the child between fork and exec must do as little
    as possible (no imports, no allocation-heavy work).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent_pid = os.getpid()

    def _preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork() and prctl(): then nobody would ever
        # deliver the death signal, so exit now instead of becoming an orphan.
        if os.getppid() != parent_pid:
            os._exit(1)

    return _preexec


class _SpawnerThread:
    """One daemon thread, alive until the process exits, that does every fork.

    Needed because PDEATHSIG is tied to the forking thread (see module docstring).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen[bytes]], Future]] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(
            target=self._run, name="rayconnect-child-spawner", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, not swallowed
                fut.set_exception(exc)

    def submit(self, fn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        fut: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((fn, fut))
        return fut.result()


_spawner: _SpawnerThread | None = None
_spawner_lock = threading.Lock()


def spawn(
    args: Sequence[str],
    log_file: Path,
    env: dict[str, str],
    cwd: Path | None = None,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``args`` with stdout+stderr appended to ``log_file``, from a long-lived thread.

    ``new_session``: out of the terminal's process group, so a Ctrl-C reaches only us and we
    stop the child when we are done with it (PDEATHSIG still ends it if we die)."""

    def _popen() -> subprocess.Popen[bytes]:
        with open(log_file, "ab") as log:
            return subprocess.Popen(
                list(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=new_session,
                preexec_fn=_make_preexec(),  # PDEATHSIG, see _make_preexec
                close_fds=True,
            )

    if threading.current_thread() is threading.main_thread():
        return _popen()
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _SpawnerThread()
    return _spawner.submit(_popen)


def free_port() -> int:
    """A loopback port free right now (another process may take it before we bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, max_bytes: int = 4000) -> str:
    """The end of a log file, for an error message."""
    try:
        data = path.read_bytes()
    except OSError:
        return "<no log>"
    return data[-max_bytes:].decode("utf-8", "replace")


def stop_child(proc: subprocess.Popen[bytes], grace: float) -> bool:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Returns True if it had crashed.

    A child that ended on its own by a terminal's Ctrl-C (the whole process group gets
    SIGINT) was not a crash; any other exit before we asked was.
    """
    crashed = proc.poll() is not None and proc.returncode not in CLEAN_EXITS
    if not crashed:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    return crashed


class _Stoppable(Protocol):
    def stop(self) -> None: ...


_live: set[_Stoppable] = set()
_live_lock = threading.Lock()


def register(child: _Stoppable) -> None:
    """Stop ``child`` at interpreter exit unless it was unregistered (stopped) before."""
    with _live_lock:
        _live.add(child)


def unregister(child: _Stoppable) -> None:
    with _live_lock:
        _live.discard(child)


def _stop_all_at_exit() -> None:
    with _live_lock:
        children = list(_live)
    for child in children:
        with contextlib.suppress(Exception):
            child.stop()


atexit.register(_stop_all_at_exit)


class StartStop:
    """``with thing:`` = ``thing.start()`` ... ``thing.stop()``."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ChildProcess(StartStop):
    """What every embedded server shares: one child process and its log, a start that waits
    for readiness (retried when a picked port was taken meanwhile), a context manager.

    Subclasses set ``_what`` (for messages) and ``_start_error``, and implement ``start`` and
    ``stop`` with ``_launch``, ``_wait_ready`` and ``_start_retrying``.
    """

    _what = "child process"
    _start_error: type[Exception] = RuntimeError

    def __init__(self, host: str = "127.0.0.1", launch_prefix: Sequence[str] = ()) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        #: the address it listens on and clients reach it at: loopback, or a test host's
        #: address when ``launch_prefix`` (``ip netns exec NS``) runs it on that host
        self.host = host
        self.launch_prefix = tuple(launch_prefix)

    @property
    def log_path(self) -> Path:
        """File holding the child's stdout and stderr (kept after a crash)."""
        if self._log_path is None:
            raise RuntimeError(f"{self._what} not started")
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _launch(
        self,
        args: Sequence[str],
        log_path: Path,
        env: dict[str, str],
        cwd: Path | None = None,
        new_session: bool = False,
    ) -> None:
        self._log_path = log_path
        self._proc = spawn([*self.launch_prefix, *args], log_path, env, cwd, new_session)
        register(self)

    def _wait_ready(self, probe: Callable[[], str | None], timeout: float) -> None:
        """Poll ``probe`` (None = ready, else why not) until ready, the child exits or
        ``timeout``; the last two raise ``_start_error`` with the log's tail."""
        assert self._proc is not None and self._log_path is not None
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._start_error(
                    f"{self._what} exited with code {code} during start-up; "
                    f"log {self._log_path}:\n{tail(self._log_path)}"
                )
            reason = probe()
            if reason is None:
                return
            if time.monotonic() > deadline:
                raise self._start_error(
                    f"{self._what} not ready after {timeout:.1f}s ({reason}); "
                    f"log {self._log_path}:\n{tail(self._log_path)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _start_retrying(
        self, attempt: Callable[[], None], clean_up: Callable[[], None], attempts: int = 3
    ) -> None:
        """Run ``attempt`` (launch + wait) until it succeeds. Free ports are found by binding
        port 0 and releasing it, so another process may take one first: a child that exited
        during start-up is retried on new ports; one that hung is not."""
        for _ in range(attempts):
            try:
                attempt()
                return
            except self._start_error:
                exited_early = self._proc is not None and self._proc.poll() is not None
                clean_up()
                if not exited_early or _ == attempts - 1:
                    raise
