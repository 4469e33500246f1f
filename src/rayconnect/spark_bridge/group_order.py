"""The order a write takes its groups in: a share's groups side by side
(``in_write_order``), and a transform's groups in layers of distinct partitions
(``distinct_key_layers``)."""

from __future__ import annotations

from collections.abc import Sequence

from rayconnect.spark_bridge.blocks import Block


def in_write_order(
    groups: Sequence[Sequence[Block]],
    keys: Sequence[str | None] | None,
    shares: Sequence[str | None] | None,
) -> tuple[list[tuple[int, Sequence[Block]]], list[str | None] | None]:
    """The non-empty groups, a share's groups next to each other (a task keeps one file
    open per share), and each group's share token (None: files of its own)."""
    non_empty = [(i, refs) for i, refs in enumerate(groups) if refs]
    if shares is None or keys is None:
        return non_empty, None
    share_of = [s if keys[i] is not None else None for i, s in enumerate(shares)]
    non_empty.sort(key=lambda item: (share_of[item[0]] or "", item[0]))
    return non_empty, share_of


def distinct_key_layers(
    groups: Sequence[Sequence[Block]], keys: Sequence[str | None]
) -> list[list[Sequence[Block]]]:
    """The groups split into layers in which no partition has two groups (a transform's
    rows find their group by partition). Nearly always one layer: two flushes of one
    partition in one write happen only when a discarded round's flush meets a newer one."""
    layers: list[list[Sequence[Block]]] = []
    seen: list[set[str | None]] = []
    for i, refs in enumerate(groups):
        if not refs:
            continue
        at = next((n for n, s in enumerate(seen) if keys[i] not in s), len(layers))
        if at == len(layers):
            layers.append([[] for _ in groups])
            seen.append(set())
        layers[at][i] = refs
        seen[at].add(keys[i])
    return layers
