"""Is a table's store usable? Checked before any actor starts.

A wrong endpoint, wrong credentials or a missing bucket would otherwise surface minutes later
as a coordinator retrying inside delta-rs (its S3 client retries for minutes); a local folder
that cannot be written, as a coordinator whose recovery fails. Each check fails fast (one
attempt, short timeouts) with the setting to fix, and where its value came from
(``storage_options`` or the environment). Nothing is created: the S3 check only reads, the
local one creates a probe file and removes it.
"""

from __future__ import annotations

import os
import socket
import tempfile
from urllib.parse import urlsplit

from rayconnect.storage.location import StorageError, TableLocation, s3_setting

__all__ = ["check_local_folder", "check_table_store"]

_TIMEOUT_S = 5.0

#: virtual filesystems: what looks like a folder there holds no table (the kernel's files)
_VIRTUAL_ROOTS = ("/proc", "/sys")


def _origin(location: TableLocation, canonical: str, env_var: str) -> str:
    """Where a setting came from, for the error message (never its value)."""
    for key, _ in location.options:
        if s3_setting(key) == canonical:
            return f"sink.storage_options.{key}"
    if os.environ.get(env_var):
        return f"the environment variable {env_var}"
    return f"sink.storage_options.{env_var} (not set)"


def check_local_folder(path: str, setting: str) -> None:
    """Raise ``StorageError`` naming ``setting`` unless a table's files can be written at
    the local ``path`` (made absolute; it need not exist yet).

    The nearest existing folder at or above ``path`` must be a folder (not a file) outside
    ``/proc`` and ``/sys``, and this process must be able to create a file in it: checked
    with ``os.access`` (which sees modes, an immutable folder - ``chattr +i`` - and a
    read-only mount, for root too), then by creating and removing a probe file (for what
    it does not see: NFS root squashing, ACLs and security modules, a full disk or quota).
    Nothing is left behind; the folders below the existing one are not made here (the
    first commit makes them).
    """
    target = os.path.abspath(os.path.expanduser(path))
    where = f"{setting}: {target} cannot be written"
    real = os.path.realpath(target)
    for root in _VIRTUAL_ROOTS:
        if real == root or real.startswith(root + "/"):
            raise StorageError(f"{where}: it is under {root}, a virtual filesystem of the kernel")
    existing = target
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "it is" if existing == target else f"{existing} is"
        raise StorageError(f"{where}: {what} a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StorageError(
            f"{where}: {existing} is not writable by this process (uid {os.geteuid()}: "
            "its permissions, an immutable folder or a read-only mount)"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=".rayconnect-write-check-", dir=existing)
    except OSError as e:  # immutable folder, read-only mount, full disk, quota...
        raise StorageError(
            f"{where}: cannot create a file in {existing} ({e.strerror or e})"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_table_store(location: TableLocation, timeout_s: float = _TIMEOUT_S) -> None:
    """Raise ``StorageError`` naming the setting if the table's store cannot be used.

    S3: the endpoint answers, the credentials are accepted, the bucket exists. Local paths
    and other stores are not checked here (delta-rs reports those at the first commit).
    """
    if location.store != "s3":
        return
    settings = location.s3_settings()
    endpoint = settings.get("endpoint_url")
    if endpoint:
        parts = urlsplit(endpoint)
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            raise StorageError(
                f"{_origin(location, 'endpoint_url', 'AWS_ENDPOINT_URL')}: {endpoint!r} is not "
                "an http(s):// URL"
            )
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as e:
            raise StorageError(
                f"{_origin(location, 'endpoint_url', 'AWS_ENDPOINT_URL')}: cannot reach "
                f"{endpoint} ({e.strerror or e})"
            ) from None
    from pyarrow import fs

    filesystem = location.filesystem(timeout_s=timeout_s, attempts=1)
    bucket = location.bucket
    try:
        info = filesystem.get_file_info(bucket)
        if info.type == fs.FileType.Directory:
            # HEAD bucket may be answered for a bucket we may not read: list a key to be sure.
            filesystem.get_file_info(fs.FileSelector(location.path(), allow_not_found=True))
            return
    except OSError as e:
        raise StorageError(_explain(location, str(e))) from None
    raise StorageError(
        f"sink.path: bucket {bucket!r} does not exist at "
        f"{endpoint or 'the default AWS endpoint'}; create it first"
    )


def _explain(location: TableLocation, error: str) -> str:
    """An S3 error, told as the setting to fix."""
    lowered = error.lower()
    if any(
        word in lowered
        for word in (
            "access denied",
            "access_denied",
            "accessdenied",
            "invalidaccesskeyid",
            "signature",
            "403",
        )
    ):
        return (
            f"credentials for {location.uri} were refused: check "
            f"{_origin(location, 'access_key_id', 'AWS_ACCESS_KEY_ID')} and "
            f"{_origin(location, 'secret_access_key', 'AWS_SECRET_ACCESS_KEY')} ({error.strip()})"
        )
    return f"sink.path {location.uri}: the store failed: {error.strip()}"
