"""TxnVersions (tables/delta_txns.py) and DeltaLog (tables/delta_log.py) against real
delta-rs tables: what they read from the log must be what delta-rs answers from the
snapshot, whoever committed, across checkpoints and metadata changes."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.delta_log import DeltaLog
from rayconnect.tables.delta_txns import TxnVersions

pytestmark = pytest.mark.timeout(60)

APPS = [f"pipe/c/t/{i}" for i in range(40)]


def _append(path: str, txns: dict[str, int]) -> None:
    props = CommitProperties(app_transactions=[Transaction(a, v) for a, v in txns.items()])
    write_deltalake(path, pa.table({"a": [1]}), mode="append", commit_properties=props)


def _truth(path: str, apps: list[str]) -> dict[str, int | None]:
    dt = DeltaTable(path)
    return {a: dt.transaction_version(a) for a in apps}


def test_followed_versions_equal_delta_rs_after_other_writers_commits(tmp_path) -> None:
    path = str(tmp_path / "t")
    _append(path, {a: 10 for a in APPS[:20]})
    committer = DeltaCommitter(path, "pipe")
    txns = TxnVersions(committer.log)
    wanted = [*APPS, "pipe/never"]
    assert txns.of(DeltaTable(path).version(), wanted) == _truth(path, wanted)
    # other writers: new app ids, moved ones, a commit without txns
    _append(path, {APPS[3]: 11, APPS[30]: 5})
    write_deltalake(path, pa.table({"a": [2]}), mode="append")
    _append(path, {APPS[3]: 12, "pipe/never": 1})
    assert txns.of(DeltaTable(path).version(), wanted) == _truth(path, wanted)
    assert txns.of(DeltaTable(path).version(), wanted)[APPS[3]] == 12


def test_a_log_entry_it_cannot_read_makes_it_start_over(tmp_path) -> None:
    path = str(tmp_path / "t")
    _append(path, {a: 1 for a in APPS})
    gone: set[int] = set()
    committer = DeltaCommitter(path, "pipe")

    class Forgetful(DeltaLog):
        def commit_actions(self, version: int) -> list[dict]:
            return [] if version in gone else super().commit_actions(version)

    txns = TxnVersions(Forgetful(committer.location, lambda: committer.filesystem))
    assert txns.of(DeltaTable(path).version(), APPS) == {a: 1 for a in APPS}
    _append(path, {APPS[0]: 2})
    gone.add(1)  # as if log cleanup had removed it before we read it
    assert txns.of(DeltaTable(path).version(), APPS) == _truth(path, APPS)
    assert txns.of(DeltaTable(path).version(), APPS)[APPS[0]] == 2


def test_log_state_equals_delta_rs_across_checkpoints_and_metadata_changes(tmp_path) -> None:
    """Txn versions and metadata read from the last checkpoint (its txn and metaData
    columns) plus the commits after it, at every version, equal delta-rs's snapshot."""
    path = str(tmp_path / "t")
    _append(path, {a: 1 for a in APPS})
    dt = DeltaTable(path)
    dt.alter.set_table_properties({"delta.checkpointInterval": "3"})
    log = DeltaCommitter(path, "pipe").log
    for i in range(2, 9):
        _append(path, {APPS[i]: 100 + i, APPS[0]: i})
        dt.update_incremental()
        if i == 5:
            dt.create_checkpoint()
        if i == 7:
            dt.alter.set_table_properties({"delta.logRetentionDuration": "interval 2 days"})
            dt.update_incremental()
        state = log.state()
        assert state is not None and state.version == dt.version()
        assert state.txns == {a: v for a in APPS if (v := dt.transaction_version(a)) is not None}
        assert state.metadata["configuration"] == dt.metadata().configuration
        assert state.arrow_schema().names == ["a"]
    assert log.checkpoint_versions(), "the test should have read a checkpoint"
    # an older version from the same log
    assert log.state(1).txns == {a: 1 for a in APPS}
    assert DeltaCommitter(str(tmp_path / "missing"), "pipe").log.state() is None


def test_recovery_reads_the_log_and_never_loads_the_snapshot(tmp_path, monkeypatch) -> None:
    """A restarted committer's offsets and epoch come from the log alone; the snapshot
    (every live file) is loaded only by the first commit."""
    path = str(tmp_path / "t")
    first = DeltaCommitter(path, "pipe")
    first.ensure_table()
    epoch = first.claim_epoch()
    import rayconnect.tables.delta as delta_module

    def no_snapshot(*args, **kwargs):
        raise AssertionError("the snapshot was loaded")

    monkeypatch.setattr(delta_module, "DeltaTable", no_snapshot)
    fresh = DeltaCommitter(path, "pipe")
    fresh.ensure_table()
    assert fresh.epoch() == epoch
    assert fresh.committed_offsets(None) == {}


def test_compare_after_our_own_commit_reads_no_log_entry(tmp_path) -> None:
    """The committer reads its commit's entry once (to find its version) and hands its
    txns on: the next round's compare-and-set reads nothing from the log."""
    path = str(tmp_path / "t")
    committer = DeltaCommitter(path, "pipe")
    committer.ensure_table()
    epoch = committer.claim_epoch()
    committer.commit([], {"c/t/0": 5}, {"c/t/0": None}, epoch=epoch)
    reads: list[int] = []
    original = committer.log.commit_actions

    def counted(version: int) -> list[dict]:
        reads.append(version)
        return original(version)

    committer.log.commit_actions = counted  # type: ignore[method-assign]
    version = committer.commit([], {"c/t/0": 9}, {"c/t/0": 5}, epoch=epoch)
    assert reads == [version]  # only _find_commit's read of the new entry
    assert committer.committed_offsets() == {"c/t/0": 9}


def test_log_state_reads_from_the_checkpoint_hint_without_listing(tmp_path, monkeypatch) -> None:
    """A log keeps every entry of its retention: the state comes from ``_last_checkpoint``
    and the commits after it, fetched by version number; a hint naming a checkpoint that is
    gone falls back to listing."""
    path = str(tmp_path / "t")
    for i in range(30):
        _append(path, {APPS[i % 5]: i})
        if i == 20:
            DeltaTable(path).create_checkpoint()
    log = DeltaCommitter(path, "pipe").log
    truth = {a: v for a in APPS if (v := DeltaTable(path).transaction_version(a)) is not None}

    def no_listing() -> list[str]:
        raise AssertionError("listed the log")

    with monkeypatch.context() as m:
        m.setattr(log, "names", no_listing)
        state = log.state()
        assert state is not None and state.version == 29 and state.txns == truth
        assert log.state(25).txns[APPS[0]] == 25  # as of an older version, still no listing
    (tmp_path / "t" / "_delta_log" / f"{20:020d}.checkpoint.parquet").unlink()
    state = log.state()  # the hint is stale: listed, replayed from version 0
    assert state is not None and state.version == 29 and state.txns == truth


def test_following_the_log_reads_only_new_commits_and_starts_over_past_a_cleanup(
    tmp_path, monkeypatch
) -> None:
    """``follow`` (the writer's schema before each typed write) reads the commits after the
    state it has - no checkpoint - and equals a whole read; when log cleanup removed the
    entry after it, it reads the whole state again."""
    path = str(tmp_path / "t")
    _append(path, {APPS[0]: 1})
    log = DeltaCommitter(path, "pipe").log
    state = log.follow(None)
    assert state is not None and state.version == 0
    dt = DeltaTable(path)
    dt.create_checkpoint()
    _append(path, {APPS[1]: 2})
    write_deltalake(path, pa.table({"a": [1], "b": ["new"]}), mode="append", schema_mode="merge")
    read: list[str] = []
    original = log._read_text

    def counted(p: str) -> str | None:
        read.append(p.rsplit("/", 1)[-1])
        return original(p)

    with monkeypatch.context() as m:
        m.setattr(log, "_read_text", counted)
        followed = log.follow(state)
    assert followed is not None and followed == log.state()
    assert followed.arrow_schema().names == ["a", "b"]
    assert read == [f"{v:020d}.json" for v in (1, 2, 3)]  # 3: the probe that finds the end
    assert log.follow(followed) == followed  # nothing new: one probe and the hint
    # the entry after an old state is gone (cleanup after a newer checkpoint)
    props = CommitProperties(app_transactions=[Transaction(APPS[2], 3)])
    write_deltalake(path, pa.table({"a": [2], "b": ["x"]}), mode="append", commit_properties=props)
    DeltaTable(path).create_checkpoint()
    (tmp_path / "t" / "_delta_log" / f"{1:020d}.json").unlink()
    assert log.follow(state) == log.state()
    assert log.follow(state).txns[APPS[2]] == 3
