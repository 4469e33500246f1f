"""Metadata services (rayconnect.metadata): the file service, subscription, cluster merging,
and the static service through the same protocol."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import msgspec
import pytest

from rayconnect.metadata import (
    FileMetadataService,
    KafkaMetadataService,
    MetadataError,
    MetadataFileError,
    SingleClusterMetadataService,
    StaticMetadataService,
    clusters_of,
    poll_service,
    select_streams,
    streams_of_topics,
)
from rayconnect.protocol.types import ClusterMetadata, KafkaStream

YAML = """\
streams:
  - stream_id: orders
    clusters:
      east: {bootstrap_servers: "127.0.0.1:9092", topics: [orders]}
      west: {bootstrap_servers: "127.0.0.1:9093", topics: [orders, orders-eu], properties: {security.protocol: PLAINTEXT}}
"""

ORDERS = KafkaStream(
    "orders",
    {
        "east": ClusterMetadata("127.0.0.1:9092", ("orders",)),
        "west": ClusterMetadata(
            "127.0.0.1:9093", ("orders", "orders-eu"), {"security.protocol": "PLAINTEXT"}
        ),
    },
)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- FileMetadataService -------------------------------------------------------------------


def test_yaml_file(tmp_path: Path) -> None:
    service = FileMetadataService(str(write(tmp_path / "streams.yaml", YAML)))
    assert service.get_all_streams() == (ORDERS,)
    assert service.describe_streams(["orders", "nope"]) == {"orders": ORDERS}
    assert service.is_cluster_active("west") and not service.is_cluster_active("north")
    assert service.last_error is None and service.last_good_at is not None
    assert isinstance(service, KafkaMetadataService)


@pytest.mark.parametrize("name", ["streams.json", "streams.conf"])
def test_json_file_by_extension_or_content(tmp_path: Path, name: str) -> None:
    doc = {"streams": [msgspec.to_builtins(ORDERS)]}
    service = FileMetadataService(str(write(tmp_path / name, json.dumps(doc))))
    assert service.get_all_streams() == (ORDERS,)


def test_property_values_may_be_yaml_scalars(tmp_path: Path) -> None:
    text = (
        "streams: [{stream_id: s, clusters: {c: {bootstrap_servers: 'h:1', topics: [t],"
        " properties: {metadata.max.age.ms: 5000, ssl.check.hostname: false}}}}]"
    )
    [stream] = FileMetadataService(str(write(tmp_path / "m.yaml", text))).get_all_streams()
    assert stream.clusters["c"].properties == {
        "metadata.max.age.ms": "5000",
        "ssl.check.hostname": "false",
    }


def test_edit_is_picked_up(tmp_path: Path) -> None:
    path = write(tmp_path / "streams.yaml", YAML)
    service = FileMetadataService(str(path))
    assert service.refresh() is True
    assert service.refresh() is False  # same content: not decoded again
    write(path, YAML.replace("topics: [orders]}", "topics: [orders, returns]}"))
    assert service.get_all_streams()[0].clusters["east"].topics == ("orders", "returns")


def test_malformed_edit_keeps_last_good_and_names_file_and_field(tmp_path: Path) -> None:
    path = write(tmp_path / "streams.yaml", YAML)
    service = FileMetadataService(str(path))
    service.refresh()
    good_at = service.last_good_at
    write(path, YAML.replace("topics: [orders]}", "topics: orders}"))
    assert service.get_all_streams() == (ORDERS,)  # last good stays in force
    assert service.last_error is not None
    assert str(path) in service.last_error
    assert "`$.streams[0].clusters.east.topics`" in service.last_error
    assert service.last_good_at == good_at
    write(path, YAML)  # fixed: the error clears
    assert service.get_all_streams() == (ORDERS,) and service.last_error is None


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            "streams: [{stream_id: s, clusters: {c: {bootstrap_servers: h, topics: [a/b]}}}]",
            "$.streams[0].clusters.c.topics[0]",
            "invalid topic",
        ),
        (
            "streams: [{stream_id: s, clusters: {'c/x': {bootstrap_servers: h, topics: [t]}}}]",
            "$.streams[0].clusters.c/x",
            "invalid cluster id",
        ),
        (
            "streams: [{stream_id: s, clusters: {c: {bootstrap_servers: h, topic: [t]}}}]",
            "$.streams[0].clusters.c",
            "unknown field `topic`",
        ),
        (
            "streams: [{stream_id: s, clusters: {c: {bootstrap_servers: '', topics: [t]}}}]",
            "$.streams[0].clusters.c.bootstrap_servers",
            "empty",
        ),
        (
            "streams: [{stream_id: s, clusters: {c: {bootstrap_servers: h, topics: []}}}]",
            "$.streams[0].clusters.c.topics",
            "at least one topic",
        ),
        (
            "streams: [{stream_id: s, clusters: {c: {bootstrap_servers: h, topics: [t],"
            " properties: {fetch.max.bytes: '1'}}}}]",
            "$.streams[0].clusters.c.properties",
            "not a supported",
        ),
        (
            "streams: [{stream_id: s, clusters: {}}]",
            "$.streams[0].clusters",
            "at least one cluster",
        ),
        (
            "streams: [{stream_id: s, clusters: {c: {bootstrap_servers: h, topics: [t]}}},"
            " {stream_id: s, clusters: {c: {bootstrap_servers: h, topics: [t]}}}]",
            "$.streams[1].stream_id",
            "duplicate",
        ),
        ("streams: [{clusters: {}}]", "$.streams[0]", "missing required field `stream_id`"),
        ("[1, 2]", "$", "Expected `object`"),
        ("streams: [{", "$", "not valid YAML"),
    ],
)
def test_bad_files_are_reported_with_the_field_path(
    tmp_path: Path, text: str, field: str, words: str
) -> None:
    path = write(tmp_path / "bad.yaml", text)
    service = FileMetadataService(str(path))
    with pytest.raises(MetadataFileError) as info:
        service.get_all_streams()  # nothing good yet: raises
    assert info.value.field == field and info.value.file == str(path)
    assert words in str(info.value)
    assert service.last_error == str(info.value)


def test_missing_file_without_last_good_raises_and_with_it_does_not(tmp_path: Path) -> None:
    path = tmp_path / "streams.yaml"
    service = FileMetadataService(str(path))
    with pytest.raises(MetadataError, match="cannot read"):
        service.get_all_streams()
    write(path, YAML)
    assert service.get_all_streams() == (ORDERS,)
    path.unlink()
    assert service.get_all_streams() == (ORDERS,)
    assert "cannot read" in (service.last_error or "")
    write(path, YAML)  # back with the same content: the error clears
    assert service.get_all_streams() == (ORDERS,) and service.last_error is None


def test_file_service_travels_as_its_path(tmp_path: Path) -> None:
    service = FileMetadataService(str(write(tmp_path / "streams.yaml", YAML)))
    service.refresh()
    copy = pickle.loads(pickle.dumps(service))
    assert copy == service and copy.get_all_streams() == (ORDERS,)
    assert msgspec.json.decode(msgspec.json.encode(service), type=FileMetadataService) == service
    with pytest.raises(MetadataError):
        FileMetadataService("")


async def test_poll_service_shapes(tmp_path: Path) -> None:
    path = write(tmp_path / "streams.yaml", YAML)
    service = FileMetadataService(str(path))
    assert await poll_service(service) == ((ORDERS,), None)
    write(path, "streams: [")
    streams, warning = await poll_service(service)
    assert streams == (ORDERS,) and warning and "not valid YAML" in warning
    broken = FileMetadataService(str(tmp_path / "absent.yaml"))
    streams, error = await poll_service(broken)
    assert streams is None and error and error.startswith("MetadataFileError")
    static = StaticMetadataService((ORDERS,))
    assert await poll_service(static) == ((ORDERS,), None)


# -- StaticMetadataService through the protocol --------------------------------------------


def test_static_service_satisfies_the_protocol() -> None:
    static = StaticMetadataService((ORDERS,))
    assert isinstance(static, KafkaMetadataService)
    assert clusters_of(select_streams(static.get_all_streams(), ["orders"]))["east"].topics == (
        "orders",
    )


# -- select_streams / clusters_of ------------------------------------------------------------


def s(stream_id: str, **clusters: tuple[str, ...]) -> KafkaStream:
    return KafkaStream(stream_id, {c: ClusterMetadata(f"{c}:9092", t) for c, t in clusters.items()})


STREAMS = (s("orders", a=("o",)), s("orders-archive", a=("oa",)), s("pay", b=("p",)))


def test_select_by_ids_pattern_both_or_neither() -> None:
    ids = lambda sel: [x.stream_id for x in sel]  # noqa: E731
    assert ids(select_streams(STREAMS)) == ["orders", "orders-archive", "pay"]
    assert ids(select_streams(STREAMS, ["pay", "ghost"])) == ["pay"]
    assert ids(select_streams(STREAMS, stream_pattern="orders")) == ["orders"]  # fullmatch
    assert ids(select_streams(STREAMS, stream_pattern="orders.*")) == ["orders", "orders-archive"]
    assert ids(select_streams(STREAMS, ["pay"], "orders")) == ["orders", "pay"]
    assert select_streams(STREAMS, []) == ()


def test_clusters_of_merges_topics_and_properties() -> None:
    one = KafkaStream("x", {"a": ClusterMetadata("h:1", ("t1", "t2"), {"client.id": "c"})})
    two = KafkaStream(
        "y",
        {
            "a": ClusterMetadata("h:1", ("t2", "t3"), {"security.protocol": "SSL"}),
            "b": ClusterMetadata("h:2", ("u",)),
        },
    )
    merged = clusters_of([one, two])
    assert merged == {
        "a": ClusterMetadata(
            "h:1", ("t1", "t2", "t3"), {"client.id": "c", "security.protocol": "SSL"}
        ),
        "b": ClusterMetadata("h:2", ("u",)),
    }
    assert clusters_of([]) == {}


def test_clusters_of_rejects_two_addresses_or_clashing_properties() -> None:
    one = KafkaStream("x", {"a": ClusterMetadata("h:1", ("t",), {"sasl.plain.password": "s1"})})
    other_host = KafkaStream("y", {"a": ClusterMetadata("h:9", ("t",))})
    with pytest.raises(MetadataError, match="streams 'x' and 'y'.*two bootstrap addresses"):
        clusters_of([one, other_host])
    other_secret = KafkaStream(
        "y", {"a": ClusterMetadata("h:1", ("t",), {"sasl.plain.password": "s2"})}
    )
    with pytest.raises(MetadataError, match="sasl.plain.password") as info:
        clusters_of([one, other_secret])
    assert "s1" not in str(info.value) and "s2" not in str(info.value)  # never echo secrets


# -- SingleClusterMetadataService without a broker ---------------------------------------------


def test_single_cluster_streams_of_topics() -> None:
    cluster = ClusterMetadata("h:1", (), {"client.id": "x"})
    streams = streams_of_topics(
        ["b", "a", "__consumer_offsets", "_schemas", "a.b-c"], "main", cluster
    )
    assert [x.stream_id for x in streams] == ["a", "a.b-c", "b"]
    assert streams[0].clusters == {"main": ClusterMetadata("h:1", ("a",), {"client.id": "x"})}
    assert [x.stream_id for x in streams_of_topics(["ab", "abc"], "m", cluster, "ab")] == ["ab"]


def test_single_cluster_needs_a_refresh_and_validates() -> None:
    service = SingleClusterMetadataService("h:1")
    with pytest.raises(MetadataError, match="refresh"):
        service.get_all_streams()
    assert not service.is_cluster_active("default")
    for kwargs in (
        {"bootstrap_servers": ""},
        {"cluster_id": "a/b"},
        {"topic_pattern": "("},
        {"properties": {"nope": "1"}},
    ):
        with pytest.raises(MetadataError):
            SingleClusterMetadataService(**{"bootstrap_servers": "h:1", **kwargs})  # type: ignore[arg-type]
    secret = SingleClusterMetadataService("h:1", properties={"sasl.plain.password": "hunter2"})
    assert "hunter2" not in repr(secret)


def test_source_wide_properties_reach_every_cluster_under_its_own() -> None:
    import rayconnect as rc

    meta = rc.StaticMetadataService(
        [
            rc.KafkaStream(
                "s",
                {
                    "a": rc.ClusterMetadata("h:1", ("t",)),
                    "b": rc.ClusterMetadata("h:2", ("t",), {"security.protocol": "SSL"}),
                },
            )
        ]
    )
    source = rc.KafkaSource(meta, properties={"security.protocol": "SASL_SSL", "client.id": "rc"})
    clusters = source.clusters()
    assert clusters["a"].properties == {"security.protocol": "SASL_SSL", "client.id": "rc"}
    assert clusters["b"].properties == {"security.protocol": "SSL", "client.id": "rc"}
