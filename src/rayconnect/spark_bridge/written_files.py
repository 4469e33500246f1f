"""The files a write made, from the (group, path) rows its tasks return: the rows' schema
and each group's ``DataFile``s, described from the Parquet footers, ready to commit.

Exactly-once of the files: the files of a write are the ones the job's *result* names, never
a directory listing. A failed task attempt (or one Spark re-ran) may leave a file behind; no
result names it, nothing commits it, and vacuum removes it with the staging folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pyarrow as pa

from rayconnect.formats.settings import DEAD_LETTER_DIR
from rayconnect.protocol.types import DataFile
from rayconnect.spark_bridge.task_files import GROUP_COLUMN
from rayconnect.spark_bridge.task_writes import RoutedWrite
from rayconnect.storage.location import TableLocation
from rayconnect.tables.files import describe_file

#: What a write task returns: one row per file it wrote.
RESULT_SCHEMA = pa.schema([pa.field(GROUP_COLUMN, pa.int32()), pa.field("path", pa.string())])
#: A routed write's: the route table of each file too (null: the sink's own, unrouted records).
ROUTED_RESULT_SCHEMA = RESULT_SCHEMA.append(pa.field("table", pa.string()))


def result_batch(written: Sequence[tuple[Any, ...]], routed: bool = False) -> pa.RecordBatch:
    """(group, path) rows; a routed write's (group, path, table) rows."""
    columns = [
        pa.array([w[0] for w in written], pa.int32()),
        pa.array([w[1] for w in written], pa.string()),
    ]
    if not routed:
        return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)
    tables = pa.array([w[2] for w in written], pa.string())
    return pa.RecordBatch.from_arrays([*columns, tables], schema=ROUTED_RESULT_SCHEMA)


def group_files(
    location: TableLocation,
    routing: RoutedWrite | None,
    staging_rel: str,
    written: Sequence[tuple[Any, ...]],
    n_groups: int,
    keys: Sequence[str | None] | None,
) -> tuple[list[list[DataFile]], tuple[str, ...]]:
    """Each group's files from a write's (group, path) rows - a routed write's (group,
    path, table) rows - whether Spark's tasks or this process wrote them; and the route
    tables whose schema a file changes (the writer reads those again)."""
    if routing is None:
        return _describe_files(location, staging_rel, list(written), n_groups, keys), ()
    return _describe_routed(location, routing, staging_rel, list(written), n_groups, keys)


def _describe_routed(
    location: TableLocation,
    routing: RoutedWrite,
    staging_rel: str,
    written: list[tuple[int, str, str | None]],
    n_groups: int,
    keys: Sequence[str | None] | None,
) -> tuple[list[list[DataFile]], tuple[str, ...]]:
    """``_describe_files`` of a routed write, table by table: each file names its table
    and always the partitions whose rows it holds (``shared_by``): the committer moves a
    table's offsets for exactly those (``tables.table_set``)."""
    files: list[list[DataFile]] = [[] for _ in range(n_groups)]
    changes: list[str] = []
    for name in sorted({t for _, _, t in written}, key=lambda t: t or ""):
        where = location if name is None else routing.locate(name)
        ours = [(g, rel) for g, rel, t in written if t == name]
        schemas: list[pa.Schema] = []
        described = _describe_files(
            where, staging_rel, ours, n_groups, keys, always_keys=True, schemas=schemas
        )
        if name is not None and any(changes_schema(s, routing.schemas.get(name)) for s in schemas):
            changes.append(name)
        for group, its_files in enumerate(described):
            files[group] += [msgspec.structs.replace(f, table=name) for f in its_files]
    return files, tuple(changes)


def changes_schema(file_schema: pa.Schema, table_schema: pa.Schema | None) -> bool:
    """Whether a file of a table brings it what its schema lacks (the commit evolves it),
    or the table is not made yet. Partition columns that are only in the file's folder
    names are no change."""
    if table_schema is None:
        return True
    for f in file_schema:
        i = table_schema.get_field_index(f.name)
        if i < 0 or table_schema.field(i).type != f.type:
            return True
    return False


def _describe_files(
    location: TableLocation,
    staging_rel: str,
    written: list[tuple[int, str]],
    n_groups: int,
    keys: Sequence[str | None] | None = None,
    always_keys: bool = False,
    schemas: list[pa.Schema] | None = None,
) -> list[list[DataFile]]:
    """Each group's files, from the job's result (never a listing: see the module doc).
    A file several groups share is described once and names their ``keys`` (``shared_by``).
    ``schemas``: gets the data files' schemas (read with their footers anyway)."""
    files: list[list[DataFile]] = [[] for _ in range(n_groups)]
    filesystem = location.filesystem()
    groups_of: dict[str, list[int]] = {}
    for group, rel in sorted(written):
        groups_of.setdefault(rel, []).append(group)
    for rel, groups in groups_of.items():
        # dead-letter files come with their path from the table root
        dead = rel.startswith(DEAD_LETTER_DIR + "/")
        full = rel if dead else f"{staging_rel}/{rel}"
        data_file, file_schema = describe_file(location, full, filesystem, dead_letters=dead)
        if schemas is not None and not dead:
            schemas.append(file_schema)
        if len(groups) > 1 or always_keys:
            if keys is None or any(keys[g] is None for g in groups):
                raise AssertionError(f"{rel} holds groups {groups} without partition keys")
            shared_by = tuple(sorted({k for g in groups if (k := keys[g]) is not None}))
            data_file = msgspec.structs.replace(data_file, shared_by=shared_by)
        for group in groups:
            files[group].append(data_file)
    return files
