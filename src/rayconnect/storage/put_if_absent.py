"""Put-if-absent of one small object in a table on an object store (a Delta log entry).

pyarrow's object-store filesystems have no conditional put (apache/arrow#44281), so this
goes through ``obstore`` - the Python bindings of the Rust ``object_store`` crate delta-rs
itself commits with: ``put(..., mode="create")`` is an ``If-None-Match: *`` PUT on S3
(``conditional_put=etag``; AWS S3, SeaweedFS, MinIO answer 412 to the loser), a
generation-match-0 upload on GCS and an ``If-None-Match: *`` upload on Azure.

The store is built from the same settings the ``TableLocation`` resolves for delta-rs and
pyarrow (storage options first, then the environment): endpoint, region, credentials,
allow-http. What cannot be fenced this way is refused by ``problem()`` (checked when the
sink is configured): an S3 table whose options choose a DynamoDB lock (delta-rs's commits
are then fenced by its lock table, not by the store) or another ``conditional_put``.

The loser of a race gets ``FileExistsError``. A PUT retried after a lost response can find
its own first attempt there: then the object is read back, and equal bytes are success
(a log entry holds its commit's unique id, so no other writer's is equal).
"""

from __future__ import annotations

from typing import Any

from rayconnect.storage.location import StorageError, TableLocation

__all__ = ["object_store", "problem", "put_if_absent"]

#: obstore's client options a storage option may set (the others are the store's config)
_CLIENT_KEYS = {"allow_http", "aws_allow_http", "google_allow_http", "azure_allow_http"}
#: the store kind -> the prefix of its config keys in storage options
_CONFIG_PREFIX = {"gs": "google_", "az": "azure_"}


def problem(location: TableLocation) -> str | None:
    """Why a put-if-absent in ``location`` would not be atomic, or None (a local path, or an
    object store with a conditional put). From the options alone: no request is made."""
    if location.store != "s3":
        return None
    given = {k.lower(): v for k, v in location.options}
    locking = given.get("aws_s3_locking_provider")
    if locking:
        return (
            f"aws_s3_locking_provider={locking!r}: delta-rs's commits are then fenced by its "
            "lock table, which a conditional put takes no part in; drop it "
            "(conditional_put=etag is the default)"
        )
    mode = given.get("conditional_put", given.get("aws_conditional_put", "etag"))
    if mode.lower() != "etag":
        return f"conditional_put={mode!r}: a put-if-absent on S3 needs conditional_put=etag"
    return None


def object_store(location: TableLocation) -> Any:
    """An obstore store rooted at ``location``'s table folder (keys relative to the table)."""
    if location.is_local:
        raise StorageError(f"{location.uri} is a local path: no object store")
    why = problem(location)
    if why is not None:
        raise StorageError(f"{location.uri}: {why}")
    try:
        from obstore.store import AzureStore, GCSStore, S3Store
    except ImportError as exc:  # a dependency; missing only in a hand-made environment
        raise StorageError(
            f"{location.uri}: a merge-on-read commit on an object store needs the obstore "
            "package (pip install obstore==0.12.1)"
        ) from exc
    bucket, _, prefix = location.uri.split("://", 1)[1].partition("/")
    if location.store == "s3":
        s = location.s3_settings()
        config = {
            key: s[key]
            for key in ("access_key_id", "secret_access_key", "session_token")
            if s.get(key)
        }
        config["region"] = s.get("region", "us-east-1")
        if s.get("endpoint_url"):
            config["endpoint"] = s["endpoint_url"]
        config["conditional_put"] = "etag"
        allow_http = s.get("allow_http", str(s.get("endpoint_url", "").startswith("http://")))
        return S3Store(
            bucket,
            prefix=prefix or None,
            config=config,  # type: ignore[arg-type]  # a dict of the TypedDict's keys
            client_options={"allow_http": allow_http.lower() == "true"},
        )
    # gs:// and az://: their storage options as delta-rs takes them, credentials from the
    # environment as object_store finds them. Not exercised by the tests (no local GCS/Azure).
    given = {k.lower(): v for k, v in location.options}
    config = {k: v for k, v in given.items() if k.startswith(_CONFIG_PREFIX[location.store])}
    client: dict[str, Any] = {}
    for key in _CLIENT_KEYS & given.keys():
        client["allow_http"] = given[key].lower() == "true"
    try:
        if location.store == "gs":
            return GCSStore(bucket, prefix=prefix or None, config=config, client_options=client)  # type: ignore[arg-type]
        return AzureStore(bucket, prefix=prefix or None, config=config, client_options=client)  # type: ignore[arg-type]
    except Exception as exc:  # obstore's config errors name the key or what is missing
        raise StorageError(f"{location.uri}: {exc}") from exc


def put_if_absent(location: TableLocation, rel: str, data: bytes, store: Any = None) -> None:
    """Write ``data`` to ``rel`` (relative to the table) unless an object is there:
    ``FileExistsError`` then (another writer's). ``store``: from ``object_store``."""
    import obstore
    from obstore.exceptions import AlreadyExistsError

    store = store if store is not None else object_store(location)
    try:
        obstore.put(store, rel, data, mode="create")
    except AlreadyExistsError:
        if bytes(obstore.get(store, rel).bytes()) == data:
            return  # our own first attempt, its response lost and the PUT retried
        raise FileExistsError(f"{location.join(rel)} exists") from None
