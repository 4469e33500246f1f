"""``PipelineStatus``: one typed Struct from the coordinator to the handle to the CLI, and
``rayconnect status --json`` prints exactly its JSON."""

from __future__ import annotations

import json

import msgspec
import pytest
from status_sample import pipeline_status

from rayconnect.cli.status import render_status, status_json
from rayconnect.protocol.commit_outcome import FailedCommit, judge
from rayconnect.protocol.status import (
    PartitionStatus,
    PipelineStatus,
    RoundCounts,
    WriterStatus,
    decode,
    encode,
)
from rayconnect.protocol.upkeep import UpkeepStatus

ROUNDS = RoundCounts(committed=163, partial=2, discarded=5, empty=40, requested=3, drained=1)


def _status() -> PipelineStatus:
    return pipeline_status(
        epoch=3,
        txn_id=9,
        started_at=1_700_000_000.5,
        table_version=170,
        partitions=("east/orders/0", "east/orders/1"),
        offsets={"east/orders/0": 500, "east/orders/1": 480},
        dead_letters={"east/orders/0": 60},
        rounds=msgspec.structs.asdict(ROUNDS),
        records_committed_since_start=980,
        upkeep=UpkeepStatus(
            compactions=1,
            compactions_given_up=0,
            tidies=0,
            tidies_failed=0,
            files_since_compaction=4,
            running=(),
            last_error=None,
        ),
        writer=WriterStatus(executors=1, executors_wanted=1),
        lag={"east/orders/0": 0, "east/orders/1": 20},
        partition_status={
            "east/orders/0": PartitionStatus(
                committed_offset=500, high_watermark=500, lag=0, host="orders/participants/0"
            ),
        },
    )


def test_json_round_trips_to_the_same_struct() -> None:
    status = _status()
    assert decode(encode(status)) == status


def test_status_json_prints_exactly_the_struct_s_encoding() -> None:
    status = _status()
    assert status_json(status, pretty=False) == encode(status).decode()
    assert json.loads(status_json(status, pretty=True)) == json.loads(encode(status))
    doc = json.loads(encode(status))
    assert set(doc) == set(PipelineStatus.__struct_fields__)
    assert doc["rounds_since_start"] == {
        "committed": 163,
        "partial": 2,
        "discarded": 5,
        "empty": 40,
        "requested": 3,
        "drained": 1,
    }
    assert doc["dead_letters"] == {"east/orders/0": 60}


def test_counts_kept_in_memory_are_named_since_start_and_the_old_names_are_gone() -> None:
    status = _status()
    assert status["offsets"] == status.offsets  # readable by name, as the old dict was
    assert status.get("rounds_committed") is None
    assert "rounds_committed" not in status and "records_committed" not in status
    with pytest.raises(KeyError):
        status["rounds_committed"]
    since_start = [f for f in PipelineStatus.__struct_fields__ if "since_start" in f]
    assert since_start == [
        "rounds_since_start",
        "records_committed_since_start",
        "statuses_rejected_since_start",
        "messages_ignored_since_start",
    ]


def test_a_status_missing_a_required_field_does_not_decode() -> None:
    doc = json.loads(encode(_status()))
    del doc["epoch"]
    with pytest.raises(msgspec.ValidationError, match="missing required field `epoch`"):
        decode(json.dumps(doc))


def test_the_text_view_says_which_counts_run_since_the_coordinator_started() -> None:
    text = render_status(_status())
    assert "(coordinator start): rounds committed 163 (partial 2)  discarded 5  empty 40" in text
    assert "records committed 980" in text
    assert "dead letters 60 in the table (east/orders/0=60)" in text


def test_a_source_status_prints_as_its_struct_json_and_reads_back():
    """``rayconnect status --json`` of a source pipeline: exactly its SourcePipelineStatus,
    lag typed; a task that did not answer leaves its unknown counts out."""
    import json

    from rayconnect.cli.status import status_json
    from rayconnect.protocol.source_status import SourceLag, SourceTaskReport, decode, summed

    up = SourceTaskReport(
        task=0, state="polling", records_committed=7, transactions_committed=2,
        transactions_aborted=1, lag=SourceLag(bytes=120, seconds=0.25), pid=42,
    )  # fmt: skip
    down = SourceTaskReport(task=1, state="unavailable", error="ActorUnavailableError: x")
    status = summed("pg", {0: up, 1: down})
    text = status_json(status)
    assert decode(text) == status
    data = json.loads(text)
    assert data["kind"] == "source" and data["records_committed"] == 7
    assert data["transactions_committed"] == 2 and data["transactions_aborted"] == 1
    assert data["tasks"]["0"]["lag"] == {"bytes": 120, "seconds": 0.25}
    assert data["tasks"]["1"] == {
        "task": 1,
        "state": "unavailable",
        "error": "ActorUnavailableError: x",
    }
    # read by name as the dicts this replaced: what a task did not say is absent
    assert status["tasks"][0]["lag"]["bytes"] == 120
    assert status["tasks"][1].get("records_committed", 0) == 0
    assert "records_committed" not in status["tasks"][1]


def test_route_tables_are_typed_round_trip_and_the_most_lagging_are_listed() -> None:
    from rayconnect.cli.status import TABLES_SHOWN
    from rayconnect.protocol.status import TableStatus

    tables = {
        f"t_{i:03d}": TableStatus(
            version=i,
            rows_since_start=10 * i,
            last_commit_at=1_700_000_000.0 + i,
            offsets={f"east/t{i:03d}/0": 100},
            lag=i % 7,
        )
        for i in range(30)
    }
    status = msgspec.structs.replace(_status(), tables=tables)
    assert decode(encode(status)) == status
    assert json.loads(encode(status))["tables"]["t_006"] == {
        "version": 6,
        "rows_since_start": 60,
        "last_commit_at": 1_700_000_006.0,
        "offsets": {"east/t006/0": 100},
        "lag": 6,
    }
    lines = render_status(status).splitlines()
    head = lines.index(f"30 route tables ({TABLES_SHOWN} most lagging shown)")
    shown = [line.split()[0] for line in lines[head + 2 : head + 2 + TABLES_SHOWN]]
    assert shown[:5] == ["t_006", "t_013", "t_020", "t_027", "t_005"]
    assert len(shown) == TABLES_SHOWN and lines[head + 2 + TABLES_SHOWN] == ""


def test_how_the_last_failed_commit_ended_round_trips_and_is_printed() -> None:
    failed = judge(
        FailedCommit(
            epoch=3,
            txn_id=8,
            expected={"east/orders/0": 400},
            offsets={"east/orders/0": 500},
            error="TimeoutError: no answer within write_timeout_s=60 s",
            timed_out=True,
        ),
        {"east/orders/0": 500},
        table_epoch=3,
    )
    status = msgspec.structs.replace(_status(), last_failed_commit=failed)
    assert decode(encode(status)) == status
    assert json.loads(encode(status))["last_failed_commit"]["ended"] == "committed after all"
    assert (
        "last failed commit: txn 8 of epoch 3: the commit timed out (TimeoutError: no answer "
        "within write_timeout_s=60 s) and was committed after all (table epoch 3); its records "
        "stay; the next round starts after them"
    ) in render_status(status).splitlines()
