"""The rules of ``transform`` that need no Spark: which formats may have one, the
``records`` view's columns, rows back to their partitions, and a write's groups split so
that no partition has two groups in one job."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rayconnect.errors import ConfigError
from rayconnect.formats.rows import kafka_schema
from rayconnect.formats.settings import RecordFormat
from rayconnect.formats.transform import records_schema, row_keys
from rayconnect.spark_bridge.group_order import distinct_key_layers

SQL = "SELECT * FROM records"


@pytest.mark.parametrize(
    "fmt",
    [
        {"value_format": "json"},  # inferred: columns unknown before start
        {"value_format": "raw"},
    ],
)
def test_a_transform_needs_columns_known_before_start(fmt: dict) -> None:
    with pytest.raises(ConfigError, match="transform needs rows whose columns are known"):
        RecordFormat(**fmt, transform=SQL)


def test_an_empty_transform_is_refused() -> None:
    with pytest.raises(ConfigError, match="transform is empty"):
        RecordFormat(value_format="string", transform="  ")


def test_records_are_the_coordinates_and_the_declared_columns_without_partitions() -> None:
    fmt = RecordFormat(
        value_format="json",
        value_schema={"id": "long", "at": "timestamp"},
        include_key=True,
        transform=SQL,
        partition_by=("day=day(at)",),
    )
    coordinates = kafka_schema(fmt).names
    assert coordinates[-1] == "_kafka_key"
    assert records_schema(fmt).names == [*coordinates, "id", "at"]  # no derived "day"


def test_row_keys_name_partitions_as_groups_do() -> None:
    rows = pa.table(
        {
            "_kafka_cluster": ["c", "c", "d"],
            "_kafka_topic": ["t", "t", "u"],
            "_kafka_partition": pa.array([0, 1, 7], pa.int32()),
        }
    )
    assert row_keys(rows).to_pylist() == ["c/t/0", "c/t/1", "d/u/7"]


def test_groups_of_one_partition_go_to_different_layers_in_order() -> None:
    a, b, c, d = ["r1"], ["r2"], ["r3"], ["r4"]
    layers = distinct_key_layers([a, b, [], c, d], ["p0", "p1", "p2", "p0", "p0"])
    assert layers == [[a, b, [], [], []], [[], [], [], c, []], [[], [], [], [], d]]
    assert distinct_key_layers([a, b], ["p0", "p1"]) == [[a, b]]
