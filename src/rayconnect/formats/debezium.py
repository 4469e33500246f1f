"""``envelope: debezium``: change events (``op`` c/r/u/d with ``before``/``after``) as rows.

A Debezium change event wraps the row: the row to write is ``after`` (create, read from a
snapshot, update) and the key to delete is in ``before`` (delete). Unwrapping happens on the
raw values, before the value format decodes them, so the row is decoded exactly like a plain
record's value (typed tables, schema evolution, dead letters all unchanged) and the envelope
adds one column: whether the change deletes its key. Events with the JSON converter's
``{"schema": ..., "payload": ...}`` wrapper are accepted as well as bare payloads.

A null value after a delete is Debezium's tombstone, for log compaction: the delete before
it already removed the key, so it is skipped (not a dead letter). A truncate (``t``) empties
the table (``truncate: apply``, the default: ``write_modes.fold`` orders it against the
round's changes) or, with ``truncate: dead_letter``, is a dead letter like a message (``m``)
event, which changes no row by key. To order a truncate against the changes of other
partitions, each event's ``source.lsn`` (Postgres's position; null where the event has none)
is kept beside its row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pyarrow as pa


class _Source(msgspec.Struct):
    lsn: int | None = None


class _Event(msgspec.Struct):
    op: str | None = None
    source: _Source | None = None
    # Raw: the row's bytes are passed on as they are, for the value format to decode;
    # absent is an empty Raw, JSON null is Raw(b"null")
    before: msgspec.Raw = msgspec.Raw()
    after: msgspec.Raw = msgspec.Raw()
    payload: msgspec.Raw = msgspec.Raw()


_decode_event = msgspec.json.Decoder(_Event).decode
_ROW_OPS = frozenset({"c", "r", "u"})
_NULL = b"null"


@dataclass(frozen=True)
class Unwrapped:
    """One entry per input value: ``rows`` the row's JSON (null where skipped or bad),
    ``delete`` whether the change removes its key; ``truncate`` the truncates (no row);
    ``lsn`` each event's ``source.lsn`` (null: none); ``skipped`` tombstones; ``bad`` why."""

    rows: pa.Array
    delete: pa.Array
    lsn: pa.Array
    truncate: frozenset[int] = frozenset()
    skipped: frozenset[int] = frozenset()
    bad: dict[int, str] = field(default_factory=dict)


def unwrap(values: pa.Array, apply_truncate: bool = True) -> Unwrapped:
    """The rows inside a block of Debezium change events (binary values, nulls allowed);
    truncates are ``truncate`` with ``apply_truncate``, else bad."""
    rows: list[bytes | None] = []
    delete: list[bool] = []
    lsn: list[int | None] = []
    truncate: set[int] = set()
    skipped: set[int] = set()
    bad: dict[int, str] = {}
    for i, value in enumerate(values.to_pylist()):
        row, deletes, problem, position = None, False, None, None
        if value is None:
            skipped.add(i)
        else:
            try:
                event = _event_of(value)
                position = event.source.lsn if event.source is not None else None
                if event.op == "t" and apply_truncate:
                    truncate.add(i)
                else:
                    row, deletes = _row_of(event)
            except (msgspec.DecodeError, _BadEvent) as e:
                problem = f"debezium envelope: {e}"
        if problem is not None:
            bad[i] = problem
        rows.append(row)
        delete.append(deletes)
        lsn.append(position)
    return Unwrapped(
        pa.array(rows, pa.binary()),
        pa.array(delete, pa.bool_()),
        pa.array(lsn, pa.int64()),
        frozenset(truncate),
        frozenset(skipped),
        bad,
    )


class _BadEvent(ValueError):
    pass


def _event_of(value: bytes) -> _Event:
    """The event, out of the JSON converter's ``payload`` wrapper if it has one."""
    event = _decode_event(value)
    if event.op is None and len(event.payload) and bytes(event.payload).strip() != _NULL:
        event = _decode_event(bytes(event.payload))
    return event


def _row_of(event: _Event) -> tuple[bytes, bool]:
    if event.op in _ROW_OPS:
        return _present(event.after, "after", event.op), False
    if event.op == "d":
        return _present(event.before, "before", event.op), True
    if event.op in ("t", "m"):
        raise _BadEvent(
            f"op {event.op!r} (truncate/message) changes no row by key"
            + (" (truncate: dead_letter)" if event.op == "t" else "")
        )
    raise _BadEvent(f"op must be one of c, r, u, d, not {event.op!r}")


def _present(part: msgspec.Raw, name: str, op: str) -> bytes:
    if not len(part) or bytes(part).strip() == _NULL:
        raise _BadEvent(f"op {op!r} without {name!r}")
    return bytes(part)
