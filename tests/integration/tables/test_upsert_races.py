"""An upsert table's rounds racing other writers on real delta-rs tables (no Ray, no Spark):
a user's OPTIMIZE or DELETE that rewrites the files a round's MERGE rewrites, committed
inside the round (after its read) or planned before it and committed after it. One side
fails cleanly - the round retries on the new version, or the outside writer is refused -
and the table always equals the change stream's state: each key once, none lost, none
resurrected. A VACUUM of the files MERGEs removed does not disturb later rounds. Every
test runs copy-on-write (MERGE) and merge-on-read (deletion vectors)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from typed_files import UPSERT_BY_ID, raw, stage_records

from rayconnect.config.sink import DeltaSink
from rayconnect.protocol.upkeep import CompactSettings, LogSettings
from rayconnect.storage.delta_reads import read_delta
from rayconnect.storage.location import TableLocation
from rayconnect.tables.delta import current_schema
from rayconnect.tables.delta_upkeep import DeltaUpkeep
from rayconnect.tables.factory import open_committer
from rayconnect.write_modes.modes import MergeOnRead

pytestmark = [pytest.mark.timeout(90)]
PIPELINE = "p"
KEY = "c/t/0"
FMT = UPSERT_BY_ID


class UpsertRounds:
    """A pipeline's upsert rounds on one table through its committer (``write_mode:
    upsert``), and the state the changes leave: key -> value, absent once deleted."""

    def __init__(self, table: Path, upsert_mode: str) -> None:
        self.table = table
        sink = DeltaSink(str(table), write_mode="upsert", upsert_mode=upsert_mode)  # type: ignore[arg-type]
        self.committer = open_committer(sink, PIPELINE, FMT)
        self.committer.ensure_table()
        self.epoch = self.committer.claim_epoch()
        self.next = 0
        self.state: dict[int, str] = {}

    def commit(self, changes: list[tuple[int, str | None]]) -> int:
        """One round of ``changes`` (key, value; None deletes the key), in offset order."""
        records = raw([None if v is None else json.dumps({"id": k, "v": v}).encode()
                       for k, v in changes], self.next)  # fmt: skip
        keys = pa.array([json.dumps({"id": k}).encode() for k, _ in changes], pa.binary())
        records = records.set_column(records.column_names.index("key"), "key", keys)
        schema = current_schema(TableLocation.parse(str(self.table)), FMT)
        files = stage_records(self.table, records, FMT, schema)
        end = self.next + len(changes)
        expected = {KEY: self.next or None}
        version = self.committer.commit(files, {KEY: end}, expected, epoch=self.epoch)
        self.next = end
        for k, v in changes:
            if v is None:
                self.state.pop(k, None)
            else:
                self.state[k] = v
        return version

    def inside_next_commit(self, outside: Callable[[], object]) -> None:
        """Run ``outside`` (another writer's commit) after the next round read the table,
        before its MERGE commits - once."""
        original = self.committer._check_fence
        done: list[object] = []

        def check_then_outside(*args, **kwargs):
            original(*args, **kwargs)
            if not done:
                done.append(outside())

        self.committer._check_fence = check_then_outside  # type: ignore[method-assign]

    def count_writes(self) -> list[int]:
        """The version writes the committer attempts from now on (a retry is a second)."""
        original, attempts = self.committer._write, []

        def counted(*args, **kwargs):
            attempts.append(1)
            return original(*args, **kwargs)

        self.committer._write = counted  # type: ignore[method-assign]
        return attempts


def table_state(table: Path) -> dict[int, str]:
    t = read_delta(str(table), columns=["id", "v"])
    ids = t.column("id").to_pylist()
    assert [k for k, n in Counter(ids).items() if n > 1] == []  # each key once
    return dict(zip(ids, t.column("v").to_pylist(), strict=True))


@pytest.fixture(params=["copy_on_write", "merge_on_read"])
def rounds(tmp_path: Path, request: pytest.FixtureRequest) -> UpsertRounds:
    """Four rounds of 50 new keys each: four files, key ranges apart."""
    r = UpsertRounds(tmp_path / "t", request.param)
    for start in range(0, 200, 50):
        r.commit([(k, f"a{k}") for k in range(start, start + 50)])
    assert len(DeltaTable(str(r.table)).file_uris()) == 4
    return r


def changes_over_every_file(tag: str) -> list[tuple[int, str | None]]:
    """Updates and deletes in each of the four files, a key updated then deleted, a key
    deleted then inserted again, and new keys."""
    return (
        [(k, f"{tag}{k}") for k in (1, 60, 120, 180)]
        + [(k, None) for k in (2, 61, 121, 181)]
        + [(3, f"{tag}3"), (3, None), (62, None), (62, f"{tag}62")]
        + [(k, f"{tag}{k}") for k in (500, 501)]
    )


def test_outside_optimize_inside_a_round_makes_the_merge_retry_on_the_new_files(rounds):
    path = str(rounds.table)
    rounds.inside_next_commit(lambda: DeltaTable(path).optimize.compact())
    attempts = rounds.count_writes()
    version = rounds.commit(changes_over_every_file("b"))
    assert len(attempts) == 2  # the MERGE on the read before OPTIMIZE was refused, retried
    history = DeltaTable(path).history(2)
    assert [h["operation"] for h in history] == ["MERGE", "OPTIMIZE"]
    assert history[0]["version"] == version
    assert table_state(rounds.table) == rounds.state
    assert rounds.committer.committed_offsets() == {KEY: rounds.next}


def test_outside_delete_inside_a_round_is_applied_before_the_rounds_changes(rounds):
    path = str(rounds.table)
    rounds.inside_next_commit(lambda: DeltaTable(path).delete("id >= 50 AND id < 100"))
    attempts = rounds.count_writes()
    rounds.commit(changes_over_every_file("b"))
    assert len(attempts) == 2
    # commit order: the user's DELETE, then the round (its update of key 60 re-inserts it)
    want = {k: v for k, v in rounds.state.items() if not 50 <= k < 100 or k in (60, 62)}
    assert table_state(rounds.table) == want
    assert DeltaTable(path).history(1)[0]["operation"] == "MERGE"
    assert rounds.committer.committed_offsets() == {KEY: rounds.next}


@pytest.mark.parametrize(
    "outside",
    [
        pytest.param(lambda dt: dt.optimize.compact(), id="optimize"),
        pytest.param(lambda dt: dt.delete("id >= 100"), id="delete"),
        pytest.param(lambda dt: dt.delete("id = 0"), id="delete-of-a-file-the-round-rewrote"),
    ],
)
def test_outside_writer_planned_before_a_round_is_refused_after_it(rounds, outside):
    """The user's OPTIMIZE/DELETE read the version before the round's MERGE and commits
    after it: delta-rs refuses it (the MERGE removed files it read), the round stands."""
    stale = DeltaTable(str(rounds.table))
    rounds.commit(changes_over_every_file("b"))
    with pytest.raises(CommitFailedError):
        outside(stale)
    assert table_state(rounds.table) == rounds.state
    # rerun on the current version, the user's job lands, and rounds go on
    outside(DeltaTable(str(rounds.table)))
    kept = table_state(rounds.table)
    assert kept.items() <= rounds.state.items()
    rounds.state = kept
    rounds.commit([(k, f"c{k}") for k in (0, 1, 150, 700)])
    assert table_state(rounds.table) == rounds.state


def test_vacuum_of_the_files_merges_removed_between_rounds(rounds):
    rounds.commit(changes_over_every_file("b"))
    removed = DeltaTable(str(rounds.table)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    # the files the MERGE rewrote (and no live one); merge-on-read rewrites none
    assert removed or isinstance(rounds.committer.apply, MergeOnRead)
    rounds.commit(changes_over_every_file("c"))
    assert table_state(rounds.table) == rounds.state
    assert rounds.committer.committed_offsets() == {KEY: rounds.next}


def test_the_pipelines_compaction_planned_before_a_round_retries_after_it(rounds):
    """Our own upkeep's compaction read the table before a round's MERGE: its commit is
    refused, the retry on a fresh version compacts, every key once."""
    keeper = DeltaUpkeep(
        str(rounds.table), PIPELINE, CompactSettings(min_files=2, every_s=0),
        LogSettings(), 24, FMT,
    )  # fmt: skip
    stale = DeltaTable(str(rounds.table))
    rounds.commit([(1, "b1"), (2, None), (900, "b900")])  # rewrites the first file only
    # (merge-on-read: deletes in the first file, one new file)
    added = isinstance(rounds.committer.apply, MergeOnRead)
    assert len(DeltaTable(str(rounds.table)).file_uris()) == 4 + added
    with pytest.raises(CommitFailedError):
        keeper._compact_once(stale)
    fresh = keeper._table
    calls: list[int] = []

    def stale_first() -> DeltaTable:
        calls.append(1)
        return stale if len(calls) == 1 else fresh()

    keeper._table = stale_first  # type: ignore[method-assign]
    assert keeper.compact()["numFilesRemoved"] > 1  # the second attempt
    assert len(DeltaTable(str(rounds.table)).file_uris()) == 1
    assert table_state(rounds.table) == rounds.state
    rounds.commit(changes_over_every_file("c"))
    assert table_state(rounds.table) == rounds.state
