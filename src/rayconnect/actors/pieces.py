"""What a reader hands a participant host: one piece of one partition's fetch."""

from __future__ import annotations

from typing import Any

import msgspec


class Piece(msgspec.Struct, frozen=True):
    """A batch of one partition's records, ``first`` to ``next_offset`` (exclusive)."""

    key: str
    first: int
    next_offset: int
    records: int
    nbytes: int
    #: the Arrow batch's object ref: nested in the call's list, so Ray passes the ref, not
    #: the batch
    batch: Any
    #: the partition's high watermark is reached with this piece
    caught_up: bool
