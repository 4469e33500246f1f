"""How a round's commit that failed or timed out ended, decided from the table read after.

A commit that raises or does not return within ``write_timeout_s`` leaves the coordinator
not knowing whether it landed; it reads the table again (``ReloadTable``) rather than guess.
That read says how the commit ended, and an operator (or a test across a network partition)
needs it said in one line, not pieced together from a traceback and the next round: the
round was committed after all (a timed-out commit that landed), refused because a newer
coordinator claimed the table (a zombie's commit: the epoch fence), or not committed (its
records are read again), and what the coordinator does next. A commit that timed out may
still be running in its thread when the table is read; it is then said to be under way,
and ``late_line`` tells how it ended once its thread returns.

Pure: the actor passes what it knew of the commit and what the table read found.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import msgspec


class CommitEnd(enum.Enum):
    """How a failed or timed-out commit ended, as the table read after it shows."""

    #: every partition the round moved is at the round's offsets: the version landed
    COMMITTED_AFTER_ALL = "committed after all"
    #: a newer epoch holds the table: the commit was refused by the fence (or, if it timed
    #: out, the table's history says whether it landed before the claim)
    REFUSED_AS_FENCED = "refused as fenced"
    #: every partition the round moved is still where the round started
    NOT_COMMITTED = "not committed"
    #: some of the round's partitions moved and some did not (a sink with routes: each
    #: route table commits by itself); those that did not are read again
    PARTLY_COMMITTED = "partly committed"
    #: the commit that timed out is still running in its thread
    STILL_RUNNING = "still under way"


class FailedCommit(msgspec.Struct, frozen=True, kw_only=True):
    """A round's commit that raised or timed out, as the coordinator tried it."""

    epoch: int
    txn_id: int
    #: partition -> the offset the round started from (None: the table had none)
    expected: dict[str, int | None]
    #: partition -> the offset the round would commit
    offsets: dict[str, int]
    #: ``ExceptionType: message`` of what the commit raised, or of the timeout
    error: str
    timed_out: bool = False


class CommitOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How the last commit that failed or timed out ended
    (``PipelineStatus.last_failed_commit``)."""

    #: the coordinator's epoch when it tried the commit
    epoch: int
    #: the round whose commit failed
    txn_id: int
    #: ``committed after all``, ``refused as fenced``, ``not committed``, ``partly
    #: committed`` or ``still under way`` (``CommitEnd``)
    ended: CommitEnd
    #: what the commit raised (``ExceptionType: message``), or its timeout
    error: str
    #: whether the commit did not return within ``write_timeout_s``
    timed_out: bool
    #: the epoch the table holds, as read after the failure
    table_epoch: int
    #: what the coordinator does next
    then: str

    def line(self) -> str:
        """One line for the coordinator's log."""
        how = "timed out" if self.timed_out else "failed"
        return (
            f"txn {self.txn_id} of epoch {self.epoch}: the commit {how} ({self.error}) and was "
            f"{self.ended.value} (table epoch {self.table_epoch}); {self.then}"
        )


def _moved(commit: FailedCommit) -> dict[str, int]:
    """The partitions the round moves: only they tell whether it landed (one that reported
    no records commits its old offset, which the table shows either way)."""
    return {k: v for k, v in commit.offsets.items() if v != commit.expected.get(k)}


def judge(
    commit: FailedCommit,
    table_offsets: Mapping[str, int],
    table_epoch: int,
    still_running: bool = False,
) -> CommitOutcome:
    """How ``commit`` ended, from the table read after it failed: its epoch and offsets.
    ``still_running``: the commit timed out and its thread has not returned yet."""
    moved = _moved(commit)
    landed = [k for k, v in moved.items() if table_offsets.get(k) == v]
    if table_epoch > commit.epoch:
        ended = CommitEnd.REFUSED_AS_FENCED
        then = f"stopping: epoch {commit.epoch} fenced by epoch {table_epoch}"
    elif still_running and len(landed) < len(moved):
        ended = CommitEnd.STILL_RUNNING
        then = (
            "the next round starts from the table's offsets; should the commit land later, "
            "that round's compare-and-set fails and the table is read again"
        )
    elif moved and len(landed) == len(moved):
        ended = CommitEnd.COMMITTED_AFTER_ALL
        then = "its records stay; the next round starts after them"
    elif landed:
        ended = CommitEnd.PARTLY_COMMITTED
        then = "the partitions it did not move read their records again from the table"
    else:
        ended = CommitEnd.NOT_COMMITTED
        then = "its records are read again from the table's offsets"
    return CommitOutcome(
        epoch=commit.epoch,
        txn_id=commit.txn_id,
        ended=ended,
        error=commit.error,
        timed_out=commit.timed_out,
        table_epoch=table_epoch,
        then=then,
    )


def late_line(commit: FailedCommit, seconds: float, version: int | None, error: str | None) -> str:
    """How a commit that timed out ended once its thread returned, ``seconds`` after it
    began: landed as table ``version``, or raised ``error``."""
    head = (
        f"txn {commit.txn_id} of epoch {commit.epoch}: the commit that timed out returned "
        f"after {seconds:.1f} s"
    )
    if version is not None:
        return f"{head}: it landed as version {version}"
    return f"{head}: it raised {error}"
