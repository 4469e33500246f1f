"""Open an Iceberg REST catalog (``config.rest_catalog.RestCatalog``) for the committers: the
same pyiceberg ``Catalog`` the SQL kind gives them, so the round commit, upserts and routes
(tables and namespaces created on the fly) do not know which kind they talk to.

Opening checks what would otherwise fail minutes later inside a coordinator's recovery
loop, each with the setting to fix: the URL answers (one connect, short timeout), the
credential is taken (pyiceberg fetches an OAuth2 token at once), the warehouse exists (a
namespace listing: SeaweedFS answers ``/v1/config`` for any warehouse name and fails only
there). The driver does it before any actor starts (``pipelines.sink.check_catalog``).

Multi-table commit (``POST /v1/{prefix}/transactions/commit``): not used. SeaweedFS 4.48
serves it (204 for a commit of two tables, 409 for all when one table's requirement fails)
but its handler says it is not crash-atomic (metadata pointers are flipped one by one,
rolled back best-effort), and pyiceberg 0.12 has no call for it (only private transaction
fields). docs/guides/iceberg-s3.md has the evidence; a routed round commits one table after
the other and recovers by ``protocol.table_offsets``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from rayconnect.config.rest_catalog import RestCatalog
from rayconnect.errors import RayconnectError

_CONNECT_TIMEOUT_S = 5.0


class CatalogError(RayconnectError, RuntimeError):
    """The Iceberg catalog cannot be used; the message names the setting to fix."""


def open_rest_catalog(
    settings: RestCatalog,
    name: str,
    file_io: Mapping[str, str],
    timeout_s: float = _CONNECT_TIMEOUT_S,
) -> Any:
    """A pyiceberg ``RestCatalog`` on ``settings``' warehouse, checked (``CatalogError``).
    ``file_io``: the tables' store settings (``s3.*``) found from the sink's storage
    options or the environment; the catalog's own ``s3`` win."""
    from pyiceberg.catalog import load_catalog

    _check_reachable(settings.uri, timeout_s)
    properties = settings.catalog_properties(dict(file_io))
    try:
        catalog = load_catalog(name, **properties)
    except Exception as e:
        raise CatalogError(_explain(settings, e)) from None
    try:
        catalog.list_namespaces()
    except Exception as e:
        raise CatalogError(
            f"sink.rest_catalog.warehouse {settings.warehouse!r} cannot be used at "
            f"{settings.uri}: {_message(e)}"
        ) from None
    return catalog


def _check_reachable(uri: str, timeout_s: float) -> None:
    """One TCP connect: pyiceberg's HTTP session has no timeout of its own."""
    parts = urlsplit(uri)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        raise CatalogError(
            f"sink.rest_catalog.uri: cannot reach {uri} ({e.strerror or e})"
        ) from None


def _explain(settings: RestCatalog, error: Exception) -> str:
    """Why opening failed, as the setting to fix (the credential's name, never its value)."""
    text = _message(error)
    if type(error).__name__ in ("OAuthError", "UnauthorizedError", "ForbiddenError"):
        source = (
            f"the environment variable {settings.credential_env}"
            if settings.credential_env
            else f"the file {settings.credential_file}"
            if settings.credential_file
            else "no credential (set sink.rest_catalog.credential_env or credential_file)"
        )
        return f"sink.rest_catalog: the catalog at {settings.uri} refused {source}: {text}"
    return f"sink.rest_catalog.uri: the catalog at {settings.uri} failed: {text}"


def _message(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).strip()[:300]}"
