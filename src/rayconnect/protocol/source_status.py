"""``SourcePipelineStatus``: what a source pipeline reports about itself, as typed Structs
(as ``PipelineStatus`` is a sink's).

Each task actor reports a ``SourceTaskReport`` (its machine's counts, what the task knows of
its source - ``lag``, ``source`` - and the actor's restarts and process);
``SourcePipelineHandle.status()`` gathers them, with a report of state ``unavailable`` for a
task that did not answer (restarting), and the totals. Counts are the task's incarnation's:
a task Ray restarted counts from zero again.

Fields read by name too (``status["tasks"][0]["lag"]["bytes"]``), as the dicts this
replaced did: a field that is None reads as absent there (``get`` gives the default, ``in``
is False), as the dicts left such keys out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from rayconnect.protocol.status import ActorStatus
from rayconnect.protocol.status import ByName as _ByName


class ByName(_ByName):
    """Read by name as the dicts these replaced, which left out what was not known: a field
    that is None reads as absent (``get`` gives the default, ``in`` is False)."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:
        value = super().get(name)
        return default if value is None else value

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) and getattr(self, str(name)) is not None


class SourceLag(ByName, msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How far behind its source a task's committed records are (status and metrics:
    ``rayconnect_source_lag_bytes`` / ``_s``). 0 when caught up; None: not known."""

    #: bytes of the source not in Kafka yet (Postgres: WAL between the slot's confirmed
    #: position - what is in Kafka - and the server's)
    bytes: int | None = None
    #: how old the oldest data not in Kafka yet is, in seconds (Postgres: since the commit
    #: of the last transaction read, while bytes > 0)
    seconds: float | None = None


class PastError(msgspec.Struct, frozen=True, kw_only=True):
    """An error that ended one of a task's incarnations (Ray restarted the task after it),
    and when: kept after the task recovered, so status can say what happened without
    saying it is still happening."""

    error: str
    #: when the incarnation failed (seconds since the epoch)
    at: float


#: how many of a task's past errors status keeps (the newest)
ERROR_HISTORY = 5


def with_error(history: Sequence[PastError], error: PastError) -> tuple[PastError, ...]:
    """``history`` with ``error`` added, the newest ``ERROR_HISTORY`` kept."""
    return (*history, error)[-ERROR_HISTORY:]


def current_error(own: str | None, history: Sequence[PastError], started: bool) -> str | None:
    """The task's error now: its incarnation's own; else, until this incarnation has started
    (reached its source and target), the error that ended the one before - most likely what
    it is still up against. Once it started, None: a recovered task's errors are history
    (``SourceTaskReport.errors``), not its state."""
    if own is not None:
        return own
    if started or not history:
        return None
    return history[-1].error


class SourceTaskReport(ByName, msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One task, as its actor reports it (counts: None when it did not answer). Its JSON
    leaves out what is not known, as the dict it replaced did."""

    #: the task's index (``<pipeline>/task/<index>``)
    task: int
    #: the task machine's state (``polling``, ``committing``...), or ``unavailable``
    state: str
    transactions_committed: int | None = None
    transactions_aborted: int | None = None
    records_polled: int | None = None
    records_sent: int | None = None
    records_committed: int | None = None
    #: records sent to the dead-letter topic
    dead_letters: int | None = None
    polls: int | None = None
    #: source partition -> the source offset committed with the last transaction
    committed_offsets: dict[str, Any] = {}
    #: what is wrong now (None once the task is healthy again: see ``errors``)
    last_error: str | None = None
    #: the errors that ended earlier incarnations, oldest first (the last few), with their
    #: time: kept after the task recovered
    errors: tuple[PastError, ...] = ()
    #: why a record could not be written and had nowhere to go (the task stopped for good)
    bad_record: str | None = None
    #: the producer's transactional id (None: at-least-once)
    transactional_id: str | None = None
    exactly_once: bool | None = None
    #: why exactly once is off (``exactly_once="requested"`` on a target without it)
    warning: str | None = None
    #: what the task knows of its source (e.g. the replication slot's LSNs)
    source: dict[str, Any] | None = None
    #: how far behind its source the committed records are
    lag: SourceLag | None = None
    #: how often Ray restarted the task's actor
    restarts: int | None = None
    #: why the task gave up (an outage longer than ``give_up_after_s``)
    gave_up: str | None = None
    #: the actor's process
    pid: int | None = None
    #: why the task did not answer (state ``unavailable``)
    error: str | None = None


class SourcePipelineStatus(ByName, msgspec.Struct, frozen=True, kw_only=True):
    """A source pipeline's status: its tasks' reports and their totals."""

    #: ``source`` (a sink pipeline's status is a ``PipelineStatus``)
    kind: str = "source"
    pipeline: str
    #: task index -> its report
    tasks: dict[int, SourceTaskReport] = {}
    #: totals over the tasks that answered (each since its incarnation's start)
    records_committed: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    warnings: tuple[str, ...] = ()
    #: the actors' processes (``rayconnect status`` asks for them)
    actors: tuple[ActorStatus, ...] | None = None


def summed(pipeline: str, tasks: dict[int, SourceTaskReport]) -> SourcePipelineStatus:
    """The pipeline's status of its tasks' reports."""
    done = [t for t in tasks.values() if t.records_committed is not None]
    return SourcePipelineStatus(
        pipeline=pipeline,
        tasks=tasks,
        records_committed=sum(t.records_committed or 0 for t in done),
        transactions_committed=sum(t.transactions_committed or 0 for t in done),
        transactions_aborted=sum(t.transactions_aborted or 0 for t in done),
        warnings=tuple(sorted({t.warning for t in done if t.warning})),
    )


def encode(status: SourcePipelineStatus) -> bytes:
    return msgspec.json.encode(status, enc_hook=str)


def decode(data: bytes | str) -> SourcePipelineStatus:
    return msgspec.json.decode(data, type=SourcePipelineStatus)
