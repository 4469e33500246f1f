"""The protocol's types round-trip through msgpack exactly, and bad bytes are rejected."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayconnect.protocol import (
    AckCommit,
    ClusterMetadata,
    DataFile,
    EndCommit,
    FileStats,
    GetMetadataUpdateEvent,
    HostRound,
    HostWriteStatus,
    KafkaPartitionSplit,
    KafkaStream,
    MetadataUpdateEvent,
    RequestCommit,
    StartCommit,
    TopicPartition,
    WriteStatus,
    check_name,
    decode,
    encode,
)

names = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)
offsets = st.integers(min_value=0, max_value=2**62)
ids = st.integers(min_value=0, max_value=2**31)
partitions = st.builds(TopicPartition, names, names, st.integers(0, 1000))
keys = partitions.map(lambda tp: tp.key)
stat_values = st.one_of(st.none(), st.integers(-(2**62), 2**62), st.text(max_size=8))
stats = st.builds(
    FileStats,
    st.dictionaries(names, stat_values, max_size=3),
    st.dictionaries(names, stat_values, max_size=3),
    st.dictionaries(names, st.integers(0, 10**6), max_size=3),
)
data_files = st.builds(DataFile, st.text(min_size=1, max_size=40), offsets, offsets, offsets, stats)
clusters = st.builds(
    ClusterMetadata,
    st.text(min_size=1, max_size=30),
    st.lists(names, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
)
streams = st.builds(KafkaStream, names, st.dictionaries(names, clusters, max_size=3))
splits = st.builds(KafkaPartitionSplit, partitions, st.one_of(st.none(), offsets))

write_statuses = st.builds(
    WriteStatus,
    ids,
    ids,
    keys,
    st.lists(data_files, max_size=3).map(tuple),
    offsets,
    offsets,
    offsets,
)
messages = st.one_of(
    st.builds(StartCommit, ids, ids, st.dictionaries(keys, offsets, max_size=5)),
    st.builds(EndCommit, ids, ids),
    write_statuses,
    st.builds(AckCommit, ids, ids, offsets, st.dictionaries(keys, offsets, max_size=5)),
    st.builds(RequestCommit, ids, ids, keys),
    st.builds(
        MetadataUpdateEvent,
        st.lists(streams, max_size=2).map(tuple),
        st.lists(splits, max_size=3).map(tuple),
    ),
    st.builds(GetMetadataUpdateEvent, names),
    write_statuses.map(lambda s: HostWriteStatus.of([s])),
    st.builds(HostRound.of, st.builds(EndCommit, ids, ids), st.lists(keys, max_size=3)),
)


@given(messages)
def test_every_message_round_trips_to_the_same_type_and_value(message: object) -> None:
    decoded = decode(encode(message))
    assert type(decoded) is type(message)
    assert decoded == message


@given(partitions)
def test_partition_key_round_trips(tp: TopicPartition) -> None:
    assert TopicPartition.from_key(tp.key) == tp
    assert tp.app_id("pipe") == f"pipe/{tp.cluster}/{tp.topic}/{tp.partition}"


def test_tag_names_follow_rfc32() -> None:
    raw = msgspec.msgpack.decode(encode(EndCommit(epoch=3, txn_id=7)))
    assert raw == {"type": "END-COMMIT", "epoch": 3, "txn_id": 7}


def test_unknown_message_type_is_rejected_with_the_reason() -> None:
    bad = msgspec.msgpack.encode({"type": "NOPE", "epoch": 1})
    with pytest.raises(msgspec.ValidationError, match="NOPE"):
        decode(bad)


def test_wrong_field_type_names_the_field() -> None:
    bad = msgspec.msgpack.encode({"type": "END-COMMIT", "epoch": "x", "txn_id": 1})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.epoch"):
        decode(bad)


@pytest.mark.parametrize("name", ["a/b", "", "sp ace", "ü"])
def test_bad_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="invalid cluster id"):
        check_name("cluster id", name)
