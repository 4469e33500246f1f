"""Keys of routed tables that appear while a sink runs, as the producer of their records
publishes them.

A routed upsert sink keys each table as its rule says; a rule made for tables not known
when the sink started (a topic pattern) can only give them all one key. The producer often
knows better: rayconnect's Postgres source reads each table's primary key from the catalog.
With ``route_keys_for: SINK`` it publishes the key of every table it captures - before that
table's first record - in Ray's key-value store (the GCS, which every node shares) under
``route-keys/<sink>/<topic>``, and a sink whose routes say ``published_keys: true`` keys a
table whose rule sets no key by the key published for its topic (``RouteFormats.keys``).
Written before the records and read after them, a key is there when the sink meets the
table, in every process of the sink (writer, coordinator: ``tables.route_formats``);
Spark's tasks get it with the formats the writer hands them.
"""

from __future__ import annotations

import msgspec

from rayconnect import ray_internals

NAMESPACE = "rayconnect"

#: a key's columns in key order, each with its lake type name (``formats.types``)
KeySchema = dict[str, str]


def _prefix(sink: str) -> bytes:
    return f"route-keys/{sink}/".encode()


def publish(sink: str, topic: str, key: KeySchema) -> None:
    """``topic``'s records are keyed by ``key`` (blocking: one GCS write)."""
    value = msgspec.json.encode(list(key.items()))
    ray_internals.kv_put(_prefix(sink) + topic.encode(), value, namespace=NAMESPACE)


def published(sink: str) -> dict[str, KeySchema]:
    """Topic -> the key published for it, for ``sink`` (blocking)."""
    prefix = _prefix(sink)
    found: dict[str, KeySchema] = {}
    for name in ray_internals.kv_keys(prefix, namespace=NAMESPACE):
        raw = ray_internals.kv_get(name, namespace=NAMESPACE)
        if raw is None:
            continue
        try:
            pairs = msgspec.json.decode(raw, type=list[tuple[str, str]])
        except msgspec.DecodeError:
            continue
        if pairs:
            found[name[len(prefix) :].decode()] = dict(pairs)
    return found


def forget(sink: str) -> None:
    """Drop what was published for ``sink`` (its mirror deleted for good)."""
    for name in ray_internals.kv_keys(_prefix(sink), namespace=NAMESPACE):
        ray_internals.kv_del(name, namespace=NAMESPACE)
