"""RowGroupFile: small pieces become one row group; a row group's worth is written at once."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from rayconnect.spark_bridge import row_groups
from rayconnect.spark_bridge.row_groups import RowGroupFile

SCHEMA = pa.schema([("offset", pa.int64()), ("value", pa.binary())])


def _piece(first: int, n: int) -> pa.Table:
    return pa.table(
        {"offset": list(range(first, first + n)), "value": [b"v%d" % i for i in range(n)]},
        schema=SCHEMA,
    )


def _write(path: str, pieces: list[pa.Table]) -> pq.ParquetFile:
    f = RowGroupFile(pq.ParquetWriter(path, SCHEMA))
    for p in pieces:
        f.write(p)
    f.close()
    return pq.ParquetFile(path)


def test_many_small_pieces_are_one_row_group_with_every_row_in_order(tmp_path) -> None:
    pieces = [_piece(i * 60, 60) for i in range(256)]  # a host's flush at 1,024 partitions
    written = _write(str(tmp_path / "f.parquet"), pieces)
    assert written.metadata.num_row_groups == 1
    assert written.read().column("offset").to_pylist() == list(range(256 * 60))


def test_a_row_groups_worth_is_written_when_reached_and_the_rest_at_close(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(row_groups, "ROW_GROUP_ROWS", 100)
    written = _write(str(tmp_path / "f.parquet"), [_piece(i * 60, 60) for i in range(5)])
    # 60 + 60 = 120 >= 100: one group; again 120; the last 60 at close
    sizes = [written.metadata.row_group(i).num_rows for i in range(written.metadata.num_row_groups)]
    assert sizes == [120, 120, 60]
    assert written.read().column("offset").to_pylist() == list(range(300))


def test_the_byte_bound_also_ends_a_row_group(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(row_groups, "ROW_GROUP_BYTES", 1)
    written = _write(str(tmp_path / "f.parquet"), [_piece(0, 10), _piece(10, 10)])
    assert written.metadata.num_row_groups == 2


def test_a_file_with_no_rows_closes_as_a_valid_empty_file(tmp_path) -> None:
    written = _write(str(tmp_path / "f.parquet"), [])
    assert written.metadata.num_rows == 0
    assert written.schema_arrow == SCHEMA
