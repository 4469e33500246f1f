"""Per-host round messages (protocol/host_rounds.py, messages.HostRound/HostWriteStatus):
what crosses the wire per host says exactly what the per-partition messages said."""

from __future__ import annotations

import msgspec
import pytest

from rayconnect.protocol.coordinator import Coordinator, State
from rayconnect.protocol.effects import Broadcast, CommitTable
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.host_rounds import HostAddresses, pack_statuses, unpack_rounds
from rayconnect.protocol.messages import (
    AckCommit,
    Drained,
    EndCommit,
    HostRound,
    HostWriteStatus,
    RequestCommit,
    StartCommit,
    WriteStatus,
    decode,
    encode,
)
from rayconnect.protocol.participant import Participant
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile

A, B, C = "c1/t/0", "c1/t/1", "c1/u/0"
CFG = CommitSettings(commit_interval_s=10.0, write_timeout_s=5.0)
SHARED = DataFile("h0/r1.parquet", 100, 7, shared_by=(A, B))
OWN = DataFile("c1/t/1/own.parquet", 50, 1)


def statuses(txn: int = 1) -> list[WriteStatus]:
    return [
        WriteStatus(7, txn, A, (SHARED,), 10, 14, 4),
        WriteStatus(7, txn, B, (SHARED, OWN), 20, 24, 4),
        WriteStatus(7, txn, C, (), 30, 30, 0),
    ]


def test_a_host_status_lists_each_file_once_and_gives_back_the_exact_statuses() -> None:
    packed = HostWriteStatus.of(statuses())
    assert packed == HostWriteStatus(
        7, 1, (A, B, C), (10, 20, 30), (14, 24, 30), (4, 4, 0), (SHARED, OWN), ((0,), (0, 1), ())
    )
    assert decode(encode(packed)) == packed
    assert packed.statuses() == statuses()


@pytest.mark.parametrize(
    "fields",
    [
        {"first_offsets": [10]},  # arrays of unequal length
        {"file_indexes": [[0], [5], []]},  # a file that is not in the message
        {"partitions": [A, A, C]},  # a partition twice
    ],
)
def test_a_malformed_host_status_is_refused_on_decode(fields: dict[str, object]) -> None:
    raw = msgspec.msgpack.decode(encode(HostWriteStatus.of(statuses())))
    raw.update(fields)
    with pytest.raises(msgspec.ValidationError, match="HOST-WRITE-STATUS"):
        decode(msgspec.msgpack.encode(raw))


def test_statuses_of_two_rounds_are_not_packed_together() -> None:
    with pytest.raises(ValueError, match="one round"):
        HostWriteStatus.of([statuses(1)[0], statuses(2)[1]])


def test_packing_keeps_each_partitions_order_and_packs_one_round() -> None:
    a, b, c = statuses()
    request = RequestCommit(7, 2, A)
    drained = Drained("c1/v/0", 5, 50)
    old_b = WriteStatus(7, 0, B, (), 1, 1, 0)
    packed = pack_statuses([a, drained, b, request, old_b, c])
    # c moves ahead of A's request (another partition's); a lone status stays plain
    assert packed == [HostWriteStatus.of([a, b, c]), drained, request, old_b]
    # a second status of a partition named since the pack began starts a pack of its own
    a2 = WriteStatus(7, 1, A, (), 10, 10, 0)
    assert pack_statuses([a, request, a2, b]) == [a, request, HostWriteStatus.of([a2, b])]
    # ... as does one whose partition said something else since (C's DRAINED before c)
    c_drained = Drained(C, 5, 50)
    assert pack_statuses([a, c_drained, c]) == [a, c_drained, c]


def test_a_round_reported_per_host_commits_what_it_commits_per_partition() -> None:
    def round_with(reports: list[object]) -> tuple[CommitTable, Coordinator]:
        coord = Coordinator("pipe", {A, B, C}, CFG)
        coord.recover(7, {A: 10, B: 20, C: 30}, now=0.0)
        coord.tick(10.0)
        ready = [e for r in reports for e in coord.step(r, now=11.0)]  # type: ignore[arg-type]
        commits = [e for e in ready if isinstance(e, CommitTable)]
        assert len(commits) == 1
        return commits[0], coord

    alone, _ = round_with(statuses())
    hosted, coord = round_with([HostWriteStatus.of(statuses()[:2]), statuses()[2]])
    assert hosted == alone
    assert hosted.offsets == {A: 14, B: 24, C: 30}
    assert hosted.files == (SHARED, OWN)
    assert coord.state is State.COMMITTING


def test_a_host_status_is_validated_per_partition() -> None:
    coord = Coordinator("pipe", {A, B}, CFG)
    coord.recover(7, {A: 10, B: 20}, now=0.0)
    coord.tick(10.0)
    wrong_b = WriteStatus(7, 1, B, (), 21, 22, 1)  # not where the round started
    assert coord.step(HostWriteStatus.of([statuses()[0], wrong_b]), now=11.0) == []
    status = coord.status()
    assert (status.statuses_rejected, status.waiting_for) == (1, (B,))
    # a host status of an older round: ignored once per partition it names
    coord.step(HostWriteStatus.of(statuses(0)[:2]), now=11.0)
    assert coord.status().messages_ignored == 2


def test_the_coordinator_refuses_a_host_round_and_a_participant_a_host_status() -> None:
    coord = Coordinator("pipe", {A}, CFG)
    coord.recover(7, {A: 10}, now=0.0)
    with pytest.raises(ProtocolError, match="HostRound"):
        coord.step(HostRound((A,), EndCommit(7, 1)), now=1.0)
    with pytest.raises(ProtocolError, match="HostWriteStatus"):
        Participant(A, CFG).step(HostWriteStatus.of(statuses()[:1]), now=1.0)


def test_a_hosts_round_messages_carry_its_partitions_and_their_offsets_only() -> None:
    hosts = {A: "h0", B: "h0", C: "h1"}
    addresses = HostAddresses(hosts.__getitem__)
    keys = (A, B, C)
    outbox: dict[str, list[HostRound]] = {}
    addresses.address(AckCommit(7, 1, 3, {A: 14, B: 24, C: 30}), keys, outbox)
    addresses.address(StartCommit(7, 2, {A: 14, C: 30}), keys, outbox)
    addresses.address(EndCommit(7, 2), keys, outbox)
    assert outbox == {
        "h0": [
            HostRound((A, B), AckCommit(7, 1, 3, {A: 14, B: 24})),
            HostRound((A, B), StartCommit(7, 2, {A: 14})),
            HostRound((A, B), EndCommit(7, 2)),
        ],
        "h1": [
            HostRound((C,), AckCommit(7, 1, 3, {C: 30})),
            HostRound((C,), StartCommit(7, 2, {C: 30})),
            HostRound((C,), EndCommit(7, 2)),
        ],
    }
    assert addresses.group(keys) is addresses.group(keys)  # grouped once per recipients
    assert unpack_rounds(outbox["h0"]) == {
        key: [AckCommit(7, 1, 3, {A: 14, B: 24}), StartCommit(7, 2, {A: 14}), EndCommit(7, 2)]
        for key in (A, B)
    }
    with pytest.raises(TypeError, match="RequestCommit"):
        addresses.address(RequestCommit(7, 1, A), keys, outbox)


def test_the_coordinator_sends_every_round_to_the_same_recipients_until_they_change() -> None:
    coord = Coordinator("pipe", {A, B}, CFG)
    (start,) = coord.recover(7, {A: 10, B: 20}, now=0.0)
    (end,) = coord.tick(10.0)
    assert isinstance(start, Broadcast) and isinstance(end, Broadcast)
    assert start.to is end.to
    coord.add_partitions([C], now=10.5)
    ready = coord.step(HostWriteStatus.of(statuses()[:2]), now=11.0)
    (commit,) = ready
    assert isinstance(commit, CommitTable)
    ack, _finished, start2 = coord.commit_succeeded(1, now=12.0)
    assert isinstance(ack, Broadcast) and isinstance(start2, Broadcast)
    assert (ack.to, start2.to) == ((A, B), (A, B, C))
