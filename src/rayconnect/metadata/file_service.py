"""``FileMetadataService``: streams from a YAML or JSON file, edits picked up while running.

The FLIP-246 "config map" service: an operator (or Kubernetes, mounting a ConfigMap) edits
the file and the pipeline follows without a restart::

    streams:
      - stream_id: orders
        clusters:
          east: {bootstrap_servers: "127.0.0.1:9092", topics: [orders]}
          west: {bootstrap_servers: "127.0.0.1:9093", topics: [orders, orders-eu],
                 properties: {security.protocol: PLAINTEXT}}

Why it re-reads on every call: the file is small and the enumerator polls it every few
seconds, so reading it is cheaper than being clever with mtimes (which can miss an edit made
within the clock's granularity); it is only *decoded* when its hash changed.

Why a broken edit does not stop anything: an operator's typo must not take a healthy
pipeline down. The last good metadata stays in force; ``last_error`` names the file and the
bad field (``$.streams[0].clusters.east.topics``) until a good version is saved. Only a file
that was never good (or is unreadable before its first good read) raises ``MetadataError``.

It travels to a Ray actor (cloudpickle) and may sit in a pipeline's config: only ``path`` is
state that travels; the cache is rebuilt on the other side at the first call.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from rayconnect.metadata.base import StreamLookups
from rayconnect.properties import check_client_properties
from rayconnect.protocol.streams import MetadataError
from rayconnect.protocol.types import ClusterMetadata, KafkaStream, check_name

__all__ = ["FileMetadataService", "MetadataFileError", "parse_streams"]

_JSON_SUFFIXES = {".json"}
_YAML_SUFFIXES = {".yaml", ".yml"}


class MetadataFileError(MetadataError):
    """A metadata file is unreadable or malformed; ``field`` is the JSON path of the bad
    field (``$`` when the file as a whole is wrong)."""

    def __init__(self, file: str, detail: str, field: str = "$") -> None:
        super().__init__(f"{file}: {detail} - at `{field}`")
        self.file = file
        self.detail = detail
        self.field = field


# -- the file's schema -----------------------------------------------------------------
# Strict (unknown fields rejected) so a typo such as ``topic:`` fails loudly instead of
# silently reading nothing. Property values may be written as YAML numbers/booleans.


class _ClusterSpec(msgspec.Struct, forbid_unknown_fields=True):
    bootstrap_servers: str
    topics: list[str]
    properties: dict[str, str | int | float | bool] = {}


class _StreamSpec(msgspec.Struct, forbid_unknown_fields=True):
    stream_id: str
    clusters: dict[str, Any]  # converted one by one, so errors can name the cluster id


class _FileSpec(msgspec.Struct, forbid_unknown_fields=True):
    streams: list[_StreamSpec]


def _property_value(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _convert(raw: Any, type_: type, file: str, at: str) -> Any:
    """``msgspec.convert`` whose errors carry the full path from the file's root."""
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError as e:
        detail, _, inner = str(e).partition(" - at `")
        raise MetadataFileError(file, detail, at + inner.rstrip("`").removeprefix("$")) from None


def _cluster(cluster_id: str, raw: Any, file: str, at: str) -> ClusterMetadata:
    try:
        check_name("cluster id", cluster_id)
    except ValueError as e:
        raise MetadataFileError(file, str(e), at) from None
    spec: _ClusterSpec = _convert(raw, _ClusterSpec, file, at)
    if not spec.bootstrap_servers.strip():
        raise MetadataFileError(file, "bootstrap_servers is empty", f"{at}.bootstrap_servers")
    if not spec.topics:
        raise MetadataFileError(file, "give at least one topic", f"{at}.topics")
    for i, topic in enumerate(spec.topics):
        try:
            check_name("topic", topic)
        except ValueError as e:
            raise MetadataFileError(file, str(e), f"{at}.topics[{i}]") from None
    properties = {k: _property_value(v) for k, v in spec.properties.items()}
    for problem in check_client_properties(properties):
        raise MetadataFileError(file, problem, f"{at}.properties")
    return ClusterMetadata(spec.bootstrap_servers, tuple(dict.fromkeys(spec.topics)), properties)


def parse_streams(data: bytes, file: str = "<metadata>") -> tuple[KafkaStream, ...]:
    """Decode and validate a metadata document (YAML or JSON, told apart by ``file``'s
    extension, else by content: JSON starts with ``{``). Raises ``MetadataFileError``."""
    suffix = Path(file).suffix.lower()
    is_json = suffix in _JSON_SUFFIXES or (
        suffix not in _YAML_SUFFIXES and data.lstrip().startswith(b"{")
    )
    try:
        raw = msgspec.json.decode(data) if is_json else yaml.safe_load(data)
    except (msgspec.DecodeError, yaml.YAMLError) as e:
        raise MetadataFileError(file, f"not valid {'JSON' if is_json else 'YAML'}: {e}") from None
    spec: _FileSpec = _convert(raw, _FileSpec, file, "$")
    streams: list[KafkaStream] = []
    seen: set[str] = set()
    for i, stream in enumerate(spec.streams):
        at = f"$.streams[{i}]"
        if not stream.stream_id.strip():
            raise MetadataFileError(file, "stream_id is empty", f"{at}.stream_id")
        if stream.stream_id in seen:
            raise MetadataFileError(
                file, f"duplicate stream_id {stream.stream_id!r}", f"{at}.stream_id"
            )
        seen.add(stream.stream_id)
        if not stream.clusters:
            raise MetadataFileError(file, "give at least one cluster", f"{at}.clusters")
        clusters = {
            cid: _cluster(cid, raw_cluster, file, f"{at}.clusters.{cid}")
            for cid, raw_cluster in stream.clusters.items()
        }
        streams.append(KafkaStream(stream.stream_id, clusters))
    return tuple(streams)


@dataclass
class _FileState:
    """What the service last read: the file's digest (unchanged: not parsed again), the
    streams in force, why the file's current content is not in force, and when the
    streams in force were read."""

    digest: str | None = None
    streams: tuple[KafkaStream, ...] | None = None
    error: str | None = None
    good_at: float | None = None


class FileMetadataService(msgspec.Struct, StreamLookups, tag="file", dict=True):
    """Streams from the YAML/JSON file at ``path``; see the module docstring.

    ``last_error``: why the file's current content is not in force (None: it is).
    ``last_good_at``: wall-clock time (``time.time()``) the metadata in force was read.
    """

    path: str

    def __post_init__(self) -> None:
        if not self.path:
            raise MetadataError("FileMetadataService.path is empty")

    # Kept in the instance __dict__ (not msgspec fields): neither encoded nor pickled.
    def _cache(self) -> _FileState:
        cache: _FileState | None = self.__dict__.get("_state")
        if cache is None:
            cache = self.__dict__["_state"] = _FileState()
        return cache

    @property
    def last_error(self) -> str | None:
        return self._cache().error

    @property
    def last_good_at(self) -> float | None:
        return self._cache().good_at

    def refresh(self) -> bool:
        """Re-read the file; True if new metadata came into force.

        Raises ``MetadataError`` only while there is no good metadata at all."""
        cache = self._cache()
        try:
            data = Path(self.path).read_bytes()
        except OSError as e:
            cache.digest = None  # whatever comes back next must be parsed again
            return self._failed(MetadataFileError(self.path, f"cannot read: {e.strerror or e}"))
        digest = hashlib.sha256(data).hexdigest()
        if digest == cache.digest:
            return False
        cache.digest = digest
        try:
            streams = parse_streams(data, self.path)
        except MetadataFileError as e:
            return self._failed(e)
        cache.streams, cache.error, cache.good_at = streams, None, time.time()
        return True

    def _failed(self, error: MetadataFileError) -> bool:
        cache = self._cache()
        cache.error = str(error)
        if cache.streams is None:
            cache.digest = None  # nothing good yet: report it again on every call
            raise error
        return False

    def _streams(self) -> tuple[KafkaStream, ...]:
        self.refresh()  # raises while there are no streams in force
        streams = self._cache().streams
        assert streams is not None
        return streams

    def get_all_streams(self) -> tuple[KafkaStream, ...]:
        return self._streams()
