"""Commit staged Parquet files and Kafka offsets to an Iceberg table in ONE snapshot (pyiceberg).

Where the offsets live. Every commit of a pipeline is one snapshot whose summary holds
``rayconnect.<pipeline>.offset.<key>`` (the next offset of each partition of the round) and
``rayconnect.<pipeline>.epoch``. The same commit mirrors all the pipeline's offsets (one JSON)
and its epoch into table properties, in the same metadata file: a reader needs the current
metadata only, however many snapshots were expired or written by others since.

Fencing (I3) and compare-and-set (I2):

- The catalog swaps the table's metadata pointer only if it is still the one the commit was
  built on (the SQL catalog: ``UPDATE ... WHERE metadata_location = <read>``), and every commit
  of ours is a snapshot, so it carries ``AssertRefSnapshotId(main)``: of two commits built on
  the same snapshot exactly one lands.
- pyiceberg *retries* a failed append by rebasing it onto the new snapshot (4 times by
  default): a stale coordinator's round would then land on top of the newer one's - the
  duplicates Iceberg's own Kafka sink is known for. The table is created with
  ``commit.retry.num-retries=0`` and every commit checks that it still is.
- ``commit`` reads the table, checks the epoch and the offsets against what the round started
  from, then commits on exactly that read: a claim or commit in between fails the swap.
- ``claim_epoch`` is a snapshot too (no files), so it conflicts with a racing commit instead
  of slipping in beside it (a property-only commit carries no snapshot requirement).

Typed tables (a ``RecordFormat`` other than raw): the table is created from the format's
first schema with a partition spec from ``partition_by`` (``day``/``hour``/``identity``
transforms; files carry the source columns, the table reads each file's partition from their
statistics). A round's files that bring new fields add them as optional columns through an
Iceberg schema update in the SAME metadata commit as the files (Delta needs two versions);
narrower ints and floats in a file read as the table's wider type. Bad records go to a
dead-letter table ``<name>_dead_letters`` in the table's folder, committed first and deduped
by its own offsets (``tables.dead_letters``).

Upkeep: every ``MAINTAIN_EVERY`` commits, snapshots beyond the newest ``keep_snapshots`` are
expired; manifests are merged by the append itself (``commit.manifest-merge.enabled``) and old
metadata files dropped (``write.metadata.delete-after-commit.enabled``). Without these a
commit slows down with every round (notes: 47 -> 275 ms over 100 commits).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, assert_never

import pyarrow as pa
from pyarrow import fs

from rayconnect.config.rest_catalog import RestCatalog
from rayconnect.formats import evolution
from rayconnect.formats.evolution import normalize_type, schema_differences
from rayconnect.formats.partitioning import PartitionSpec
from rayconnect.formats.rows import DEAD_LETTER_SCHEMA, initial_schema, partition_specs
from rayconnect.formats.settings import DEAD_LETTER_DIR, RecordFormat, typed_format
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.storage.location import TableLocation, as_location
from rayconnect.tables.base import (
    CommitConflictError,
    SchemaMismatchError,
    TableCommitter,
    VersionWrite,
)
from rayconnect.tables.consistent_cut import CUT_LOOKBACK, recorded_cut
from rayconnect.tables.files import STAGING_DIR
from rayconnect.tables.iceberg_row_delta import row_delta
from rayconnect.write_modes.changes import Appended, RowDelta, Upserted
from rayconnect.write_modes.iceberg_upsert import upsert_round
from rayconnect.write_modes.modes import APPEND, WriteMode
from rayconnect.write_modes.row_delta import LiveFile

log = logging.getLogger(__name__)

NUM_RETRIES = "commit.retry.num-retries"
#: Table properties rayconnect creates an Iceberg table with (and checks on an existing one).
TABLE_PROPERTIES = {
    NUM_RETRIES: "0",  # never rebase a failed commit: that is how duplicates land
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "16",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
    "format-version": "2",
}
#: Properties that keep commits fast; an existing table's own values are kept.
_UPKEEP = set(TABLE_PROPERTIES) - {NUM_RETRIES, "format-version"}
MAINTAIN_EVERY = 20


class IcebergCommitter(TableCommitter):
    """Commits rounds of one pipeline to one Iceberg table; reads back its committed offsets.

    Not thread-safe; one per coordinator. ``catalog`` is pyiceberg catalog properties
    (``{"type": "sql", "uri": "sqlite:///...", "warehouse": ...}``) or a REST catalog's
    settings (``tables.iceberg_rest`` opens it); ``location`` is where
    the table keeps its files - the writer stages Parquet under it, so it is fixed when the
    table is created, and an existing table elsewhere is an error naming the setting.
    """

    def __init__(
        self,
        catalog: Mapping[str, str] | RestCatalog,
        identifier: str,
        location: str | TableLocation,
        pipeline: str,
        schema: pa.Schema = RAW_RECORD_SCHEMA,
        catalog_name: str = "rayconnect",
        keep_snapshots: int = 10,
        record_format: RecordFormat | None = None,
        apply: WriteMode = APPEND,
    ) -> None:
        self.apply = apply
        self.catalog_config = catalog if isinstance(catalog, RestCatalog) else dict(catalog)
        self.catalog_name = catalog_name
        self.identifier = identifier
        self.location = as_location(location)
        self.table_path = f"{identifier} at {self.location.uri}"
        self.pipeline = pipeline
        #: typed: the table's schema may grow (``formats.evolution``), never shrink
        typed = typed_format(record_format)
        self.typed = typed is not None
        self.schema = initial_schema(typed) if typed is not None else schema
        self.partition_by: list[PartitionSpec] = partition_specs(typed) if typed is not None else []
        self.keep_snapshots = keep_snapshots
        self._dead: IcebergCommitter | None = None
        if self.typed:
            # Bad records (errors: dead_letter): a table of their own in this one's folder.
            self._dead = IcebergCommitter(
                catalog,
                f"{identifier}_dead_letters",
                TableLocation(self.location.join(DEAD_LETTER_DIR), self.location.options),
                pipeline,
                DEAD_LETTER_SCHEMA,
                catalog_name,
                keep_snapshots,
            )
        self._catalog: Any = None
        self._table_obj: Any = None
        self._fs: Any = None
        self._commits = 0

    # -- keys ------------------------------------------------------------------------------

    @property
    def offsets_property(self) -> str:
        """Table property holding this pipeline's offsets (JSON: key -> next offset)."""
        return f"rayconnect.{self.pipeline}.offsets"

    @property
    def epoch_property(self) -> str:
        """Table property (and snapshot summary key) holding the coordinator epoch."""
        return f"rayconnect.{self.pipeline}.epoch"

    def summary_key(self, key: str) -> str:
        """Snapshot summary key of a partition's next offset."""
        return f"rayconnect.{self.pipeline}.offset.{key}"

    @property
    def dead_letter_table(self) -> IcebergCommitter | None:
        return self._dead

    def exists(self) -> bool:
        return bool(self.catalog().table_exists(self.identifier))

    # -- table -----------------------------------------------------------------------------

    @property
    def filesystem(self) -> Any:
        """The table location's pyarrow filesystem (made on first use)."""
        if self._fs is None:
            self._fs = self.location.filesystem()
        return self._fs

    def catalog(self) -> Any:
        """The pyiceberg catalog (made on first use; a local sqlite file's folder is made; a
        REST catalog checked as it opens)."""
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            # A table on S3: the store's endpoint and credentials, resolved here (options,
            # else this process's environment), unless the catalog's settings say otherwise.
            file_io = self.location.iceberg_properties()
            config = self.catalog_config
            if isinstance(config, RestCatalog):
                from rayconnect.tables.iceberg_rest import open_rest_catalog

                self._catalog = open_rest_catalog(config, self.catalog_name, file_io)
                return self._catalog
            uri = config.get("uri", "")
            if uri.startswith("sqlite:///"):
                os.makedirs(os.path.dirname(uri.removeprefix("sqlite:///")) or ".", exist_ok=True)
            self._catalog = load_catalog(self.catalog_name, **(file_io | config))
        return self._catalog

    def ensure_table(self) -> Any:
        """Create the table (all columns nullable, ``TABLE_PROPERTIES``) if missing; else
        check its location, schema and that failed commits are never retried."""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError

        catalog = self.catalog()
        namespace = self.identifier.rsplit(".", 1)[0]
        with contextlib.suppress(NamespaceAlreadyExistsError):
            catalog.create_namespace_if_not_exists(namespace)
        nullable = pa.schema([f.with_nullable(True) for f in self.schema])
        table = catalog.create_table_if_not_exists(
            self.identifier,
            schema=nullable,
            location=self.location.uri,
            properties=TABLE_PROPERTIES,
        )
        if _same_place(table.location()) != _same_place(self.location.uri):
            raise SchemaMismatchError(
                f"existing Iceberg table {self.identifier} is at {table.location()}, "
                f"not at sink.table_location {self.location.uri}"
            )
        problems = self._schema_problems(table)
        if problems:
            raise SchemaMismatchError(
                f"existing Iceberg table {self.identifier} has another schema: "
                f"{'; '.join(problems)}"
            )
        table = self._ensure_partition_spec(table)
        if table.properties.get(NUM_RETRIES) != "0":
            # A table made by someone else: rayconnect's commits must never be rebased.
            # The upkeep settings only where the owner set none.
            upkeep = {k: v for k, v in TABLE_PROPERTIES.items() if k in _UPKEEP}
            missing = {k: v for k, v in upkeep.items() if k not in table.properties}
            with table.transaction() as tx:
                tx.set_properties({NUM_RETRIES: "0"} | missing)
            table = catalog.load_table(self.identifier)
        self._table_obj = table
        return table

    def _schema_problems(self, table: Any) -> list[str]:
        """Why ``table``'s schema is not ours (a typed table's may have grown: it must only
        not contradict the columns we start from)."""
        if self.typed:
            return evolution.merge(_arrow_schema(table), self.schema)[1]
        return schema_differences(_arrow_schema(table), self.schema)

    def _spec_of(self, table: Any) -> list[tuple[str, str, str]]:
        """The table's partition spec as (name, transform, source column) triples."""
        schema = table.schema()
        return [
            (f.name, str(f.transform), schema.find_column_name(f.source_id))
            for f in table.spec().fields
        ]

    def _ensure_partition_spec(self, table: Any) -> Any:
        """Give a new table ``partition_by``'s spec; an existing one must have it already.

        A spec is set after creating the table (pyiceberg assigns the columns' ids on
        create, and a spec names them by id): a coordinator that died in between leaves an
        unpartitioned table without data, which the next one partitions."""
        want = [(p.name, p.transform, p.source) for p in self.partition_by]
        have = self._spec_of(table)
        if have == want:
            return table
        snapshot = table.current_snapshot()
        empty = snapshot is None or snapshot.summary.get("total-data-files", "0") == "0"
        if have or not empty:
            raise SchemaMismatchError(
                f"existing Iceberg table {self.identifier} is partitioned by {have}, "
                f"not by {want} (sink.partition_by)"
            )
        from pyiceberg.transforms import parse_transform

        with table.update_spec() as update:
            for name, transform, source in want:
                update.add_field(source, parse_transform(transform), name)
        return self.catalog().load_table(self.identifier)

    def _table(self) -> Any:
        """The table at its latest metadata, as a NEW object: a commit is built on the
        metadata its checks read, and ``Table.refresh()`` would change that metadata in
        place under it if another thread (reload, vacuum) refreshed meanwhile."""
        if self._table_obj is None:
            return self.ensure_table()
        return self.catalog().load_table(self.identifier)

    def load_current(self) -> Any:
        """The table at its latest metadata (a new object: upkeep builds on it)."""
        return self._table()

    def current_schema(self) -> pa.Schema:
        """The schema rows are decoded against: the table's now (a typed table's grows),
        its first one while it does not exist yet."""
        if not self.catalog().table_exists(self.identifier):
            return self.schema
        return _arrow_schema(self.catalog().load_table(self.identifier))

    def version(self) -> int:
        """The table's last sequence number: +1 with every snapshot (each commit is one)."""
        return int(self._table().metadata.last_sequence_number)

    # -- offsets ---------------------------------------------------------------------------

    def _offsets_of(self, table: Any) -> dict[str, int]:
        raw = table.properties.get(self.offsets_property)
        return {k: int(v) for k, v in json.loads(raw).items()} if raw else {}

    def _epoch_of(self, table: Any) -> int:
        return int(table.properties.get(self.epoch_property, "0"))

    def committed_offsets(self, keys: Iterable[str] | None = None) -> dict[str, int]:
        """Partition key -> committed next offset; partitions never committed are absent."""
        offsets = self._offsets_of(self._table())
        if keys is None:
            return offsets
        return {k: offsets[k] for k in keys if k in offsets}

    def epoch(self) -> int:
        """The current coordinator epoch (0 = never claimed)."""
        return self._epoch_of(self._table())

    def committed_cut(self) -> int | None:
        """The newest cut this pipeline recorded (``rayconnect.cut_lsn`` in a snapshot's
        summary), among the latest ``CUT_LOOKBACK`` snapshots the table keeps (expired
        ones are gone: ``keep_snapshots``)."""
        snapshots = sorted(self._table().metadata.snapshots, key=lambda s: -s.sequence_number)
        for snapshot in snapshots[: CUT_LOOKBACK + 1]:
            cut = recorded_cut(snapshot.summary, self.pipeline)
            if cut is not None:
                return cut
        return None

    # -- the round commit's hooks (the algorithm: ``TableCommitter.commit``) -------------

    def _snapshot(self) -> Any:
        return self._table()

    def _fence_state(self, read: Any, keys: Sequence[str]) -> tuple[int, dict[str, int | None]]:
        offsets = self._offsets_of(read)
        return self._epoch_of(read), {k: offsets.get(k) for k in keys}

    def _schema_at(self, read: Any) -> pa.Schema:
        return _arrow_schema(read)

    def _add_columns(self, read: Any, columns: pa.Schema) -> tuple[Any, pa.Schema]:
        """Nothing yet: a schema update goes into the round's own metadata commit."""
        return read, columns

    def file_entry(self, data_file: DataFile) -> str:
        return self.location.join(data_file.path)

    def live_files(self, read: Any) -> list[LiveFile]:
        """The data files of ``read``'s current snapshot, with the bounds of their int and
        string columns (the only ones the key search prunes by)."""
        from pyiceberg.conversions import from_bytes
        from pyiceberg.manifest import ManifestContent

        snapshot = read.current_snapshot()
        if snapshot is None:
            return []
        fields = {
            f.field_id: f
            for f in read.schema().fields
            if str(f.field_type) in ("int", "long", "string")
        }
        live = []
        for manifest in snapshot.manifests(read.io):
            if manifest.content != ManifestContent.DATA:
                continue
            for entry in manifest.fetch_manifest_entry(read.io, discard_deleted=True):
                data = entry.data_file
                low, high = data.lower_bounds or {}, data.upper_bounds or {}
                bounds = {
                    f.name: (from_bytes(f.field_type, low[i]), from_bytes(f.field_type, high[i]))
                    for i, f in fields.items()
                    if i in low and i in high
                }
                path = self.location.path(self._relative(data.file_path))
                live.append(LiveFile(path, data, int(data.record_count), bounds))
        return live

    def _relative(self, uri: str) -> str:
        """A file the table names by URI, relative to the table's location."""
        root = _same_place(self.location.uri)
        path = _same_place(uri)
        if not path.startswith(root + "/"):
            raise SchemaMismatchError(f"{uri}: a data file outside {self.location.uri}")
        return path[len(root) + 1 :]

    def _write(self, read: Any, write: VersionWrite) -> int:
        """One transaction on exactly the metadata ``read`` was read at: the offsets (each
        in the snapshot summary, all of the pipeline's in a table property) and the epoch,
        the ``pending`` columns, and a snapshot of the files. A concurrent commit makes it
        fail, never rebase."""
        from pyiceberg.exceptions import CommitFailedException

        if read.properties.get(NUM_RETRIES) != "0":
            raise CommitConflictError(
                f"{self.identifier}: {NUM_RETRIES} is "
                f"{read.properties.get(NUM_RETRIES)!r}, not '0': a failed commit would be "
                "rebased and could land twice; not committing"
            )
        summary = {self.summary_key(k): str(v) for k, v in sorted(write.offsets.items())}
        properties = {}
        if write.offsets:
            merged = self._offsets_of(read) | write.offsets
            properties[self.offsets_property] = json.dumps(merged, sort_keys=True)
        if write.epoch is not None:
            summary[self.epoch_property] = properties[self.epoch_property] = str(write.epoch)
        summary.update(write.metadata)
        changes = write.changes
        try:
            with read.transaction() as tx:
                tx.set_properties(properties)
                if len(write.pending):
                    with tx.update_schema() as update:
                        update.union_by_name(write.pending)
                match changes:
                    case Upserted():
                        upsert_round(tx, changes.folded, changes.key_columns, summary)
                    case RowDelta():
                        row_delta(tx, changes, summary)
                    case Appended():
                        # Duplicates are excluded by the offsets' compare-and-set; pyiceberg's
                        # own check reads every manifest of the table (slower every round).
                        tx.add_files(
                            list(changes.adds),
                            snapshot_properties=summary,
                            check_duplicate_files=False,
                        )
                    case _:  # a new write mode's variant: mypy says it is not handled here
                        assert_never(changes)
        except CommitFailedException as exc:
            raise CommitConflictError(
                f"concurrent commit to {self.identifier}; nothing committed: {exc}"
            ) from exc
        return int(read.metadata.last_sequence_number)

    def _after_commit(self) -> None:
        """Every ``MAINTAIN_EVERY`` commits, expire old snapshots."""
        self._commits += 1
        if self._commits % MAINTAIN_EVERY == 0:
            try:
                self.expire_snapshots()
            except Exception:  # upkeep: the commit itself landed
                log.exception("iceberg %s: expiring snapshots failed", self.identifier)

    def partition_counts(self) -> dict[str, int]:
        rows = (
            self._table()
            .scan(selected_fields=("_kafka_cluster", "_kafka_topic", "_kafka_partition"))
            .to_arrow()
        )
        counts: dict[str, int] = {}
        for row in rows.group_by(rows.column_names).aggregate([([], "count_all")]).to_pylist():
            key = f"{row['_kafka_cluster']}/{row['_kafka_topic']}/{row['_kafka_partition']}"
            counts[key] = row["count_all"]
        return counts

    # -- maintenance -----------------------------------------------------------------------

    def expire_snapshots(self) -> int:
        """Expire all snapshots but the newest ``keep_snapshots`` (offsets live in the
        current metadata, not in old snapshots). Returns how many were expired."""
        table = self._table()
        snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
        old = [s.snapshot_id for s in snapshots[: -self.keep_snapshots]]
        current = table.metadata.current_snapshot_id
        old = [s for s in old if s != current]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        return len(old)

    def referenced_files(self) -> set[str]:
        """Every file the table's metadata reaches: data files, manifests, manifest lists,
        metadata files (full paths, as the table names them)."""
        table = self._table()
        io = table.io
        found: set[str] = {table.metadata_location}
        found.update(entry.metadata_file for entry in table.metadata.metadata_log)
        for snapshot in table.metadata.snapshots:
            found.add(snapshot.manifest_list)
            for manifest in snapshot.manifests(io):
                found.add(manifest.manifest_path)
                for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                    found.add(entry.data_file.file_path)
        return found

    def _vacuum_files(self, retention_hours: float, dry_run: bool) -> list[str]:
        """Files under the table location that no metadata reaches: aborted rounds'
        staging files, and the manifests of expired snapshots."""
        referenced = {_same_place(p) for p in self.referenced_files()}
        cutoff = time.time() - retention_hours * 3600
        removed: list[str] = []
        root = self.location.path("")
        for info in self.filesystem.get_file_info(fs.FileSelector(root, recursive=True)):
            if info.type != fs.FileType.File or info.mtime is None:
                continue
            if info.mtime.timestamp() >= cutoff:
                continue
            rel = info.path[len(root) :].lstrip("/")
            if _same_place(self.location.join(rel)) in referenced:
                continue
            if not rel.startswith((STAGING_DIR + "/", "metadata/")):
                continue  # only what rayconnect or pyiceberg wrote
            if not dry_run:
                self.filesystem.delete_file(info.path)
            removed.append(rel)
        return removed


def _arrow_schema(table: Any) -> pa.Schema:
    """The table's schema as the decoder and the writers' files spell it: pyiceberg says
    ``large_string``/``large_list`` and keeps field ids, Arrow from JSON says ``string``."""
    return pa.schema([pa.field(f.name, normalize_type(f.type)) for f in table.schema().as_arrow()])


def _same_place(uri: str) -> str:
    """A path as both pyiceberg (``file:///x``) and rayconnect (``/x``) may spell it."""
    return uri.removeprefix("file://").rstrip("/")
