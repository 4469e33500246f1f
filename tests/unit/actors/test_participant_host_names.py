"""Which participant host holds a partition: a pure function of its key, so the coordinator,
the readers, the enumerator and a restarted host agree without asking anyone."""

from __future__ import annotations

import pytest

import rayconnect as rc
from rayconnect.actors import names
from rayconnect.actors.participant_host import hosts_of
from rayconnect.config.sink import DEFAULT_PARTITIONS_PER_HOST
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
