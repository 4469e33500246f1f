"""What moves between a reader, a participant host and the writer.

A reader hands a host ``Piece``s (one per partition of a fetch); a host hands the writer one
call per gather window carrying a ``FlushPart`` per partition flush, and gets a
``PartWritten`` per part back: one partition's bad flush fails that partition only.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rayconnect.protocol.types import DataFile


class Piece(msgspec.Struct, frozen=True):
    """A batch of one partition's records, ``first`` to ``next_offset`` (exclusive)."""

    key: str
    first: int
    next_offset: int
    records: int
    nbytes: int
    #: where its rows are: a ``blocks.Rows`` handle into the one object the reader put for
    #: this host's pieces of the fetch (nested in the call's list, so Ray passes the ref,
    #: not the data)
    batch: Any
    #: the partition's high watermark is reached with this piece (or only commit markers
    #: lie between them)
    caught_up: bool
    #: the partition's high watermark as the reader saw it (the participant's liveness rule)
    high_watermark: int | None = None
    #: consistent cuts: the piece ends with a cut marker of this LSN (not one of its rows)
    cut_lsn: int | None = None


class FlushPart(msgspec.Struct, frozen=True):
    """One partition's flush in a host's writer call: its buffered batch handles (object
    refs, nested so Ray passes the refs) and how many rows they hold."""

    key: str
    refs: list[Any]
    rows: int


class PartWritten(msgspec.Struct, frozen=True):
    """The writer's answer for one ``FlushPart``: the files holding its rows, or why they
    were not written (then ``files`` is empty)."""

    files: list[DataFile] = []
    error: str | None = None
