"""Routes: one sink pipeline writing many tables (docs/guides/routes.md).

A record's table is decided by the first rule that matches it: a topic named exactly
(``topic``), a topic matching a regular expression (``topic_pattern``, the table name a
template of its groups), or a field of the record's value (``field``: a Debezium event's
``source.table``, or any column). The name alone is decided here, purely (no IO): where the
table lives follows from the sink (``DeltaSink.route_table``, ``IcebergSink.route_table``).
Records no rule matches are dead letters (with the reason) or stop their partition.

A rule may also give its tables settings of their own (``value_format``, ``value_schema``,
``envelope``, ``key_schema``, ``write_mode``, ``key_columns``, ``partition_by``); what it
leaves unset is the sink's (and the source's). A table's settings are those of the first
rule whose ``table`` can make its name (``Routes.rule_of``): the writer decoding a record and
the committer opening the table after a restart - which knows the name only - decide the
same way. ``SinkPipelineConfig.route_formats`` turns them into each table's
``RecordFormat``, checked before any actor starts.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from rayconnect.errors import ConfigError, require
from rayconnect.formats.route_split import Routed
from rayconnect.formats.settings import (
    Envelope,
    RecordFormat,
    TruncateMode,
    ValueFormat,
    WriteMode,
)
from rayconnect.protocol.upkeep import CompactSettings, LogSettings

#: What a record that no rule matches does: ``dead_letter`` (kept, with the reason, in the
#: sink's own table) or ``stop`` (its partition stops, as a bad record with ``errors: stop``).
Unrouted = Literal["dead_letter", "stop"]

#: A table name a route may make: letters, digits and ``_``, not starting with ``_`` (the
#: pipeline's own folders and tables do) - safe as a folder and as an Iceberg identifier.
TABLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,127}")
#: names a route may not make: folders the sink itself uses beside the route tables
RESERVED_NAMES = frozenset({"staging"})

_FORMATTER = string.Formatter()


def bad_table_name(name: str) -> str | None:
    """Why ``name`` cannot be a route's table (None: it can)."""
    if not TABLE_NAME.fullmatch(name):
        return (
            f"table name {name!r} is not letters, digits and '_' (not starting with '_', "
            "at most 128)"
        )
    if name in RESERVED_NAMES:
        return f"table name {name!r} is reserved"
    return None


class Route(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One rule: which records (exactly one of ``topic``, ``topic_pattern``, ``field``) go
    to which table (``table``: a name, or a template of the match)."""

    #: the table's name, or a template: ``{1}``, ``{2}``... the groups of ``topic_pattern``,
    #: ``{topic}`` the record's topic, ``{value}`` the value of ``field``
    table: str
    #: records of this topic (exactly this name)
    topic: str | None = None
    #: records of the topics this regular expression matches in full; new topics that match
    #: (the metadata's discovery) flow without a restart
    topic_pattern: str | None = None
    #: a field of the record's JSON value, dotted for nested ones (``source.table`` of a
    #: Debezium event; looked up under ``payload`` too); records without it do not match
    field: str | None = None
    #: this rule's tables' value format (``json``, ``string``, ``avro``...); unset: the
    #: source's. A format other than the source's does not take the source's
    #: ``value_schema``/``infer_other_fields``/``value_avro_schema``
    value_format: ValueFormat | None = None
    #: json: this rule's tables' declared columns (as ``source.value_schema``); unset: the
    #: source's
    value_schema: dict[str, Any] | None = None
    #: with ``value_schema``: infer the other fields too (as ``source.infer_other_fields``)
    infer_other_fields: bool | None = None
    #: ``debezium`` or ``none`` (as ``source.envelope``); unset: the source's
    envelope: Envelope | None = None
    #: the record key's fields of this rule's tables (json keys: as ``source.key_schema``,
    #: ``_kafka_key`` a struct of them); unset: the source's
    key_schema: dict[str, Any] | None = None
    #: ``append`` or ``upsert`` (as ``sink.write_mode``); unset: the sink's
    write_mode: WriteMode | None = None
    #: upsert: the key's columns (as ``sink.key_columns``); unset: the sink's if the rule
    #: keeps the sink's write mode, else the record key's fields (``key_schema``)
    key_columns: tuple[str, ...] | None = None
    #: this rule's tables' partition columns (as ``sink.partition_by``; ``[]``: none);
    #: unset: the sink's
    partition_by: tuple[str, ...] | None = None
    #: Delta: when and how this rule's tables are compacted (as ``sink.compact``); unset:
    #: the sink's. Each table has its own schedule either way (``protocol.upkeep.RouteUpkeep``)
    compact: CompactSettings | None = None
    #: Delta: this rule's tables' checkpoints, log retention and tidy interval (as
    #: ``sink.log``); unset: the sink's
    log: LogSettings | None = None
    #: upsert: a truncate event ``apply`` or ``dead_letter`` (as ``sink.truncate``); unset:
    #: the sink's
    truncate: TruncateMode | None = None

    def __post_init__(self) -> None:
        kinds = [k for k in ("topic", "topic_pattern", "field") if getattr(self, k) is not None]
        require(
            len(kinds) == 1,
            f"routes: a rule has exactly one of topic, topic_pattern, field (got {kinds or 'none'})",
        )
        groups = 0
        if self.topic_pattern is not None:
            try:
                groups = re.compile(self.topic_pattern).groups
            except re.error as e:
                raise ConfigError(f"routes: topic_pattern {self.topic_pattern!r}: {e}") from None
        require(
            self.field is None or all(self.field.split(".")),
            f"routes: field {self.field!r} has an empty part",
        )
        allowed = {str(i) for i in range(1, groups + 1)} | {"topic"}
        if self.field is not None:
            allowed = {"value", "topic"}
        try:
            names = [n for _, n, _, _ in _FORMATTER.parse(self.table) if n is not None]
        except ValueError as e:
            raise ConfigError(f"routes: table template {self.table!r}: {e}") from None
        unknown = [n for n in names if n not in allowed]
        require(
            not unknown,
            f"routes: table template {self.table!r} uses {unknown}; this rule has "
            f"{sorted(allowed)}",
        )
        if not names:
            problem = bad_table_name(self.table)
            require(problem is None, f"routes: {problem}")
        require(
            self.key_schema is None or bool(self.key_schema),
            f"routes: rule {self.table!r}: key_schema is empty",
        )

    def settings(self) -> dict[str, Any]:
        """The table settings this rule sets (the rest are the sink's)."""
        return {name: v for name in ROUTE_SETTINGS if (v := getattr(self, name)) is not None}

    def makes(self, name: str) -> bool:
        """Whether this rule's ``table`` can make the table name ``name``."""
        return _template_pattern(self.table, self.topic).fullmatch(name) is not None

    def record_format(self, source: RecordFormat) -> RecordFormat:
        """``source`` (the source's decoding) with this rule's decoding settings (checked:
        ``ConfigError``). A value format other than the source's starts its value settings
        afresh; a ``key_schema`` makes the key json and includes it."""
        changes: dict[str, Any] = {}
        if self.value_format is not None and self.value_format != source.value_format:
            changes.update(
                value_format=self.value_format,
                value_schema=None,
                infer_other_fields=False,
                avro_schema=None,
            )
        for name in ("value_schema", "infer_other_fields", "envelope"):
            if (value := getattr(self, name)) is not None:
                changes[name] = value
        if self.key_schema is not None:
            changes.update(key_format="json", key_schema=self.key_schema, include_key=True)
        return msgspec.structs.replace(source, **changes) if changes else source

    def table_for(self, topic: str, value: str | None = None) -> str | None:
        """The table of a record of ``topic`` (``value``: its ``field``'s value as text,
        None if absent), or None if this rule does not take it. The name is not checked
        here (``bad_table_name``)."""
        if self.topic is not None:
            return self.table.format(topic=topic) if topic == self.topic else None
        if self.topic_pattern is not None:
            match = re.fullmatch(self.topic_pattern, topic)
            if match is None:
                return None
            return self.table.format(match.group(0), *match.groups(""), topic=topic)
        if value is None:
            return None
        return self.table.format(value=value, topic=topic)


#: the settings a rule may give its tables (``Route.settings``)
ROUTE_SETTINGS = (
    "value_format",
    "value_schema",
    "infer_other_fields",
    "envelope",
    "key_schema",
    "write_mode",
    "key_columns",
    "partition_by",
    "truncate",
)


@functools.lru_cache(maxsize=256)
def _template_pattern(template: str, topic: str | None) -> re.Pattern[str]:
    """The names a table template can make: its text, any text for each ``{...}`` (the
    topic itself for a ``topic`` rule's ``{topic}``)."""
    parts = []
    for literal, name, _, _ in _FORMATTER.parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(re.escape(topic) if name == "topic" and topic is not None else ".*")
    return re.compile("".join(parts))


class Routes(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a sink's records go: to the table of the first rule that takes them."""

    #: the rules, tried in order; the first that takes a record decides its table
    rules: tuple[Route, ...]
    #: a record no rule takes (or whose rule makes a bad table name): ``dead_letter`` - kept
    #: with the reason in the sink's own table - or ``stop`` its partition
    unrouted: Unrouted = "dead_letter"
    #: an upsert table whose rule gives no key (``key_schema``, ``key_columns``) is keyed by
    #: the key the producer of its topic published (``rayconnect.route_keys``: the Postgres
    #: source's ``route_keys_for``), when there is one
    published_keys: bool = False

    def __post_init__(self) -> None:
        require(bool(self.rules), "routes.rules is empty: give at least one rule")

    @property
    def fields(self) -> tuple[str, ...]:
        """The value fields the rules read (each once, in rule order)."""
        return tuple(dict.fromkeys(r.field for r in self.rules if r.field is not None))

    def rule_of(self, name: str) -> int | None:
        """The rule whose settings table ``name`` has: the first that can make the name
        (None: no rule can - a table of rules since changed has the sink's settings)."""
        return next((i for i, rule in enumerate(self.rules) if rule.makes(name)), None)

    def route(self, topic: str, values: Mapping[str, str | None] | None = None) -> Routed:
        """The table of a record of ``topic`` whose ``fields`` have ``values``, or why it
        has none - also when the table's settings are an earlier rule's, which can make
        the same name with other settings (``rule_of``)."""
        for at, rule in enumerate(self.rules):
            value = (values or {}).get(rule.field) if rule.field is not None else None
            name = rule.table_for(topic, value)
            if name is None:
                continue
            problem = bad_table_name(name)
            if problem is not None:
                return Routed(None, f"route {rule.table!r}: {problem}")
            owner = self.rule_of(name) if at else 0
            if owner is not None and owner != at:
                other = self.rules[owner]
                if other.settings() != rule.settings():
                    return Routed(
                        None,
                        f"route {rule.table!r} makes table {name!r}, which the earlier route "
                        f"{other.table!r} can make too, with other settings",
                    )
            return Routed(name)
        return Routed(None, f"no route takes topic {topic!r}" + _described(values))


class RouteFormats(msgspec.Struct, frozen=True):
    """Each route table's ``RecordFormat``: its rule's (``Routes.rule_of``), else the
    sink's. Built and checked once (``SinkPipelineConfig.route_formats``); the writer, its
    Spark tasks and the committers call it with a table's name."""

    routes: Routes
    #: the sink's own format (a table no rule can make, the unrouted records)
    default: RecordFormat
    #: each rule's tables' format, in rule order
    by_rule: tuple[RecordFormat, ...]
    #: ``routes.published_keys``: table -> the key published for its topic (columns and
    #: type names), for upsert tables whose rule gives no key (``with_published``)
    keys: dict[str, dict[str, str]] = {}

    def __call__(self, name: str) -> RecordFormat:
        rule = self.routes.rule_of(name)
        fmt = self.default if rule is None else self.by_rule[rule]
        key = self.keys.get(name)
        if key is None:
            return fmt
        return msgspec.structs.replace(
            fmt, key_format="json", key_schema=key, include_key=True, upsert_keys=tuple(key)
        )

    def with_published(self, topic_keys: Mapping[str, dict[str, str]]) -> RouteFormats:
        """These formats with the keys published for topics (``rayconnect.route_keys``):
        each topic's table, if its rule gives no key of its own (``key_schema``,
        ``key_columns``) and it is an upsert table,
        is keyed by its topic's key (unchanged without ``routes.published_keys``)."""
        if not self.routes.published_keys:
            return self
        keys = dict(self.keys)
        for topic, key in topic_keys.items():
            name = self.routes.route(topic).table
            if name is None:
                continue
            rule = self.routes.rule_of(name)
            own = self.routes.rules[rule] if rule is not None else None
            if own is not None and (own.key_schema or own.key_columns) is not None:
                continue
            if (self.default if rule is None else self.by_rule[rule]).upsert_keys:
                keys[name] = dict(key)
        return self if keys == self.keys else msgspec.structs.replace(self, keys=keys)

    @property
    def typed(self) -> bool:
        """Whether any table's rows are decoded (its schema steers the decoding)."""
        return self.default.typed or any(f.typed for f in self.by_rule)


def _described(values: Mapping[str, str | None] | None) -> str:
    if not values:
        return ""
    return " with " + ", ".join(f"{k}={v!r}" for k, v in values.items())
