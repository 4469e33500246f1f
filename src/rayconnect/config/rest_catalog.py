"""The settings of an Iceberg REST catalog (``IcebergSink.rest_catalog``): where it is, which
warehouse, where its credential comes from.

The credential (OAuth2 client credentials ``client_id:client_secret``; SeaweedFS's catalog
takes the S3 access key and secret) is never part of the configuration: it is named by an
environment variable or a file, and read when a process opens the catalog (the driver's
check at start, then each coordinator and writer). So it never shows in a pipeline file,
a status, a log line or a ``repr``. Opening the catalog: ``tables.iceberg_rest``.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import msgspec

from rayconnect.errors import ConfigError, require
from rayconnect.redact import redacted_repr

#: pyiceberg properties that have a field of their own here (a secret never in a mapping)
_OWN_FIELDS = ("type", "uri", "warehouse", "credential", "token")


class RestCatalog(msgspec.Struct, frozen=True):
    """An Iceberg REST catalog (SeaweedFS's, Polaris, Lakekeeper, Nessie...). Tables and
    namespaces are created in it on the fly; its warehouse is where their files go unless
    ``sink.table_location`` says otherwise."""

    #: the catalog's base URL, e.g. ``http://127.0.0.1:8181``
    uri: str
    #: the warehouse to open: ``s3://<bucket>/`` (SeaweedFS: a table bucket), also the root of
    #: the tables' files (``<warehouse>/<namespace>/<name>``); a warehouse name (not a URL)
    #: needs ``sink.table_location``
    warehouse: str
    #: the environment variable holding the OAuth2 client credential ``client_id:secret``
    #: (read in each process that opens the catalog); empty: no credential (or a file's)
    credential_env: str = ""
    #: a file holding the credential ``client_id:secret`` (its first line); empty: none
    credential_file: str = ""
    #: pyiceberg FileIO properties (``s3.endpoint``, ``s3.region``...) for the tables' files;
    #: left out: from ``sink.storage_options``, else the environment (as for a Delta table)
    s3: dict[str, str] = {}
    #: other pyiceberg REST catalog properties (``scope``, ``oauth2-server-uri``,
    #: ``header.X-Name``...); not the uri, warehouse or credential (fields of their own)
    properties: dict[str, str] = {}

    __repr__ = redacted_repr

    def __post_init__(self) -> None:
        parts = urlsplit(self.uri)
        require(
            parts.scheme in ("http", "https") and bool(parts.hostname),
            f"sink.rest_catalog.uri {self.uri!r} is not an http(s):// URL",
        )
        require(bool(self.warehouse), "sink.rest_catalog.warehouse is empty")
        require(
            not (self.credential_env and self.credential_file),
            "sink.rest_catalog: give credential_env or credential_file, not both",
        )
        bad = [k for k in self.s3 if not k.startswith("s3.")]
        require(not bad, f"sink.rest_catalog.s3: {bad} are not s3.* properties")
        own = [k for k in self.properties if k in _OWN_FIELDS or k.startswith("s3.")]
        require(
            not own,
            f"sink.rest_catalog.properties: {own} have settings of their own (uri, warehouse, "
            "credential_env / credential_file, s3)",
        )

    @property
    def warehouse_uri(self) -> str | None:
        """The warehouse as the root of table files (``s3://bucket``), None for a name."""
        return self.warehouse.rstrip("/") if "://" in self.warehouse else None

    def credential(self) -> str | None:
        """The credential, read now from ``credential_env`` or ``credential_file``; a
        ConfigError naming the setting (never the value) if it is not there."""
        if self.credential_env:
            value = os.environ.get(self.credential_env, "")
            require(
                bool(value),
                f"sink.rest_catalog.credential_env: the environment variable "
                f"{self.credential_env} is not set in this process",
            )
            return value
        if self.credential_file:
            try:
                with open(os.path.expanduser(self.credential_file), encoding="utf-8") as f:
                    value = f.readline().strip()
            except OSError as e:
                raise ConfigError(
                    f"sink.rest_catalog.credential_file: cannot read {self.credential_file!r}: "
                    f"{e.strerror or e}"
                ) from None
            require(
                bool(value), f"sink.rest_catalog.credential_file {self.credential_file!r} is empty"
            )
            return value
        return None

    def catalog_properties(self, file_io: dict[str, str]) -> dict[str, str]:
        """pyiceberg's properties for this catalog, the credential read now: hand them to
        pyiceberg only, never to a log. ``file_io``: the tables' store settings found
        elsewhere (``s3`` wins)."""
        properties = {"type": "rest", "uri": self.uri, "warehouse": self.warehouse}
        properties |= file_io | self.s3 | self.properties
        credential = self.credential()
        if credential is not None:
            properties["credential"] = credential
        return properties
