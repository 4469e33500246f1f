"""Delta table upkeep against real delta-rs tables (no Ray, no Spark): compaction racing a
round's commit in both orders, other writers' OPTIMIZE / DELETE / VACUUM / append between and
inside rounds, breaking changes that must stop the pipeline, checkpoints and log cleanup that
recovery reads through. Interleavings are forced at the exact point (after the round's
compare step, or with a compaction planned on a snapshot older than the round's commit)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.exceptions import CommitFailedError
from table_files import K0, K1, PIPELINE, records, stage

from rayconnect.protocol.upkeep import CompactSettings, LogSettings
from rayconnect.tables.base import OffsetMismatchError, TableBrokenError
from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.delta_upkeep import (
    CHECKPOINT_INTERVAL,
    LOG_RETENTION,
    TOMBSTONE_RETENTION,
    DeltaUpkeep,
)

pytestmark = [pytest.mark.timeout(60)]


class Rounds:
    """A pipeline's rounds on one table: each commits one file per partition, exactly the
    records after the partition's last committed offset, with the epoch fence."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.committer = DeltaCommitter(str(table), PIPELINE)
        self.committer.ensure_table()
        self.epoch = self.committer.claim_epoch()
        self.next: dict[str, int] = {}

    def commit(self, n: int = 5, keys: tuple[str, ...] = (K0, K1)) -> int:
        files = [stage(self.table, records(k, self.next.get(k, 0), n)) for k in keys]
        expected = {k: self.next.get(k) for k in keys}
        offsets = {k: self.next.get(k, 0) + n for k in keys}
        version = self.committer.commit(files, offsets, expected, epoch=self.epoch)
        self.next.update(offsets)
        return version


def upkeep(table: Path, **compact: object) -> DeltaUpkeep:
    settings = CompactSettings(**{"min_files": 2, "every_s": 0, **compact})  # type: ignore[arg-type]
    return DeltaUpkeep(str(table), PIPELINE, settings, LogSettings(checkpoint_interval=10), 24)


def rows(table: Path) -> list[tuple[str, int, int]]:
    t = DeltaTable(str(table)).to_pyarrow_table(columns=["topic", "partition", "offset"])
    return sorted(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))


def produced(
    next_offsets: dict[str, int], minus: frozenset[tuple[str, int, int]] | set = frozenset()
) -> list[tuple[str, int, int]]:
    """Every record the rounds committed (exactly once), as (topic, partition, offset)."""
    out = []
    for key, end in next_offsets.items():
        _, topic, part = key.rsplit("/", 2)
        out += [(topic, int(part), o) for o in range(end)]
    return sorted(r for r in out if r not in minus)


def live_files(table: Path) -> int:
    return len(DeltaTable(str(table)).file_uris())


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "table"


# -- compaction racing a round --------------------------------------------------------------


def test_compaction_planned_before_a_round_commits_after_it(table: Path) -> None:
    """Compaction reads the table, a round commits, then the compaction commits: both land;
    the round's file is left alone and counted once."""
    rounds = Rounds(table)
    for _ in range(4):
        rounds.commit()
    keeper = upkeep(table)
    snapshot = DeltaTable(str(table))  # the compaction's plan is made on this version
    round_version = rounds.commit()
    metrics = keeper._compact_once(snapshot)
    assert metrics["numFilesRemoved"] == 8 and metrics["numFilesAdded"] == 1
    dt = DeltaTable(str(table))
    assert dt.version() == round_version + 1
    assert live_files(table) == 1 + 2  # the compacted file + the round's two
    assert rows(table) == produced(rounds.next)
    assert rounds.committer.committed_offsets() == {K0: 25, K1: 25}
    rounds.commit()  # and the pipeline goes on
    assert rows(table) == produced(rounds.next)


def test_round_that_read_before_a_compaction_commits_once_after_it(table: Path) -> None:
    """A round passes its compare step, a compaction commits, the round commits: exactly
    once (the compare looks at txn versions, which a compaction does not touch)."""
    rounds = Rounds(table)
    for _ in range(4):
        rounds.commit()
    keeper = upkeep(table)
    original = rounds.committer._check_fence
    compacted: list[dict] = []

    def check_then_compact(*args, **kwargs):
        original(*args, **kwargs)
        if not compacted:
            compacted.append(keeper.compact())

    rounds.committer._check_fence = check_then_compact  # type: ignore[method-assign]
    version = rounds.commit()
    assert compacted[0]["numFilesRemoved"] == 8
    history = DeltaTable(str(table)).history(2)
    assert [h["operation"] for h in history] == ["WRITE", "OPTIMIZE"]
    assert history[0]["version"] == version
    assert rows(table) == produced(rounds.next)
    assert rounds.committer.committed_offsets() == {K0: 25, K1: 25}
    assert live_files(table) == 3


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours-first", "users-first"])
def test_a_users_optimize_racing_our_compaction_leaves_no_duplicate(
    table: Path, ours_first: bool
) -> None:
    """Two compactions planned on one snapshot both commit (delta-rs 1.6.6 does not detect
    it: every compacted row is then in the table twice - asserted first, so this test says
    when delta-rs starts detecting it). Upkeep finds the doubly removed files in the log
    and rewrites their rows once: exactly the committed records, offsets untouched, and the
    pipeline commits on."""
    rounds = Rounds(table)
    for _ in range(4):
        rounds.commit()
    keeper = upkeep(table)
    keeper.races.check(DeltaTable(str(table)))  # upkeep has been running: log read so far
    ours, users = DeltaTable(str(table)), DeltaTable(str(table))  # both plan on one version
    if ours_first:
        keeper._compact_once(ours)
        users.optimize.compact()
    else:
        users.optimize.compact()
        keeper._compact_once(ours)
    assert len(rows(table)) == 2 * len(produced(rounds.next)), "delta-rs detects it now?"
    done = keeper.tidy()
    assert done["races"]["races"] == 1 and done["races"]["rows_rewritten"] == 40
    assert rows(table) == produced(rounds.next)
    assert rounds.committer.committed_offsets() == {K0: 20, K1: 20}
    assert keeper.tidy()["races"]["races"] == 0  # found once
    rounds.commit()
    assert rows(table) == produced(rounds.next)


def test_compaction_that_loses_to_a_delete_retries_then_gives_up(table: Path) -> None:
    rounds = Rounds(table)
    for _ in range(3):
        rounds.commit()
    keeper = upkeep(table, retries=1)
    stale = DeltaTable(str(table))
    DeltaTable(str(table)).delete("`offset` < 2")  # another writer's GDPR delete
    with pytest.raises(CommitFailedError):
        keeper._compact_once(stale)  # planned before the delete: rejected, not applied
    calls = []
    fresh_table = keeper._table

    def stale_first():
        calls.append(1)
        return stale if len(calls) == 1 else fresh_table()

    keeper._table = stale_first  # type: ignore[method-assign]
    assert keeper.compact()["numFilesRemoved"] > 0  # second attempt on a fresh snapshot
    deleted = {(t, p, o) for t in ["orders"] for p in (0, 1) for o in (0, 1)}
    assert rows(table) == produced(rounds.next, deleted)
    keeper._table = lambda: stale  # type: ignore[method-assign]
    with pytest.raises(CommitFailedError):
        keeper.compact()  # both attempts stale: gives up, raising


def test_zorder_compaction_keeps_every_row(table: Path) -> None:
    rounds = Rounds(table)
    for _ in range(3):
        rounds.commit()
    upkeep(table, zorder_by=("partition", "offset")).compact()
    assert live_files(table) == 1
    assert rows(table) == produced(rounds.next)


# -- other writers ----------------------------------------------------------------------------


def test_other_writers_between_and_inside_rounds(table: Path) -> None:
    """A user's OPTIMIZE, DELETE WHERE, VACUUM and another job's append, between rounds and
    inside a round's commit (after its compare step): every round commits exactly once."""
    rounds = Rounds(table)
    rounds.commit()
    user = DeltaTable(str(table))
    user.optimize.compact()
    rounds.commit()
    DeltaTable(str(table)).delete("`partition` = 1 AND `offset` < 3")
    rounds.commit()
    other = records("c9/other/0", 0, 4)
    write_deltalake(str(table), other, mode="append")  # a compatible append by another job
    rounds.commit()
    DeltaTable(str(table)).vacuum(retention_hours=0, enforce_retention_duration=False)

    original = rounds.committer._check_fence
    inside = iter(
        [
            lambda: DeltaTable(str(table)).delete(
                "topic = 'orders' AND `partition` = 0 AND `offset` = 0"
            ),
            lambda: DeltaTable(str(table)).optimize.compact(),
            lambda: write_deltalake(str(table), records("c9/other/0", 4, 2), mode="append"),
        ]
    )

    def check_then_other_writer(*args, **kwargs):
        original(*args, **kwargs)
        action = next(inside, None)
        if action is not None:
            action()

    rounds.committer._check_fence = check_then_other_writer  # type: ignore[method-assign]
    for _ in range(4):  # a DELETE inside the commit makes delta-rs refuse it: retried
        rounds.commit()
    deleted = {("orders", 1, o) for o in range(3)} | {("orders", 0, 0)}
    ours = [r for r in rows(table) if r[0] == "orders"]
    assert ours == produced(rounds.next, deleted)
    assert [r for r in rows(table) if r[0] == "other"] == [("other", 0, o) for o in range(6)]
    assert rounds.committer.committed_offsets() == {K0: 40, K1: 40}


def test_rival_round_inside_a_commit_is_still_a_conflict(table: Path) -> None:
    """The retry after a conflict never hides a rival with our app ids: that stays a
    conflict (nothing committed), not a second try on top of the rival's offsets."""
    rounds = Rounds(table)
    rounds.commit()
    rival = DeltaCommitter(str(table), PIPELINE)
    original = rounds.committer._check_fence

    def check_then_rival(*args, **kwargs):
        original(*args, **kwargs)
        rival.commit([stage(table, records(K0, 5, 1))], {K0: 6}, {K0: 5})

    rounds.committer._check_fence = check_then_rival  # type: ignore[method-assign]
    with pytest.raises(Exception, match="nothing committed|expected 5"):
        rounds.commit(keys=(K0,))
    assert rival.committed_offsets([K0]) == {K0: 6}
    assert [r for r in rows(table) if r[1] == 0] == [("orders", 0, o) for o in range(6)]


def test_dropped_table_stops_the_pipeline(table: Path) -> None:
    rounds = Rounds(table)
    rounds.commit()
    for name in os.listdir(table / "_delta_log"):
        os.remove(table / "_delta_log" / name)
    with pytest.raises(TableBrokenError, match="is gone"):
        rounds.commit()
    assert not os.listdir(table / "_delta_log")  # nothing written into the dropped table


def test_incompatible_schema_change_stops_the_pipeline(table: Path) -> None:
    rounds = Rounds(table)
    rounds.commit()
    DeltaTable(str(table)).alter.add_columns(Field("tenant", "string", nullable=True))
    version = DeltaTable(str(table)).version()
    with pytest.raises(TableBrokenError, match="changed its schema.*tenant"):
        rounds.commit()
    assert DeltaTable(str(table)).version() == version


def test_offsets_moved_back_by_hand_is_a_mismatch_then_broken(table: Path) -> None:
    """Someone commits a lower txn version for our app id: the round's compare step fails
    (nothing committed), and the reload's check names the cause."""
    from deltalake.transaction import CommitProperties, Transaction

    from rayconnect.tables.base import check_not_behind

    rounds = Rounds(table)
    rounds.commit()
    rounds.commit()
    dt = DeltaTable(str(table))
    dt.create_write_transaction(
        [],
        "append",
        pa.schema(dt.schema().to_arrow()),
        commit_properties=CommitProperties(app_transactions=[Transaction(f"{PIPELINE}/{K0}", 3)]),
    )
    with pytest.raises(OffsetMismatchError, match="expected 10, table has 3"):
        rounds.commit()
    with pytest.raises(TableBrokenError, match="moved backwards.*was 10, now 3"):
        check_not_behind(rounds.next, rounds.committer.committed_offsets())


# -- log health ---------------------------------------------------------------------------------


def test_table_properties_checkpoints_and_log_cleanup(table: Path) -> None:
    """Properties land in the table; delta-rs then checkpoints every N versions by itself;
    tidy makes up a missing checkpoint, drops expired log entries, and recovery (a new
    committer reading every partition's offset) reads through the checkpoint alone."""
    rounds = Rounds(table)
    keeper = DeltaUpkeep(
        str(table),
        PIPELINE,
        CompactSettings(min_files=2),
        LogSettings(checkpoint_interval=10, log_retention_hours=1 / 3600, tidy_every_s=0.5),
        vacuum_retention_hours=24,
    )
    assert keeper.configure_table() == {
        CHECKPOINT_INTERVAL: "10",
        LOG_RETENTION: "interval 1 seconds",
        TOMBSTONE_RETENTION: "interval 86400 seconds",
    }
    assert keeper.configure_table() == {}  # once
    for _ in range(25):
        rounds.commit(n=2)
    assert rounds.committer.log.checkpoint_versions()[-2:] == [9, 19]
    time.sleep(1.1)
    done = keeper.tidy()
    assert not done["checkpoint_created"]
    # entries before the last checkpoint, older than retention, are gone (delta-rs may have
    # removed some itself when it wrote checkpoint 19, on a slow machine)
    names = rounds.committer.log.names()
    assert [n for n in names if n.endswith(".json") and int(n[:20]) < 19] == []
    fresh = DeltaCommitter(str(table), PIPELINE)
    assert fresh.committed_offsets() == {K0: 50, K1: 50}
    assert fresh.epoch() == 1
    assert rows(table) == produced(rounds.next)


def test_tidy_makes_up_a_missing_checkpoint_and_vacuums_compacted_files(table: Path) -> None:
    rounds = Rounds(table)
    DeltaTable(str(table)).alter.set_table_properties({CHECKPOINT_INTERVAL: "1000"})
    for _ in range(12):
        rounds.commit(n=1)
    keeper = DeltaUpkeep(
        str(table),
        PIPELINE,
        CompactSettings(min_files=2),
        LogSettings(checkpoint_interval=5),
        vacuum_retention_hours=0,
    )
    assert keeper.last_checkpoint() is None
    keeper.compact()
    data_files = lambda: {p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}  # noqa: E731
    assert len(data_files()) == 24 + 1
    version = DeltaTable(str(table)).version()
    time.sleep(1)
    done = keeper.tidy()
    assert done["checkpoint_created"]
    assert keeper.last_checkpoint() == version  # (vacuum then logs a start and an end)
    assert done["files_vacuumed"] == 24  # the compacted-away files
    assert len(data_files()) == live_files(table) == 1
    assert rows(table) == produced(rounds.next)
