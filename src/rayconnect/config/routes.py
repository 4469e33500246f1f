"""Routes: one sink pipeline writing many tables (docs/guides/routes.md).

A record's table is decided by the first rule that matches it: a topic named exactly
(``topic``), a topic matching a regular expression (``topic_pattern``, the table name a
template of its groups), or a field of the record's value (``field``: a Debezium event's
``source.table``, or any column). The name alone is decided here, purely (no IO): where the
table lives follows from the sink (``DeltaSink.route_table``, ``IcebergSink.route_table``).
Records no rule matches are dead letters (with the reason) or stop their partition.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Literal

import msgspec

from rayconnect.errors import ConfigError, require
from rayconnect.formats.route_split import Routed

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


class Routes(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a sink's records go: to the table of the first rule that takes them."""

    #: the rules, tried in order; the first that takes a record decides its table
    rules: tuple[Route, ...]
    #: a record no rule takes (or whose rule makes a bad table name): ``dead_letter`` - kept
    #: with the reason in the sink's own table - or ``stop`` its partition
    unrouted: Unrouted = "dead_letter"

    def __post_init__(self) -> None:
        require(bool(self.rules), "routes.rules is empty: give at least one rule")

    @property
    def fields(self) -> tuple[str, ...]:
        """The value fields the rules read (each once, in rule order)."""
        return tuple(dict.fromkeys(r.field for r in self.rules if r.field is not None))

    def route(self, topic: str, values: Mapping[str, str | None] | None = None) -> Routed:
        """The table of a record of ``topic`` whose ``fields`` have ``values``, or why it
        has none."""
        for rule in self.rules:
            value = (values or {}).get(rule.field) if rule.field is not None else None
            name = rule.table_for(topic, value)
            if name is None:
                continue
            problem = bad_table_name(name)
            if problem is not None:
                return Routed(None, f"route {rule.table!r}: {problem}")
            return Routed(name)
        return Routed(None, f"no route takes topic {topic!r}" + _described(values))


def _described(values: Mapping[str, str | None] | None) -> str:
    if not values:
        return ""
    return " with " + ", ".join(f"{k}={v!r}" for k, v in values.items())
