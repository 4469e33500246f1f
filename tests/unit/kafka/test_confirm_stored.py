"""A transaction is committed only if the broker said where every batch went: aiokafka
resolves a batch answered DUPLICATE_SEQUENCE_NUMBER with offset -1 (its first record; the
others -1 + i), and tansu 0.6.0 gives that answer for batches it never stored."""

from __future__ import annotations

import pytest
from aiokafka.structs import RecordMetadata, TopicPartition

from rayconnect.errors import RayconnectError
from rayconnect.kafka.transactions import UnconfirmedWrite, confirm_stored


def _sent(topic: str, partition: int, offset: int) -> RecordMetadata:
    return RecordMetadata(topic, partition, TopicPartition(topic, partition), offset, None, 0, None)


def test_offsets_the_broker_gave_are_confirmed() -> None:
    confirm_stored([_sent("out", 0, 0), _sent("out", 1, 17), _sent("offsets", 0, 3)])
    confirm_stored([])


def test_a_batch_answered_as_a_duplicate_stops_the_commit() -> None:
    # what aiokafka made of a 3-record batch to out/1 answered DUPLICATE_SEQUENCE_NUMBER
    results = [_sent("out", 0, 40), _sent("out", 1, -1), _sent("out", 1, 0), _sent("out", 1, 1)]
    with pytest.raises(UnconfirmedWrite) as caught:
        confirm_stored(results)
    assert isinstance(caught.value, RayconnectError)
    assert str(caught.value) == (
        "the broker answered a retried batch as a duplicate without its offset (out/1): it may "
        "not have stored it, so the transaction is aborted and written again"
    )
