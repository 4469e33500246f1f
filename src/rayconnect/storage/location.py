"""Where a table lives - a local folder or an object store - seen the same way by every actor.

A ``TableLocation`` is a table URI plus delta-rs ``storage_options``. It gives the two views
the sink needs of one place: delta-rs's (``delta_uri`` + ``delta_options``: log, commits,
vacuum) and pyarrow's (``filesystem`` + ``path``: Spark tasks write Parquet straight to the
store, the committer reads footers). No actor needs a shared disk: a Spark executor on one
node writes ``s3://.../staging/...`` and the coordinator on another reads it back.

Credentials: from ``storage_options`` (a pipeline file can say ``${AWS_SECRET_ACCESS_KEY}``),
else from the environment of the process that opens the table - resolved there, when it is
opened, so each node may bring its own. ``repr`` masks them (``rayconnect.redact``).

S3 defaults: ``conditional_put=etag`` (S3 has no atomic rename; without a conditional put two
racing commits could both land, and a zombie coordinator would not be fenced),
``AWS_ALLOW_HTTP=true`` for an ``http://`` endpoint, region ``us-east-1`` if none is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rayconnect.errors import RayconnectError
from rayconnect.redact import redact_properties

__all__ = ["StorageError", "TableLocation"]

#: URI scheme -> the store it names ("file" = a local path).
_SCHEMES = {
    "": "file",
    "file": "file",
    "s3": "s3",
    "s3a": "s3",
    "gs": "gs",
    "gcs": "gs",
    "az": "az",
    "abfs": "az",
    "abfss": "az",
}

#: S3 settings, by the name delta-rs and AWS give them without the ``aws_`` prefix
#: (lower case) -> the environment variable that supplies it when storage_options do not.
_S3_KEYS = {
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
    "region": "AWS_REGION",
    "endpoint_url": "AWS_ENDPOINT_URL",
    "allow_http": "AWS_ALLOW_HTTP",
}
_S3_ALIASES = {"token": "session_token", "endpoint": "endpoint_url", "default_region": "region"}
#: Settings that already choose how S3 commits are made safe: then no conditional_put default.
_S3_COMMIT_SAFETY = {"conditional_put", "aws_conditional_put", "aws_s3_locking_provider"}


class StorageError(RayconnectError, ValueError):
    """A table URI or its storage options are not usable; the message names the setting."""


def s3_setting(key: str) -> str | None:
    """The canonical S3 setting a storage option names (``AWS_SECRET_ACCESS_KEY`` ->
    ``secret_access_key``), or None for any other option."""
    k = key.lower()
    k = k.removeprefix("aws_")
    k = _S3_ALIASES.get(k, k)
    return k if k in _S3_KEYS else None


@dataclass(frozen=True)
class TableLocation:
    """A table's URI (an absolute local path, or ``scheme://bucket/prefix``) and options.

    Frozen and hashable (options are a sorted tuple), so it can key the writer's per-table
    queues and travel to Ray actors and Spark tasks.
    """

    uri: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, uri: str, storage_options: Mapping[str, str] | None = None) -> TableLocation:
        """Check and normalise ``uri``; relative local paths become absolute here."""
        if not uri:
            raise StorageError("the table path is empty")
        scheme = urlsplit(uri).scheme.lower() if "://" in uri else ""
        if scheme not in _SCHEMES:
            raise StorageError(
                f"table {uri!r}: unsupported scheme {scheme!r}; use a local path, s3://, gs:// or az://"
            )
        options = tuple(sorted((str(k), str(v)) for k, v in (storage_options or {}).items()))
        if _SCHEMES[scheme] == "file":
            path = uri[len("file://") :] if scheme == "file" else uri
            return cls(os.path.abspath(os.path.expanduser(path)), options)
        parts = urlsplit(uri)
        if not parts.netloc:
            raise StorageError(f"table {uri!r}: no bucket (expected {scheme}://BUCKET/PATH)")
        prefix = parts.path.strip("/")
        return cls(f"{scheme}://{parts.netloc}" + (f"/{prefix}" if prefix else ""), options)

    # -- what it is ---------------------------------------------------------------------

    @property
    def store(self) -> str:
        """``file``, ``s3``, ``gs`` or ``az``."""
        return _SCHEMES[urlsplit(self.uri).scheme.lower() if "://" in self.uri else ""]

    @property
    def is_local(self) -> bool:
        return self.store == "file"

    @property
    def bucket(self) -> str:
        """The bucket (container) of an object-store table."""
        if self.is_local:
            raise StorageError(f"{self.uri} is a local path, not in a bucket")
        return urlsplit(self.uri).netloc

    @property
    def storage_options(self) -> dict[str, str]:
        """The options as given (no defaults, no environment)."""
        return dict(self.options)

    # -- delta-rs -----------------------------------------------------------------------

    def s3_settings(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Canonical S3 settings (``access_key_id``, ``endpoint_url``...): options first,
        then the environment."""
        env = os.environ if env is None else env
        settings: dict[str, str] = {}
        for key, value in self.options:
            canonical = s3_setting(key)
            if canonical is not None:
                settings[canonical] = value
        for canonical, var in _S3_KEYS.items():
            if canonical not in settings and env.get(var):
                settings[canonical] = env[var]
        if "region" not in settings and env.get("AWS_DEFAULT_REGION"):
            settings["region"] = env["AWS_DEFAULT_REGION"]
        return settings

    def iceberg_properties(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """pyiceberg FileIO properties (``s3.endpoint``...) for a table on S3, from the
        same settings as ``delta_options``; {} for any other store."""
        if self.store != "s3":
            return {}
        names = {
            "endpoint_url": "s3.endpoint",
            "access_key_id": "s3.access-key-id",
            "secret_access_key": "s3.secret-access-key",
            "session_token": "s3.session-token",
            "region": "s3.region",
        }
        settings = self.s3_settings(env)
        settings.setdefault("region", "us-east-1")
        return {names[k]: v for k, v in settings.items() if k in names}

    def delta_options(self, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
        """delta-rs ``storage_options``: the given ones, the S3 settings found in the
        environment, and the S3 defaults (see the module doc). None for a local table."""
        if self.is_local:
            return dict(self.options) or None
        options = dict(self.options)
        if self.store != "s3":
            return options
        given = {s3_setting(k) for k in options}
        for canonical, value in self.s3_settings(env).items():
            if canonical not in given:
                options[_S3_KEYS[canonical]] = value
        settings = self.s3_settings(env)
        if "region" not in settings:
            options["AWS_REGION"] = "us-east-1"
        if settings.get("endpoint_url", "").startswith("http://") and "allow_http" not in settings:
            options["AWS_ALLOW_HTTP"] = "true"
        if not {k.lower() for k in options} & _S3_COMMIT_SAFETY:
            options["conditional_put"] = "etag"
        return options

    # -- pyarrow ------------------------------------------------------------------------

    def filesystem(self, *, timeout_s: float | None = None, attempts: int = 3) -> Any:
        """A pyarrow FileSystem holding the table; paths in it come from ``path()``.

        ``timeout_s``/``attempts`` bound each S3 request (a pre-start check wants to fail
        fast, not retry for minutes).
        """
        from pyarrow import fs

        if self.is_local:
            return fs.LocalFileSystem()
        if self.store == "s3":
            s = self.s3_settings()
            endpoint = s.get("endpoint_url")
            kwargs: dict[str, Any] = {
                "access_key": s.get("access_key_id"),
                "secret_key": s.get("secret_access_key"),
                "session_token": s.get("session_token"),
                "region": s.get("region", "us-east-1"),
                "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=attempts),
            }
            if endpoint:
                parts = urlsplit(endpoint)
                kwargs["endpoint_override"] = parts.netloc or endpoint
                kwargs["scheme"] = parts.scheme or "https"
            if timeout_s is not None:
                kwargs["connect_timeout"] = timeout_s
                kwargs["request_timeout"] = timeout_s
            if not kwargs["access_key"]:  # the default credential chain (instance role...)
                kwargs.pop("access_key")
                kwargs.pop("secret_key")
                kwargs.pop("session_token")
            return fs.S3FileSystem(**kwargs)
        # gs:// and az://: the account / endpoint from the options, credentials as pyarrow
        # resolves them (environment, service account file, managed identity); delta-rs gets
        # the storage_options as given. Not exercised by the tests (no local GCS/Azure).
        given = {k.lower(): v for k, v in self.options}
        if self.store == "az":
            account = _first(given, os.environ, "azure_storage_account_name", "account_name")
            if not account:
                raise StorageError(
                    f"{self.uri}: set storage_options.azure_storage_account_name "
                    "(or AZURE_STORAGE_ACCOUNT_NAME)"
                )
            return fs.AzureFileSystem(
                account,
                account_key=_first(given, os.environ, "azure_storage_account_key", "account_key"),
                sas_token=_first(given, os.environ, "azure_storage_sas_key", "sas_token"),
            )
        endpoint = _first(given, os.environ, "google_endpoint_url", "endpoint_url")
        if endpoint:
            parts = urlsplit(endpoint)
            return fs.GcsFileSystem(endpoint_override=parts.netloc, scheme=parts.scheme)
        return fs.GcsFileSystem()

    def path(self, rel: str = "") -> str:
        """The pyarrow path of ``rel`` (relative to the table root, ``/``-separated)."""
        root = self.uri if self.is_local else self.uri.split("://", 1)[1]
        rel = rel.strip("/")
        return f"{root}/{rel}" if rel else root

    def make_parents(self, filesystem: Any, path: str) -> None:
        """Create the folder a new file goes in - on a local disk only: object stores have
        no folders, and a marker object would just be one more thing for vacuum to skip."""
        if self.is_local:
            filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)

    def remove_tree(self, rel: str) -> None:
        """Delete everything under ``rel`` (a staging folder): every object with that prefix."""
        filesystem = self.filesystem()
        path = self.path(rel)
        from pyarrow import fs

        if filesystem.get_file_info(path).type != fs.FileType.NotFound:
            filesystem.delete_dir(path)

    def join(self, rel: str) -> str:
        """The URI of ``rel`` under the table."""
        rel = rel.strip("/")
        return f"{self.uri}/{rel}" if rel else self.uri

    def __repr__(self) -> str:
        return f"TableLocation({self.uri!r}, {redact_properties(dict(self.options))!r})"

    __str__ = __repr__


def _first(given: Mapping[str, str], env: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` in the (lower-cased) options, else as an environment variable."""
    for name in names:
        if given.get(name):
            return given[name]
    for name in names:
        if env.get(name.upper()):
            return env[name.upper()]
    return None


def as_location(table: str | TableLocation) -> TableLocation:
    """A location from a location or a plain path/URI (the demo and bench pass paths)."""
    return table if isinstance(table, TableLocation) else TableLocation.parse(table)
