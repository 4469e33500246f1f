"""Consistent cuts: a restarted coordinator reads back the newest cut its pipeline committed
(``RoundCommitter.committed_cut``) from a real Delta table's commit info - past claims,
partial commits, other pipelines' versions and a checkpoint - and from an Iceberg table's
snapshot summaries. No Spark, no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from table_files import K0, PIPELINE, records, stage

import rayconnect as rc
from rayconnect.protocol.effects import RoundMetadata
from rayconnect.tables import delta
from rayconnect.tables.base import TableCommitter
from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.factory import open_committer

pytestmark = [pytest.mark.timeout(120)]


def _round(committer: TableCommitter, where: Path, epoch: int, start: int, cut: int | None) -> None:
    """One round of 2 records of ``K0`` whose version records ``cut`` (None: a partial
    commit, no cut)."""
    meta = RoundMetadata(committer.pipeline, epoch, start, cut is None, 2, cut_lsn=cut)
    files = [stage(where, records(K0, start, 2))]
    expected = {K0: start or None}
    committer.commit(files, {K0: start + 2}, expected, meta.as_table_metadata(), epoch)


def test_delta_the_newest_cut_of_the_pipeline_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "t"
    committer = DeltaCommitter(str(path), PIPELINE)
    committer.ensure_table()
    assert committer.committed_cut() is None  # nothing committed yet
    epoch = committer.claim_epoch()
    _round(committer, path, epoch, 0, 100)
    _round(committer, path, epoch, 2, 200)
    _round(committer, path, epoch, 4, None)  # partial: no cut
    other = DeltaCommitter(str(path), "another-pipeline")  # its own offsets and cuts
    other.commit(
        [],
        {K0: 1},
        {K0: None},
        RoundMetadata("another-pipeline", 1, 1, False, 0, cut_lsn=999).as_table_metadata(),
    )
    restarted = DeltaCommitter(str(path), PIPELINE)
    epoch = restarted.claim_epoch()  # a version without a cut, the newest
    assert restarted.committed_cut() == 200
    # past a checkpoint: the cut is in a commit entry before it (checkpoints hold none)
    DeltaTable(str(path)).create_checkpoint()
    restarted.commit([], {K0: 6}, {K0: 6}, {"rayconnect.adopted": "true"}, epoch)
    assert DeltaCommitter(str(path), PIPELINE).committed_cut() == 200
    _round(restarted, path, epoch, 6, 300)
    assert DeltaCommitter(str(path), PIPELINE).committed_cut() == 300


def test_delta_a_cut_further_back_than_the_lookback_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t"
    committer = DeltaCommitter(str(path), PIPELINE)
    epoch = committer.claim_epoch()
    _round(committer, path, epoch, 0, 100)
    for start in (2, 4, 6):
        _round(committer, path, epoch, start, None)
    monkeypatch.setattr(delta, "CUT_LOOKBACK", 2)
    assert DeltaCommitter(str(path), PIPELINE).committed_cut() is None
    monkeypatch.setattr(delta, "CUT_LOOKBACK", 3)
    assert DeltaCommitter(str(path), PIPELINE).committed_cut() == 100


def test_iceberg_the_newest_cut_of_the_pipeline_is_read_back(tmp_path: Path) -> None:
    sink = rc.IcebergSink("db.orders", warehouse=str(tmp_path / "warehouse"))
    committer = open_committer(sink, PIPELINE)
    committer.ensure_table()
    assert committer.committed_cut() is None
    where = Path(sink.location().uri)
    epoch = committer.claim_epoch()
    _round(committer, where, epoch, 0, 100)
    _round(committer, where, epoch, 2, 200)
    _round(committer, where, epoch, 4, None)
    restarted = open_committer(sink, PIPELINE)
    restarted.claim_epoch()
    assert restarted.committed_cut() == 200
    assert open_committer(sink, "another-pipeline").committed_cut() is None
