"""A throwaway PostgreSQL server on this machine: the demo's (``rayconnect demo --database``),
the benchmarks' and the tests' database, started the same way by all three.

Postgres refuses to run as root and sessions and CI run as root, so the server runs as the
``postgres`` system user in a temp folder that user owns, with ``wal_level=logical`` on a
free port (see ../shared/notes/postgres.md). Host connections need a password
(scram-sha-256): the superuser's is ``PASSWORD``, so the source's password handling is
exercised for real. It is started, restarted and stopped by its data folder, never by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rayconnect.child_process import free_port
from rayconnect.errors import RayconnectError

BIN = Path(os.environ.get("RAYCONNECT_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "postgres"
PASSWORD = "pg-test-secret"

HOW_TO_INSTALL = (
    "install PostgreSQL 15 (Debian/Ubuntu: apt-get install postgresql-15; the server need "
    "not run, its binaries are enough) or point RAYCONNECT_PG_BIN at the folder holding "
    "initdb and pg_ctl"
)


class PostgresNotInstalledError(RayconnectError, RuntimeError):
    """The PostgreSQL server binaries (initdb, pg_ctl) are not on this machine."""


def installed() -> bool:
    return (BIN / "initdb").exists() and (BIN / "pg_ctl").exists()


def require_installed() -> None:
    if not installed():
        raise PostgresNotInstalledError(
            f"PostgreSQL 15 server binaries not found in {BIN}: {HOW_TO_INSTALL}"
        )


def _as_postgres(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = list(args)
    if os.geteuid() == 0:  # root: the server must run as its own user
        command = ["runuser", "-u", USER, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:1])} failed ({done.returncode}): {done.stderr.strip()}"
        )
    return done


class PostgresServer:
    """One Postgres cluster in its own folder: ``start()``, ``stop()``, ``restart()``,
    ``kill()`` (SIGKILL of the postmaster: crash recovery on the next start)."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port or free_port()
        self.log = root / "log"

    @property
    def dsn(self) -> str:
        """The superuser's DSN, without its password (give it as ``PGPASSWORD``)."""
        return f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres"

    @property
    def url(self) -> str:
        """The same as a ``postgresql://`` URL (what ``rayconnect mirror`` takes)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    @property
    def password_file(self) -> str:
        """A file holding the superuser's password (what a task is given: Ray's workers do
        not see environment variables set in the test process after Ray started)."""
        return str(self.root / "pw")

    @property
    def password_dsn(self) -> str:
        """The DSN with the password, for this process's own connections."""
        return f"{self.dsn} password={PASSWORD}"

    def init(self, wal_level: str = "logical") -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, USER)
        _as_postgres(
            str(BIN / "initdb"),
            "-D", str(self.data),
            "-U", USER,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={pwfile}",
            "--no-sync",
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nwal_level = {wal_level}\nport = {self.port}\n"
                f"listen_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                "max_replication_slots = 10\nmax_wal_senders = 10\nfsync = off\n"
                "wal_sender_timeout = 60s\n"
            )

    def start(self) -> None:
        _as_postgres(
            str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        _as_postgres(
            str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop", check=False
        )

    def restart(self) -> None:
        self.stop()
        self.start()

    def pid(self) -> int | None:
        pidfile = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(pidfile.read_text().split()[0])
        return None

    def psql(self, sql: str) -> str:
        """Run ``sql`` as the superuser over the local socket; its output, unaligned."""
        out = _as_postgres(
            str(BIN / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", USER,
            "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-XAtq", "-c", sql,
        )  # fmt: skip
        return out.stdout.strip()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _as_postgres(str(BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port),
                            check=False).returncode == 0:  # fmt: skip
                return
            time.sleep(0.1)
        raise TimeoutError(
            f"postgres on port {self.port} not ready: {self.log.read_text()[-2000:]}"
        )


@contextlib.contextmanager
def postgres_server(wal_level: str = "logical") -> Iterator[PostgresServer]:
    """A started server in a fresh temp folder; stopped and removed after.
    ``PostgresNotInstalledError`` when the binaries are absent."""
    require_installed()
    root = Path(tempfile.mkdtemp(prefix="rayconnect-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, USER)
    server = PostgresServer(root)
    try:
        server.init(wal_level)
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
