"""Which of a reader's splits stand outside their log, pure (the reader actor is its shell).

A split's position past its high watermark reads nothing, for ever, without an error (a
topic re-created, a broker that lost its log: ``protocol.offset_range``). The reader looks
at every resumed split now and then (``check``): a position past the high watermark is
reported only when a second look finds it the same - by then the consumer has fetched at
that position, so the high watermark is fresh, not one from before a seek. A split the
broker refused outright (OFFSET_OUT_OF_RANGE) needs no second look (``refused``). Each
position is reported once, until the report got through (``told``).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec


class PastEnd(msgspec.Struct, frozen=True):
    """Split ``key`` stands at ``position``, past its log's end ``high_watermark``."""

    key: str
    position: int
    high_watermark: int


class RangeWatch:
    """See the module docstring."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}  # split -> the position past the end at the last look
        self._told: dict[str, int] = {}  # split -> the position reported

    def check(self, splits: Iterable[tuple[str, int | None, int | None]]) -> list[PastEnd]:
        """``(key, position, high watermark)`` of every resumed split: those to report."""
        due = []
        for key, position, high_watermark in splits:
            if position is None or high_watermark is None or position <= high_watermark:
                self._seen.pop(key, None)
            elif self._seen.get(key) != position:
                self._seen[key] = position  # looked at again next time
            elif self._told.get(key) != position:
                due.append(PastEnd(key, position, high_watermark))
        return due

    def refused(self, key: str, offset: int) -> bool:
        """The broker refused ``key`` at ``offset``: whether to report it."""
        return self._told.get(key) != offset

    def told(self, key: str, position: int) -> None:
        """The report of ``key`` at ``position`` got through."""
        self._told[key] = position
