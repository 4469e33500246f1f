"""A table offset outside its partition's log (protocol/offset_range.py, the coordinator's
``offsets_out_of_range``): never silent - give up, or start the partition over exactly once."""

from __future__ import annotations

import msgspec
import pytest

from rayconnect.errors import ConfigError
from rayconnect.protocol.coordinator import Coordinator, State
from rayconnect.protocol.effects import Broadcast, CommitTable, GiveUp, RoundFinished
from rayconnect.protocol.messages import StartCommit, WriteStatus
from rayconnect.protocol.offset_range import OffsetsOutOfRange, OutOfRangePolicy
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile
from rayconnect.tables.base import check_not_behind, check_offsets

A, B = "local/orders/0", "local/orders/1"
CFG = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0)
#: the table says 13,750; the re-created topic holds [0, 2,526)
AHEAD = OffsetsOutOfRange(A, 13_750, 2_526, 0)


def running(policy: OutOfRangePolicy) -> Coordinator:
    coord = Coordinator("pipe", {A, B}, CFG, offsets_out_of_range=policy)
    coord.recover(3, {A: 13_750, B: 40}, now=0.0)
    return coord


def status(key: str, first: int, next_: int, txn: int) -> WriteStatus:
    files = (DataFile(f"{key}/{txn}.parquet", 100, next_ - first),) if next_ > first else ()
    return WriteStatus(3, txn, key, files, first, next_, next_ - first)


def finish_round(coord: Coordinator, txn: int, a: tuple[int, int], b: tuple[int, int]) -> list:  # type: ignore[type-arg]
    coord.tick(10.0 * txn)
    coord.step(status(A, *a, txn), now=10.0 * txn)
    return coord.step(status(B, *b, txn), now=10.0 * txn)


def test_fail_gives_the_pipeline_up_naming_the_partition_and_both_offsets() -> None:
    coord = running("fail")
    [give_up] = coord.offsets_out_of_range(AHEAD, now=1.0)
    assert isinstance(give_up, GiveUp)
    assert "local/orders/0" in give_up.reason and "13,750" in give_up.reason
    assert "[0, 2,526)" in give_up.reason and "offsets_out_of_range" in give_up.reason
    assert coord.status().out_of_range == {A: AHEAD}
    assert coord.status().last_error == give_up.reason
    assert AHEAD.state == "offsets_ahead"
    assert OffsetsOutOfRange(A, 5, 100, 10).state == "offsets_before_log_start"


@pytest.mark.parametrize(
    "report",
    [
        OffsetsOutOfRange(A, 13_000, 2_526, 0),  # not the committed offset: a stale report
        OffsetsOutOfRange(B, 40, 2_526, 0),  # inside the log
        OffsetsOutOfRange("local/other/0", 9, 2, 0),  # not a partition the table has
    ],
)
def test_a_report_that_is_not_news_changes_nothing(report: OffsetsOutOfRange) -> None:
    coord = running("fail")
    assert coord.offsets_out_of_range(report, now=1.0) == []
    assert coord.status().out_of_range == {} and coord.status().messages_ignored == 1


@pytest.mark.parametrize(("policy", "start"), [("earliest", 0), ("latest", 2_526)])
def test_a_reset_starts_the_partition_over_and_its_commit_records_it(
    policy: OutOfRangePolicy, start: int
) -> None:
    coord = running(policy)
    assert coord.offsets_out_of_range(AHEAD, now=1.0) == []
    assert f"starting it over at {start:,}" in (coord.status().last_error or "")
    # the round under way read nothing for A (its reader stood past the log's end)
    ready = finish_round(coord, 1, (13_750, 13_750), (40, 45))
    [commit] = [e for e in ready if isinstance(e, CommitTable)]
    assert commit.expected == {A: 13_750, B: 40} and commit.offsets == {A: 13_750, B: 45}
    assert commit.metadata.offset_resets == {}
    ready = coord.commit_succeeded(8, now=10.5)
    [start_msg] = [e.message for e in ready if isinstance(e, Broadcast)][1:]
    assert start_msg == StartCommit(3, 2, {A: start, B: 45})
    # the next round reads A from the new start: its commit expects the stale offset
    ready = finish_round(coord, 2, (start, start + 7), (45, 45))
    [commit] = [e for e in ready if isinstance(e, CommitTable)]
    assert commit.expected == {A: 13_750, B: 45}
    assert commit.offsets == {A: start + 7, B: 45}
    assert commit.resets == {A} and commit.metadata.offset_resets == {A: 13_750}
    table_metadata = commit.metadata.as_table_metadata()
    assert msgspec.json.decode(table_metadata["rayconnect.offset_resets"]) == {A: 13_750}
    coord.commit_succeeded(9, now=20.5)
    assert coord.offsets == {A: start + 7, B: 45}
    assert coord.status().out_of_range == {} and coord.resetting == frozenset()


def test_a_reset_is_committed_even_when_its_partition_has_no_records_yet() -> None:
    coord = running("latest")
    coord.offsets_out_of_range(AHEAD, now=1.0)
    finish_round(coord, 1, (13_750, 13_750), (40, 40))  # empty: nothing to commit
    assert coord.state is State.STARTED
    ready = finish_round(coord, 2, (2_526, 2_526), (40, 40))
    [commit] = [e for e in ready if isinstance(e, CommitTable)]
    assert commit.offsets == {A: 2_526, B: 40} and commit.metadata.offset_resets == {A: 13_750}


def test_a_reset_whose_commit_landed_though_reported_failed_is_done_after_the_reload() -> None:
    coord = running("earliest")
    coord.offsets_out_of_range(AHEAD, now=1.0)
    finish_round(coord, 1, (13_750, 13_750), (40, 40))
    finish_round(coord, 2, (0, 5), (40, 40))
    coord.commit_failed("timed out", now=20.5)
    table = {A: 5, B: 40}  # it landed
    check_not_behind(coord.offsets, table, coord.resetting)  # the actor's check passes
    ready = coord.table_reloaded(table, now=21.0, table_epoch=3)
    assert [e.message for e in ready if isinstance(e, Broadcast)] == [
        StartCommit(3, 3, {A: 5, B: 40})
    ]
    assert coord.resetting == frozenset() and coord.status().out_of_range == {}
    assert not any(isinstance(e, RoundFinished) for e in ready)


def test_the_table_lets_only_a_reset_partition_go_down() -> None:
    check_offsets({A: 7}, {A: 13_750}, {A: 13_750}, resets={A})
    with pytest.raises(ValueError, match="backwards"):
        check_offsets({A: 7}, {A: 13_750}, {A: 13_750})


def test_a_reset_policy_with_routes_is_refused_before_start(tmp_path) -> None:  # noqa: ANN001
    import rayconnect as rc

    meta = rc.StaticMetadataService(
        [rc.KafkaStream("s", {"local": rc.ClusterMetadata("127.0.0.1:9092", ["t"])})]
    )
    source = rc.KafkaSource(meta, value_format="json", offsets_out_of_range="earliest")
    sink = rc.DeltaSink(str(tmp_path), routes=rc.Routes((rc.Route("{value}", field="table"),)))
    with pytest.raises(ConfigError, match="offsets_out_of_range"):
        rc.SinkPipeline("p", source, sink).config.validate()
