"""The partitioning of batched sends: numpy's murmur2 is Kafka's (aiokafka's pure-Python
DefaultPartitioner, which follows the Java client), for keys of every length."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner, murmur2

from rayconnect.kafka.batched_send import murmur2 as murmur2_many


def test_vectorised_murmur2_is_kafkas() -> None:
    rng = random.Random(3)
    keys = [rng.randbytes(rng.randrange(0, 41)) for _ in range(3000)]
    keys += [b"", b"a", b'{"id":7}', b'{"k":"k000012-Z"}']
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]


def test_partition_of_a_key_is_the_default_partitioners() -> None:
    keys = [b'{"id":%d}' % i for i in range(500)]
    ours = [(h & 0x7FFFFFFF) % 6 for h in murmur2_many(keys).tolist()]
    assert ours == [DefaultPartitioner()(k, list(range(6)), list(range(6))) for k in keys]
