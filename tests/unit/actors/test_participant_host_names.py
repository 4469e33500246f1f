"""Which participant host holds a partition: a pure function of its key, so the coordinator,
the readers, the enumerator and a restarted host agree without asking anyone."""

from __future__ import annotations

from typing import Any

import pytest

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.actors.participant_host import hosts_of
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST, SinkPipelineConfig
from rayconnect.errors import ConfigError


def test_a_host_holds_a_run_of_partitions_per_host_partitions_of_one_topic() -> None:
    assert names.participant_host("p", "local/orders/0", 64) == "p/participants/local/orders/0"
    assert names.participant_host("p", "local/orders/63", 64) == "p/participants/local/orders/0"
    assert names.participant_host("p", "local/orders/64", 64) == "p/participants/local/orders/1"
    assert names.participant_host("p", "local/orders/5", 1) == "p/participants/local/orders/5"
    assert names.role_of(names.participant_host("p", "a/t/3", 2)) == "participants"


def test_a_cluster_id_with_a_slash_keeps_its_partitions_together() -> None:
    assert names.participant_host("p", "eu/west/t/70", 64) == "p/participants/eu/west/t/1"


def test_hosts_of_groups_keys_by_host_in_order() -> None:
    keys = [f"c/a/{i}" for i in range(5)] + ["c/b/0"]
    assert hosts_of("p", keys, 2) == {
        "p/participants/c/a/0": ["c/a/0", "c/a/1"],
        "p/participants/c/a/1": ["c/a/2", "c/a/3"],
        "p/participants/c/a/2": ["c/a/4"],
        "p/participants/c/b/0": ["c/b/0"],
    }


def test_partitions_per_host_below_one_is_a_config_error() -> None:
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("s", {"c": rc.ClusterMetadata("127.0.0.1:9092", ("t",))}),)
    )
    with pytest.raises(ConfigError, match="partitions_per_host"):
        rc.SinkPipeline("p", rc.KafkaSource(meta), rc.DeltaSink("/tmp/x"), partitions_per_host=0)
    pipeline = rc.SinkPipeline("p", rc.KafkaSource(meta), rc.DeltaSink("/tmp/x"))
    assert pipeline.config.partitions_per_host == DEFAULT_PARTITIONS_PER_HOST


def test_topic_groups_put_many_topics_in_few_hosts_by_a_stable_hash() -> None:
    keys = [f"c/t{i:03d}/{p}" for i in range(200) for p in range(4)]
    hosts = hosts_of("p", keys, DEFAULT_PARTITIONS_PER_HOST, topic_groups=4)
    assert sorted(hosts) == [f"p/participants/c/g{g}/0" for g in range(4)]
    assert sorted(k for held in hosts.values() for k in held) == sorted(keys)
    # a topic's partitions stay together; crc32 is the same in every process
    assert names.participant_host("p", "c/t007/3", 256, 4) == names.participant_host(
        "p", "c/t007/0", 256, 4
    )
    assert names.participant_host("p", "c/orders/0", 256, 4) == "p/participants/c/g2/0"
    assert names.participant_host("p", "c/orders/300", 256, 4) == "p/participants/c/g2/1"


def _config(topics: int, partitions: int, **settings: Any) -> SinkPipelineConfig:
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("s", {"c": rc.ClusterMetadata("127.0.0.1:9092", ("t",))}),)
    )
    config = rc.SinkPipeline("p", rc.KafkaSource(meta), rc.DeltaSink("/tmp/x"), **settings).config
    keys = [f"c/t{i}/{p}" for i in range(topics) for p in range(partitions)]
    return config.with_topic_groups(keys)


def test_start_groups_topics_only_when_there_are_many_and_keeps_a_setting() -> None:
    assert _config(16, 64).topic_groups is None  # a host per topic, as before
    assert _config(200, 4).topic_groups == 4  # 800 partitions: 4 hosts of ~200
    assert _config(20, 4).topic_groups == 1  # 80 partitions: one host
    assert _config(200, 4, partitions_per_host=100).topic_groups == 8
    assert _config(200, 4, topic_groups=10).topic_groups == 10
    assert _config(2, 4, topic_groups=3).topic_groups == 3
    with pytest.raises(ConfigError, match="topic_groups"):
        _config(1, 1, topic_groups=0)
