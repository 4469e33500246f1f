"""One object per host per fetch: the pieces put together, the handles resolved back to each
piece's rows, each object fetched once (a store of plain dicts stands in for Ray's)."""

from __future__ import annotations

import pyarrow as pa

from rayconnect.spark_bridge.blocks import Rows, put_together, resolve


def _batch(partition: int, first: int, n: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(first, first + n), pa.int64()),
            "value": pa.array([b"v%d" % i for i in range(first, first + n)], pa.binary()),
        }
    )


class _Store:
    """Objects by name; counts puts and fetches."""

    def __init__(self) -> None:
        self.objects: dict[str, pa.RecordBatch] = {}
        self.fetches: list[list[str]] = []

    def put(self, batch: pa.RecordBatch) -> str:
        ref = f"obj{len(self.objects)}"
        self.objects[ref] = batch
        return ref

    def fetch(self, refs: list[str]) -> list[pa.RecordBatch]:
        self.fetches.append(refs)
        return [self.objects[r] for r in refs]


def test_a_hosts_pieces_go_as_one_object_and_each_handle_names_its_rows() -> None:
    store = _Store()
    big = _batch(1, 100, 1000)
    pieces = [_batch(0, 0, 5), big.slice(10, 3), _batch(2, 7, 4)]
    handles = put_together(pieces, put=store.put)
    assert list(store.objects) == ["obj0"]
    assert handles == [Rows("obj0", 0, 5), Rows("obj0", 5, 3), Rows("obj0", 8, 4)]
    obj = store.objects["obj0"]
    assert obj.num_rows == 12
    # a copy: the slice of the big batch does not carry the big batch's buffers along
    assert obj.get_total_buffer_size() < big.get_total_buffer_size() / 10
    tables = resolve(handles, fetch=store.fetch)
    assert [t.to_pylist() for t in tables] == [p.to_pylist() for p in pieces]
    assert store.fetches == [["obj0"]]


def test_a_lone_whole_batch_goes_as_it_is_and_a_lone_slice_is_copied_out() -> None:
    store = _Store()
    whole = _batch(0, 0, 50)
    assert put_together([whole], whole=True, put=store.put) == [Rows("obj0", 0, 50)]
    assert store.objects["obj0"] is whole
    big = _batch(1, 0, 1000)
    assert put_together([big.slice(900, 100)], put=store.put) == [Rows("obj1", 0, 100)]
    assert store.objects["obj1"].get_total_buffer_size() < big.get_total_buffer_size() / 5
    assert store.objects["obj1"].to_pylist() == big.slice(900, 100).to_pylist()


def test_resolve_fetches_each_object_once_and_keeps_what_it_fetched() -> None:
    store = _Store()
    a = put_together([_batch(0, 0, 3), _batch(1, 0, 2)], put=store.put)
    plain = store.put(_batch(3, 0, 6))  # a ref to a whole batch (tests, table upkeep)
    fetched: dict = {}
    first = resolve([a[1], plain, a[0]], fetched, store.fetch)
    assert [t.column("partition")[0].as_py() for t in first] == [1, 3, 0]
    assert [t.num_rows for t in first] == [2, 6, 3]
    assert all(isinstance(t, pa.Table) for t in first)
    assert store.fetches == [["obj0", "obj1"]]
    again = resolve([a[0], a[1]], fetched, store.fetch)  # a Spark task's next batch
    assert store.fetches == [["obj0", "obj1"]]
    assert [t.to_pylist() for t in again] == [first[2].to_pylist(), first[0].to_pylist()]
