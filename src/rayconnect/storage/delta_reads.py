"""Reading a Delta table's rows through pyarrow's own filesystems, never deltalake's Python one.

Why: ``DeltaTable.to_pyarrow_dataset``/``to_pyarrow_table`` default to a pyarrow
``PyFileSystem`` whose files are Python objects (deltalake's ``DeltaStorageHandler``, Rust
behind PyO3). Arrow's IO threads then read those files, and free the buffers they returned,
each time taking the GIL. When one of them does so while the interpreter finalizes (a
read-ahead still in flight after ``head()`` or an abandoned batch iterator, a buffer the
parquet reader's range cache frees late, even after a full ``to_pyarrow_table()``), CPython
3.11 ends that thread with ``pthread_exit``. Its forced unwind then crosses a C++ noexcept
destructor (``arrow::py::PyBuffer::~PyBuffer``: std::terminate, SIGABRT, exit 134) or Rust
frames (SIGSEGV, exit 139), or arrow's thread pool waits at exit for the thread for ever (a
hang). Cores and the numbers are in bench/results/exit_crashes.md; with pyarrow's native
Local/S3 filesystems no IO thread ever holds a Python object, and the crash is gone.

A table with deletion vectors (a merge-on-read upsert table) is refused by both pyarrow
readers of deltalake 1.6.6; it is read through delta-rs's own query engine
(``QueryBuilder``), which applies them and does its IO in Rust.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rayconnect.storage.location import TableLocation

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pds
    from deltalake import DeltaTable

__all__ = ["delta_dataset", "reads_deletion_vectors", "read_delta", "table_filesystem"]


def table_filesystem(location: TableLocation) -> Any:
    """A pyarrow filesystem rooted at the table (what deltalake's readers take as
    ``filesystem``): the store's native filesystem under the table's path."""
    from pyarrow import fs

    return fs.SubTreeFileSystem(location.path(), location.filesystem())


def delta_dataset(table: DeltaTable, location: TableLocation) -> pds.Dataset:
    """``table.to_pyarrow_dataset()`` read through the store's native filesystem;
    ``location`` is where ``table`` is, with its storage options. A table with deletion
    vectors: its live rows, read whole (``with_deletion_vectors``)."""
    if reads_deletion_vectors(table):
        import pyarrow.dataset as pds

        return pds.dataset(with_deletion_vectors(table))
    return table.to_pyarrow_dataset(filesystem=table_filesystem(location))


def reads_deletion_vectors(table: DeltaTable) -> bool:
    """Readers must apply deletion vectors (the reader feature is on)."""
    return "deletionVectors" in (table.protocol().reader_features or [])


def with_deletion_vectors(table: DeltaTable, columns: Sequence[str] | None = None) -> pa.Table:
    """The live rows of ``table`` (``columns`` only, if given), deletion vectors applied."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    names = ", ".join(f'"{c}"' for c in columns) if columns is not None else "*"
    query = QueryBuilder().register("t", table).execute(f"SELECT {names} FROM t")
    return pa.table(query.read_all())


def read_delta(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    columns: Sequence[str] | None = None,
    version: int | None = None,
) -> pa.Table:
    """Every row of the Delta table at ``uri`` (``columns`` only, if given)."""
    from deltalake import DeltaTable

    options = dict(storage_options) if storage_options else None
    table = DeltaTable(uri, version=version, storage_options=options)
    location = TableLocation.parse(uri, options)
    if reads_deletion_vectors(table):
        return with_deletion_vectors(table, columns)
    return table.to_pyarrow_table(
        columns=list(columns) if columns is not None else None,
        filesystem=table_filesystem(location),
    )
