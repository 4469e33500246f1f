"""Pipeline files: YAML decoded with msgspec into the very types of the Python API.

A pipeline file is the keyword arguments of ``rayconnect.config.sink.SinkPipelineConfig`` written as
YAML, plus ``kind``::

    kind: sink                      # sink: Kafka -> Delta
    name: orders
    source:                         # rc.KafkaSource
      metadata:                     # type: static (default) | file | single_cluster
        streams:
          - stream_id: orders
            clusters:
              local:                # cluster id -> rc.ClusterMetadata
                bootstrap_servers: "127.0.0.1:9092"
                topics: [orders]
                properties:         # Kafka client properties (SASL, TLS), strings
                  security.protocol: SASL_SSL
                  sasl.mechanism: PLAIN
                  sasl.plain.username: rayconnect
                  sasl.plain.password: ${KAFKA_PASSWORD}
      starting_offsets: earliest
    sink: {path: /data/orders}      # rc.DeltaSink
    commit: {commit_interval_s: 5}  # rc.CommitSettings
    spark: {executors: 1}           # rc.SparkSettings
    placement: {strategy: spread}   # rc.Placement: spread | pack, prefer: {role: {label: value}}
    partitions_per_host: 256        # partitions of one topic per participant host process
    topic_groups: 4                 # many topics: they share hosts in this many groups

A source pipeline (KIP-618: any source -> Kafka) is ``rc.SourcePipeline``'s keyword
arguments (``rayconnect.config.source.SourcePipelineConfig``), with the task as a tagged
mapping - ``type`` is one of ``files`` (rc.FileSource), ``delta`` (rc.DeltaTableSource),
``generator`` (rc.GeneratorSource), ``postgres`` (rc.PostgresSource: change data from a
PostgreSQL database, docs/guides/postgres-source.md), each with its constructor's
parameters, or ``python``
for any SourceTask subclass, imported when the file is read::

    kind: source
    name: numbers
    task: {type: generator, topic: numbers, partitions: 4}
    # task: {type: python, class: "mypkg.tasks:Counter", args: {topic: numbers}}
    target: {bootstrap_servers: "127.0.0.1:9092"}   # rc.KafkaTarget
    tasks: 2
    transaction_boundary: poll      # poll | interval | connector
    exactly_once: required          # requested | required

A database mirror (``kind: mirror``, ``rayconnect.config.mirror.MirrorConfig``) is the two
pipelines of a Postgres database mirrored into lake tables, as one file::

    kind: mirror
    name: shop-mirror
    database: postgresql://cdc@db:5432/shop   # password: password_env / PGPASSWORD
    to: /data/lake/shop                        # a Delta table per Postgres table

Rules:

- Every error is a ``PipelineFileError`` (a ``ConfigError``) naming the file, the line, the path
  of the bad field (``$.source.metadata.streams[0]...``) and what was expected - raised by
  ``load_pipeline_file``, before any actor starts. Unknown fields are errors (a typo must not
  silently fall back to a default), with the closest known name suggested.
- ``${VAR}`` in any string value is replaced by the environment variable ``VAR`` (an error if
  it is not set); ``${VAR:-default}`` falls back to ``default``; ``$$`` is a literal ``$``. Use
  it for credentials, so they live in the environment, not in the file. Substituted values are
  never echoed in error messages.
- Values under ``properties`` may be written as YAML numbers or booleans; they are passed on
  as strings, as Kafka clients expect.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from rayconnect.config.mirror import MirrorConfig
from rayconnect.config.sink import SinkPipelineConfig
from rayconnect.config.source import SourcePipelineConfig
from rayconnect.errors import ConfigError

__all__ = ["KINDS", "PipelineFileError", "load_pipeline_file", "loads_pipeline"]

PipelineConfig = SinkPipelineConfig | SourcePipelineConfig | MirrorConfig

# kind -> config type
KINDS: dict[str, type] = {
    "sink": SinkPipelineConfig,
    "source": SourcePipelineConfig,
    "mirror": MirrorConfig,
}


class PipelineFileError(ConfigError):
    """A pipeline file is invalid. ``str()`` reads ``FILE:LINE: PATH: what was expected``."""

    def __init__(self, file: str, path: str, message: str, line: int | None = None) -> None:
        self.file, self.path, self.message, self.line = file, path, message, line
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {path}: {message}")


# -- environment interpolation -------------------------------------------------------------

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, env: Mapping[str, str], path: str, errors: list) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            errors.append(
                (
                    path,
                    f"environment variable {name} is not set (write ${{{name}:-default}} for a default)",
                )
            )
            return ""

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, env, _join(path, k), errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    return value


_STRING_MAPS = ("properties", "producer_properties", "storage_options")


def _stringify_properties(value: Any) -> Any:
    """Kafka properties are strings: accept YAML numbers and booleans for them. A python
    task's ``args`` are passed on as written."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "args":
                out[k] = v
                continue
            if k in _STRING_MAPS and isinstance(v, dict):
                v = {
                    pk: (str(pv).lower() if isinstance(pv, bool) else str(pv))
                    if isinstance(pv, bool | int | float)
                    else pv
                    for pk, pv in v.items()
                }
            out[k] = _stringify_properties(v)
        return out
    if isinstance(value, list):
        return [_stringify_properties(v) for v in value]
    return value


# -- paths -----------------------------------------------------------------------------------

_SIMPLE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _join(path: str, key: Any) -> str:
    return (
        f"{path}.{key}" if isinstance(key, str) and _SIMPLE_KEY.match(key) else f"{path}[{key!r}]"
    )


_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[('(?:[^'\\]|\\.)*'|\.\.\.)\]")


def _segments(path: str) -> list[Any]:
    """``$.a[0]['x.y'].b`` -> ``['a', 0, 'x.y', 'b']``; ``[...]`` stays ``...``."""
    out: list[Any] = []
    for m in _SEGMENT.finditer(path[1:]):
        if m.group(1) is not None:
            out.append(m.group(1))
        elif m.group(2) is not None:
            out.append(int(m.group(2)))
        else:
            raw = m.group(3)
            out.append(... if raw == "..." else raw[1:-1])
    return out


def _path_of(segments: list[Any]) -> str:
    path = "$"
    for s in segments:
        path = f"{path}[{s}]" if isinstance(s, int) else _join(path, s)
    return path


def _fields(tp: type[msgspec.Struct]) -> dict[str, Any]:
    """A Struct's fields by their name in files (``class`` for ``class_``) -> type."""
    hints = typing.get_type_hints(tp)
    return {
        encoded: hints[name]
        for name, encoded in zip(tp.__struct_fields__, tp.__struct_encode_fields__, strict=True)
    }


def _child_type(tp: Any, key: Any) -> Any:
    """The Python type at ``key`` inside ``tp`` (Struct field, dict value, sequence item)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if member is type(None):
                continue
            found = _child_type(member, key)
            if found is not None:
                return found
        return None
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _fields(tp).get(key) if isinstance(key, str) else None
    if origin is dict:
        return args[1]
    if origin in (tuple, list):
        return args[0] if args else None
    return None


def _resolve(raw: Any, tp: Any, segments: list[Any]) -> list[Any]:
    """Replace msgspec's ``[...]`` (a dict key it does not name) by the key that fails."""
    resolved: list[Any] = []
    for i, seg in enumerate(segments):
        if seg is ... and isinstance(raw, dict):
            value_type = _child_type(tp, None) if typing.get_origin(tp) is dict else None
            rest = segments[i + 1 :]
            for key, value in raw.items():
                try:
                    msgspec.convert(value, value_type) if value_type is not None else None
                except msgspec.ValidationError:
                    return [*resolved, key, *_resolve(value, value_type, rest)]
            return [*resolved, *segments[i:]]
        resolved.append(seg)
        tp = _child_type(tp, seg)
        if (
            isinstance(raw, dict)
            and seg in raw
            or isinstance(raw, list)
            and isinstance(seg, int)
            and seg < len(raw)
        ):
            raw = raw[seg]
        else:
            raw = None
    return resolved


def _line_of(node: Any, segments: list[Any]) -> int | None:
    """1-based line of the YAML node at ``segments`` (or of its nearest ancestor)."""
    line = node.start_mark.line + 1 if node is not None else None
    for seg in segments:
        child = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(seg):
                    child = v
                    line = k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(seg, int) and seg < len(node.value):
            child = node.value[seg]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


# -- tagged unions (metadata: static | file | single_cluster) --------------------------------


def _tag_required(members: list[type]) -> bool:
    """A union whose members say ``tag_required`` has no default member (``task``)."""
    return bool(getattr(members[0], "tag_required", False))


def _tagged_members(tp: Any) -> list[type[msgspec.Struct]]:
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return []
    return [
        m
        for m in typing.get_args(tp)
        if isinstance(m, type) and issubclass(m, msgspec.Struct) and m.__struct_config__.tag
    ]


def _fill_default_tags(raw: Any, tp: Any) -> Any:
    """A mapping for a union of tagged Structs may omit its tag (``type``): the union's first
    member is the default - for ``source.metadata`` that is ``static``."""
    members = _tagged_members(tp)
    if members and isinstance(raw, dict):
        field = members[0].__struct_config__.tag_field
        if field not in raw:
            if _tag_required(members):
                return raw  # reported by _unknown_fields
            raw = {field: members[0].__struct_config__.tag, **raw}
        chosen = [m for m in members if m.__struct_config__.tag == raw[field]]
        return _fill_default_tags(raw, chosen[0]) if chosen else raw
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(raw, dict):
        hints = _fields(tp)
        return {k: _fill_default_tags(v, hints[k]) if k in hints else v for k, v in raw.items()}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if isinstance(raw, dict) and (
                typing.get_origin(member) is dict
                or (isinstance(member, type) and issubclass(member, msgspec.Struct))
            ):
                return _fill_default_tags(raw, member)
            if isinstance(raw, list) and typing.get_origin(member) in (tuple, list):
                return _fill_default_tags(raw, member)
        return raw
    if origin is dict and isinstance(raw, dict):
        return {k: _fill_default_tags(v, args[1]) for k, v in raw.items()}
    if origin in (tuple, list) and isinstance(raw, list) and args:
        return [_fill_default_tags(v, args[0]) for v in raw]
    return raw


# -- unknown fields --------------------------------------------------------------------------


def _unknown_fields(raw: Any, tp: Any, segments: list[Any]) -> tuple[list[Any], str] | None:
    """The first field the types do not know, as (path segments, message)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    members = _tagged_members(tp)
    if members and isinstance(raw, dict):
        field = members[0].__struct_config__.tag_field
        tags = [m.__struct_config__.tag for m in members]
        chosen = [m for m in members if m.__struct_config__.tag == raw.get(field)]
        if not chosen and _tag_required(members):
            got = "missing" if field not in raw else f"got {raw[field]!r}"
            return [*segments, field], f"{got}; expected one of: {', '.join(map(str, tags))}"
        if not chosen:
            return [*segments, field], (
                f"expected one of: {', '.join(map(str, tags))} (default {tags[0]}), "
                f"got {raw.get(field)!r}"
            )
        return _unknown_fields(raw, chosen[0], segments)
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if isinstance(raw, dict) and (
                typing.get_origin(member) is dict
                or (isinstance(member, type) and issubclass(member, msgspec.Struct))
            ):
                return _unknown_fields(raw, member, segments)
            if isinstance(raw, list) and typing.get_origin(member) in (tuple, list):
                return _unknown_fields(raw, member, segments)
        return None
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(raw, dict):
        config = tp.__struct_config__
        fields = _fields(tp)
        known = list(fields)
        for key, value in raw.items():
            if config.tag_field is not None and key == config.tag_field:
                if value != config.tag:
                    return [*segments, key], f"expected {config.tag!r}, got {value!r}"
                continue
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                return [*segments, key], f"unknown field; {hint}expected one of: {', '.join(known)}"
            found = _unknown_fields(value, fields[key], [*segments, key])
            if found:
                return found
        return None
    if origin is dict and isinstance(raw, dict):
        for key, value in raw.items():
            found = _unknown_fields(value, args[1], [*segments, key])
            if found:
                return found
    if origin in (tuple, list) and isinstance(raw, list) and args:
        for i, value in enumerate(raw):
            found = _unknown_fields(value, args[0], [*segments, i])
            if found:
                return found
    return None


# -- loading ---------------------------------------------------------------------------------

_AT = re.compile(r"^(?P<msg>.*) - at `(?P<path>\$[^`]*)`$", re.DOTALL)


def _expected(message: str) -> str:
    return (
        message[:1].lower() + message[1:] if message.startswith(("Expected", "Object")) else message
    )


_FIELD_PREFIX = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*): (.+)$", re.DOTALL
)


def _field_of_message(message: str, tp: Any, segments: list[Any]) -> tuple[list[Any], str]:
    """A check failing as ``"field: problem"`` on a Struct that has ``field``: point at the
    field (``$.target.properties``) rather than the Struct, and drop the prefix."""
    m = _FIELD_PREFIX.match(message)
    if not m:
        return segments, message
    for seg in segments:
        tp = _child_type(tp, seg)
    extra = []
    for part in m[1].split("."):
        members = _tagged_members(tp) or [tp]
        owners = [
            t
            for t in members
            if isinstance(t, type) and issubclass(t, msgspec.Struct) and part in _fields(t)
        ]
        if not owners:
            return segments, message
        extra.append(part)
        tp = _fields(owners[0])[part]
    return [*segments, *extra], m[2]


def _literal_choices(message: str, tp: Any, segments: list[Any]) -> str:
    """msgspec's ``Invalid enum value 'x'`` for a Literal field -> the values it accepts."""
    if not message.startswith("Invalid enum value"):
        return message
    for seg in segments:
        tp = _child_type(tp, seg)
    choices = [a for a in typing.get_args(tp) if isinstance(a, str)]
    if typing.get_origin(tp) is not typing.Literal or not choices:
        return message
    got = message.removeprefix("Invalid enum value").strip()
    return f"expected one of: {', '.join(choices)}, got {got}"


def loads_pipeline(text: str, file: str = "<string>", env: Mapping[str, str] | None = None) -> Any:
    """Decode a pipeline file's text into its config type (``SinkPipelineConfig`` for
    ``kind: sink``, ``SourcePipelineConfig`` for ``kind: source``, ``MirrorConfig`` for
    ``kind: mirror``)."""
    env = os.environ if env is None else env
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise PipelineFileError(file, "$", f"not valid YAML: {problem}", line) from None
    if not isinstance(raw, dict):
        raise PipelineFileError(
            file,
            "$",
            f"expected a mapping with kind, name, ... (see examples/), got {type(raw).__name__}",
            1,
        )
    kinds = ", ".join(sorted(KINDS))
    kind = raw.get("kind")
    if kind is None:
        raise PipelineFileError(file, "$.kind", f"missing; expected one of: {kinds}", 1)
    if kind not in KINDS:
        raise PipelineFileError(
            file, "$.kind", f"expected one of: {kinds}, got {kind!r}", _line_of(node, ["kind"])
        )
    config_type = KINDS[kind]
    body = {k: v for k, v in raw.items() if k != "kind"}

    errors: list[tuple[str, str]] = []
    body = _interpolate(body, env, "$", errors)
    if errors:
        path, message = errors[0]
        raise PipelineFileError(file, path, message, _line_of(node, _segments(path)))
    body = _stringify_properties(body)

    body = _fill_default_tags(body, config_type)
    unknown = _unknown_fields(body, config_type, [])
    if unknown:
        segments, message = unknown
        raise PipelineFileError(file, _path_of(segments), message, _line_of(node, segments))
    try:
        return msgspec.convert(body, config_type)
    except msgspec.ValidationError as e:
        m = _AT.match(str(e))
        message, path = (m["msg"], m["path"]) if m else (str(e), "$")
        segments = _resolve(body, config_type, _segments(path))
        message = _literal_choices(message, config_type, segments)
        segments, message = _field_of_message(message, config_type, segments)
        raise PipelineFileError(
            file, _path_of(segments), _expected(message), _line_of(node, segments)
        ) from None


def load_pipeline_file(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Any:
    """Read and validate a pipeline file; raises ``PipelineFileError`` naming file and field."""
    file = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PipelineFileError(file, "$", f"cannot read the file: {e.strerror or e}") from None
    return loads_pipeline(text, file, env)
