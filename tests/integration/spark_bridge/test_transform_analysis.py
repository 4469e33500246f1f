"""A transform is analysed by a real local Spark in a child process before any actor
starts: its output schema becomes the table's, and a wrong statement is a ConfigError
naming what Spark found."""

from __future__ import annotations

import pyarrow as pa
import pytest

import rayconnect as rc
from rayconnect.errors import ConfigError
from rayconnect.formats.settings import RecordFormat
from rayconnect.formats.transform import analysed

pytestmark = pytest.mark.timeout(300)

DECLARED = {"name": "string", "amount": "long", "ts": "timestamp"}


def test_the_output_schema_of_a_row_wise_statement() -> None:
    fmt = RecordFormat(
        value_format="json",
        value_schema=DECLARED,
        transform="SELECT *, upper(name) AS loud, to_date(ts) AS day FROM records WHERE amount > 0",
    )
    out = analysed(fmt).transform_output()
    assert out is not None
    assert out.names[:5] == [
        "_kafka_cluster",
        "_kafka_topic",
        "_kafka_partition",
        "_kafka_offset",
        "_kafka_timestamp",
    ]
    assert out.field("_kafka_partition").type == pa.int32()
    assert out.field("loud").type == pa.string()
    assert out.field("day").type == pa.date32()
    assert out.field("ts").type == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT name FROM records", r"must keep \['_kafka_cluster'"),
        # (an unknown column is also what the start test below refuses)
        pytest.param("SELECT *, nope FROM records", "UNRESOLVED_COLUMN", marks=pytest.mark.slow),
        pytest.param("SELEC * FROM records", "PARSE_SYNTAX_ERROR", marks=pytest.mark.slow),
    ],
)
def test_a_wrong_statement_is_a_config_error(sql: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=f"transform: .*{reason}"):
        analysed(RecordFormat(value_format="json", value_schema=DECLARED, transform=sql))


def test_start_refuses_a_wrong_statement_before_any_actor(tmp_path) -> None:
    meta = rc.StaticMetadataService(
        (rc.KafkaStream("s", {"c": rc.ClusterMetadata("127.0.0.1:1", ("t",))}),)
    )
    pipeline = rc.SinkPipeline(
        "sql-check",
        rc.KafkaSource(meta, value_format="string"),
        rc.DeltaSink(str(tmp_path / "t"), partition_by=("day",)),
        transform="SELECT *, to_date(valu) AS day FROM records",
    )
    with pytest.raises(ConfigError, match="transform: .*`valu`"):
        pipeline.start()
    assert not (tmp_path / "t").exists()
