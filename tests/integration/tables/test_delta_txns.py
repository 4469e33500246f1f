"""TxnVersions (tables/delta_txns.py) against real delta-rs tables: what it answers after
following the log must be what delta-rs answers from the snapshot, whoever committed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from rayconnect.tables.delta import DeltaCommitter
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
    txns = TxnVersions(committer.commit_actions)
    wanted = [*APPS, "pipe/never"]
    assert txns.of(DeltaTable(path), wanted) == _truth(path, wanted)
    # other writers: new app ids, moved ones, a commit without txns
    _append(path, {APPS[3]: 11, APPS[30]: 5})
    write_deltalake(path, pa.table({"a": [2]}), mode="append")
    _append(path, {APPS[3]: 12, "pipe/never": 1})
    assert txns.of(DeltaTable(path), wanted) == _truth(path, wanted)
    assert txns.of(DeltaTable(path), wanted)[APPS[3]] == 12


def test_a_log_entry_it_cannot_read_makes_it_start_over(tmp_path) -> None:
    path = str(tmp_path / "t")
    _append(path, {a: 1 for a in APPS})
    gone: set[int] = set()
    committer = DeltaCommitter(path, "pipe")
    txns = TxnVersions(lambda v: [] if v in gone else committer.commit_actions(v))
    assert txns.of(DeltaTable(path), APPS) == {a: 1 for a in APPS}
    _append(path, {APPS[0]: 2})
    gone.add(1)  # as if log cleanup had removed it before we read it
    assert txns.of(DeltaTable(path), APPS) == _truth(path, APPS)
    assert txns.of(DeltaTable(path), APPS)[APPS[0]] == 2
