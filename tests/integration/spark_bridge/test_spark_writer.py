"""WriterActor with real Ray + RayDP Spark, then DeltaCommitter: files per group, one job.

One Ray + Spark start-up for the whole module (~20-30 s each time).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import ray
from deltalake import DeltaTable
from ray_tmp import cleaned_ray_tmp

from rayconnect.actors import names
from rayconnect.actors.pieces import FlushPart
from rayconnect.actors.writer import start_writer
from rayconnect.config.spark import SparkSettings
from rayconnect.errors import JavaNotFoundError
from rayconnect.formats.evolution import schema_differences
from rayconnect.protocol.status import WriterStatus
from rayconnect.protocol.types import DataFile
from rayconnect.schema import RAW_RECORD_SCHEMA
from rayconnect.spark_bridge.blocks import put_together
from rayconnect.spark_bridge.executor_group import no_room, release, reserve_executors
from rayconnect.spark_bridge.session import require_java, spark_configs
from rayconnect.spark_bridge.task_errors import InputSchemaError
from rayconnect.spark_bridge.write_here import write_groups_here
from rayconnect.tables.delta import DeltaCommitter
from rayconnect.tables.files import STAGING_DIR
from rayconnect.write_modes.key_search import SearchOnWriter
from rayconnect.write_modes.row_delta import ColumnReader, LiveFile, SearchJob, search_here

pytestmark = [pytest.mark.timeout(180)]

NAMESPACE = "rayconnect-test"
WRITER_NAME = names.writer(f"test-{uuid.uuid4().hex[:6]}")
HEADERS_TYPE = RAW_RECORD_SCHEMA.field("headers").type


def records(partition: int, start: int, n: int, cluster: str = "c1") -> pa.Table:
    offsets = pa.array(range(start, start + n), pa.int64())
    return pa.table(
        {
            "cluster": pa.array([cluster] * n, pa.string()),
            "topic": pa.array(["orders"] * n, pa.string()),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": offsets,
            "timestamp": pc.cast(
                pc.add(offsets, 1_700_000_000_000_000), pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array([b"k%d" % i for i in range(start, start + n)], pa.binary()),
            "value": pa.array([b"v%d" % i for i in range(start, start + n)], pa.binary()),
            "headers": pa.array([[{"key": "h", "value": b"x"}]] * n, HEADERS_TYPE),
        },
        schema=RAW_RECORD_SCHEMA,
    )


@pytest.fixture(scope="module")
def writer() -> Iterator[ray.actor.ActorHandle]:
    with cleaned_ray_tmp():
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, namespace=NAMESPACE)
        t_ray = time.perf_counter() - t0
        t0 = time.perf_counter()
        handle = start_writer(
            WRITER_NAME,
            namespace=NAMESPACE,
            spark=SparkSettings(start="with_pipeline"),
        )
        stats = ray.get(handle.stats.remote())
        print(
            f"\nray.init {t_ray:.1f} s; writer ready {time.perf_counter() - t0:.1f} s "
            f"(spark start {stats.spark_start_s} s, warm-up {stats.warm_up_s} s)"
        )
        try:
            yield handle
        finally:
            try:
                ray.get(handle.close.remote(), timeout=60)
            finally:
                ray.kill(handle)
                ray.shutdown()


def read_files(table_path: Path, files: list[DataFile]) -> pa.Table:
    return pa.concat_tables([pq.read_table(table_path / f.path) for f in files])


def key_set(table: pa.Table) -> set[tuple[str, int, int]]:
    rows = zip(
        table.column("cluster").to_pylist(),
        table.column("partition").to_pylist(),
        table.column("offset").to_pylist(),
        strict=True,
    )
    return set(rows)


def expected_keys(partition: int, start: int, n: int) -> set[tuple[str, int, int]]:
    return {("c1", partition, off) for off in range(start, start + n)}


def jobs_delta(writer: ray.actor.ActorHandle, before: WriterStatus) -> tuple[int, int]:
    after = ray.get(writer.stats.remote())
    return (
        after.spark_writes - before.spark_writes,
        after.spark_jobs - before.spark_jobs,
    )


def test_three_groups_one_call(writer: ray.actor.ActorHandle, tmp_path: Path) -> None:
    table = tmp_path / "t"
    groups = [[ray.put(records(p, 0, 300)), ray.put(records(p, 300, 200))] for p in range(3)]
    before = ray.get(writer.stats.remote())
    files = ray.get(writer.write_many.remote(str(table), groups))
    assert jobs_delta(writer, before) == (1, 1)
    assert len(files) == 3
    for p, group_files in enumerate(files):
        assert group_files, "every non-empty group gets files"
        assert all(f.path.startswith(f"{STAGING_DIR}/") for f in group_files)
        data = read_files(table, group_files)
        assert data.num_rows == 500 == sum(f.records for f in group_files)
        assert key_set(data) == expected_keys(p, 0, 500)
        for f in group_files:
            file_schema = pq.read_schema(table / f.path)
            assert schema_differences(file_schema, RAW_RECORD_SCHEMA) == []
            assert file_schema.equals(RAW_RECORD_SCHEMA)  # types incl. int32, ts[us, UTC]
            assert f.stats.min_values["partition"] == p == f.stats.max_values["partition"]
            assert f.size == (table / f.path).stat().st_size


def test_concurrent_calls_are_gathered_then_committed(
    writer: ray.actor.ActorHandle, tmp_path: Path
) -> None:
    table = tmp_path / "t"
    committer = DeltaCommitter(str(table), "pipe")
    committer.ensure_table()
    keys = [f"c1/orders/{p}" for p in range(3)]
    before = ray.get(writer.stats.remote())
    calls = [writer.write.remote(str(table), [ray.put(records(p, 0, 1000))]) for p in range(3)]
    files = ray.get(calls)
    writes, jobs = jobs_delta(writer, before)
    assert (writes, jobs) == (1, 1), "three concurrent calls must share one Spark job"
    for p, group_files in enumerate(files):
        assert key_set(read_files(table, group_files)) == expected_keys(p, 0, 1000)

    t0 = time.perf_counter()
    version = committer.commit(
        [f for group in files for f in group],
        {k: 1000 for k in keys},
        {k: None for k in keys},
        {"rayconnect.txn": "1"},
    )
    print(f"\ncommit of {sum(map(len, files))} files: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    assert version == 1

    # Round two on top: the table must hold every record exactly once.
    more = ray.get(
        [writer.write.remote(str(table), [ray.put(records(p, 1000, 500))]) for p in range(3)]
    )
    committer.commit(
        [f for group in more for f in group], {k: 1500 for k in keys}, {k: 1000 for k in keys}
    )
    data = DeltaTable(str(table)).to_pyarrow_table()
    assert data.num_rows == 4500
    assert len(key_set(data)) == 4500  # no duplicates
    assert key_set(data) == set().union(*(expected_keys(p, 0, 1500) for p in range(3)))
    assert committer.committed_offsets() == {k: 1500 for k in keys}


def test_a_hosts_partitions_share_files_and_each_file_names_them(
    writer: ray.actor.ActorHandle, tmp_path: Path
) -> None:
    """Calls with one share token (a participant host) put their rows in the same files:
    a round of many small partitions makes files per host, not per partition. Each shared
    file names its partitions; two calls of ONE partition never share a file; a call
    of another token, or without one, keeps files of its own."""
    table = tmp_path / "t"
    keys = [f"c1/orders/{p}" for p in range(4)]
    before = ray.get(writer.stats.remote())
    calls = [
        writer.write.remote(str(table), [ray.put(records(p, 0, 100))], keys[p], "host-0")
        for p in range(3)
    ]
    calls.append(  # partition 0 again: a second flush of it in the same job
        writer.write.remote(str(table), [ray.put(records(0, 100, 50))], keys[0], "host-0")
    )
    calls.append(  # another host's partition
        writer.write.remote(str(table), [ray.put(records(3, 0, 100))], keys[3], "host-1")
    )
    calls.append(writer.write.remote(str(table), [ray.put(records(5, 0, 10))]))  # no token
    files = ray.get(calls)
    assert jobs_delta(writer, before) == (1, 1)
    wanted = [(0, 0, 100), (1, 0, 100), (2, 0, 100), (0, 100, 50), (3, 0, 100), (5, 0, 10)]
    for (p, start, n), group_files in zip(wanted, files, strict=True):
        assert group_files
        rows = key_set(read_files(table, group_files))
        assert expected_keys(p, start, n) <= rows  # its rows are there...
        for f in group_files:  # ...and a file holds only the partitions it names
            in_file = {part for _, part, _ in key_set(read_files(table, [f]))}
            named = {int(k.rsplit("/", 1)[1]) for k in f.shared_by} or {p}
            assert in_file == named, (f.path, in_file, f.shared_by)
            assert f.records == pq.read_metadata(table / f.path).num_rows
    host0 = {f.path for group in files[:4] for f in group}
    assert len(host0) < 4, "host-0's calls share files (one open file a task)"
    assert any(len(f.shared_by) >= 2 for group in files[:4] for f in group)
    first0, second0 = {f.path for f in files[0]}, {f.path for f in files[3]}
    assert not first0 & second0, "two flushes of one partition never share a file"
    assert all(not f.shared_by for f in files[4] + files[5])
    assert not {f.path for f in files[4]} & host0


def test_a_write_made_here_has_the_files_of_a_spark_job(
    writer: ray.actor.ActorHandle, tmp_path: Path
) -> None:
    """``write_groups_here`` (the writer's path before Spark is up, and for small writes)
    writes what a Spark job writes: each group's rows exactly, a host's partitions sharing
    files that name them, never two flushes of one partition in one file; bad input is an
    InputSchemaError. No Spark job runs."""
    keys = ["c1/orders/0", "c1/orders/1", "c1/orders/0", None]
    shares = ["host-0", "host-0", "host-0", None]
    blocks = [records(0, 0, 100), records(1, 0, 60), records(0, 100, 50), records(5, 0, 10)]
    groups = [[ray.put(b.slice(0, 40)), ray.put(b.slice(40))] for b in blocks]
    before = ray.get(writer.stats.remote())
    here = write_groups_here(str(tmp_path / "here"), groups, keys=keys, shares=shares)
    spark = ray.get(
        [
            writer.write.remote(str(tmp_path / "spark"), g, k, s)
            for g, k, s in zip(groups, keys, shares, strict=True)
        ]
    )
    assert here.job_ids == [] and jobs_delta(writer, before) == (1, 1)
    # The writer is an async actor: calls may start out of submission order, so which of
    # the two flushes of partition 0 shares partition 1's file differs from run to run in
    # the Spark job; how many files are shared, and by how many partitions, does not.
    assert sorted(len(f.shared_by) for g in here.files for f in g) == sorted(
        len(f.shared_by) for g in spark for f in g
    )
    for files in (here.files, spark):  # partition 1 rides with one flush of partition 0
        paths = [{f.path for f in group} for group in files]
        assert len(paths[1] & (paths[0] | paths[2])) == 1 and not paths[0] & paths[2]
    for group_here, block in zip(here.files, blocks, strict=True):
        rows = read_files(tmp_path / "here", group_here)
        assert key_set(rows) >= key_set(block)
        for f in group_here:
            in_file = key_set(read_files(tmp_path / "here", [f]))
            named = {int(k.rsplit("/", 1)[1]) for k in f.shared_by} or {
                block["partition"][0].as_py()
            }
            assert {part for _, part, _ in in_file} == named
            assert f.records == len(in_file) and f.path.startswith(f"{STAGING_DIR}/")
            assert pq.read_schema(tmp_path / "here" / f.path).equals(RAW_RECORD_SCHEMA)
    assert {len(f.shared_by) for f in here.files[1]} == {2}  # partitions 0 and 1 of host-0
    bad = records(0, 0, 10).set_column(2, "partition", pa.array([0] * 10, pa.int64()))
    with pytest.raises(InputSchemaError, match="partition"):
        write_groups_here(str(tmp_path / "bad"), [[ray.put(bad)]])


def test_empty_groups_and_record_batches(writer: ray.actor.ActorHandle, tmp_path: Path) -> None:
    table = tmp_path / "t"
    batch_ref = ray.put(records(1, 0, 50).to_batches()[0])
    empty_ref = ray.put(RAW_RECORD_SCHEMA.empty_table())
    files = ray.get(writer.write_many.remote(str(table), [[], [batch_ref], [empty_ref]]))
    assert files[0] == [] and files[2] == []
    assert key_set(read_files(table, files[1])) == expected_keys(1, 0, 50)
    assert ray.get(writer.write.remote(str(table), [])) == []


def test_bad_input_fails_only_its_caller(writer: ray.actor.ActorHandle, tmp_path: Path) -> None:
    table = tmp_path / "t"
    bad = records(0, 0, 10).set_column(2, "partition", pa.array([0] * 10, pa.int64()))
    good_call = writer.write.remote(str(table), [ray.put(records(1, 0, 10))])
    bad_call = writer.write.remote(str(table), [ray.put(bad)])
    good_files = ray.get(good_call)
    assert key_set(read_files(table, good_files)) == expected_keys(1, 0, 10)
    with pytest.raises(InputSchemaError, match="partition"):
        ray.get(bad_call)
    # Usually both calls are gathered into one job, which fails after its task wrote the good
    # block: that file is left in staging, named by no result (on a loaded machine the calls
    # may arrive apart: no orphan). Only the job's result says which files a write made (a
    # listing of the folder would hand the good caller its rows twice).
    on_disk = {str(p.relative_to(table)) for p in (table / STAGING_DIR).rglob("*.parquet")}
    assert {f.path for f in good_files} <= on_disk
    orphans = on_disk - {f.path for f in good_files}
    assert len(orphans) <= 1
    for orphan in orphans:
        assert key_set(pq.read_table(table / orphan)) == expected_keys(1, 0, 10)


def test_a_hosts_flushes_in_one_call_each_get_their_files_or_their_failure(
    writer: ray.actor.ActorHandle, tmp_path: Path
) -> None:
    """``write_parts``: one call carries a participant host's flushes, their rows as
    ``Rows`` handles into objects the partitions share (a reader's one object per host per
    fetch); each part gets the files of exactly its own rows, and a bad part fails alone.
    A write made here (no Spark) resolves the same handles to the same rows."""
    table = tmp_path / "t"
    fetch1 = put_together([records(0, 0, 60).to_batches()[0], records(1, 0, 60).to_batches()[0]])
    fetch2 = put_together([records(0, 60, 40).to_batches()[0], records(1, 60, 40).to_batches()[0]])
    bad = records(2, 0, 10).set_column(2, "partition", pa.array([2] * 10, pa.int64()))
    parts = [
        FlushPart("c1/orders/0", [fetch1[0], fetch2[0]], 100),
        FlushPart("c1/orders/1", [fetch1[1], fetch2[1]], 100),
        FlushPart("c1/orders/2", [ray.put(bad)], 10),
        FlushPart("c1/orders/3", [ray.put(records(3, 0, 30))], 30),  # a plain ref
    ]
    before = ray.get(writer.stats.remote())
    written = ray.get(writer.write_parts.remote(str(table), parts, "host-0"))
    assert ray.get(writer.stats.remote()).calls == before.calls + 1
    assert [w.error is None for w in written] == [True, True, False, True]
    assert "partition" in (written[2].error or "") and written[2].files == []
    here = write_groups_here(
        str(tmp_path / "here"), [p.refs for p in parts if p.key != "c1/orders/2"]
    )
    for p, n, files, files_here in zip(
        (0, 1, 3), (100, 100, 30), written[:2] + written[3:], here.files, strict=True
    ):
        # the files may be shared (one token): each part's rows exactly
        rows = key_set(read_files(table, files.files))
        assert {r for r in rows if r[1] == p} == expected_keys(p, 0, n)
        assert key_set(read_files(tmp_path / "here", files_here)) == expected_keys(p, 0, n)
        assert sum(f.records for f in files_here) == n


@pytest.mark.parametrize(
    ("rows", "n_groups"), [(10_000, 1), (10_000, 4), (100_000, 4), (10_000, 16)]
)
def test_write_timing(
    writer: ray.actor.ActorHandle, tmp_path: Path, rows: int, n_groups: int
) -> None:
    table = tmp_path / "t"
    per_group = rows // n_groups
    groups = [[ray.put(records(p, 0, per_group))] for p in range(n_groups)]
    before = ray.get(writer.stats.remote())
    t0 = time.perf_counter()
    files = ray.get(writer.write_many.remote(str(table), groups))
    elapsed = time.perf_counter() - t0
    stats = ray.get(writer.stats.remote())
    assert jobs_delta(writer, before) == (1, 1)
    assert sum(f.records for group in files for f in group) == rows
    print(
        f"\nwrite {rows} rows in {n_groups} groups: {elapsed:.2f} s round trip, "
        f"{stats.last_write_s} s in write_groups (prepare {stats.last_prepare_s} s, "
        f"spark {stats.last_spark_s} s), job ids {stats.last_job_ids}"
    )


def test_require_java_and_configs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert require_java(17) >= 17
    with pytest.raises(JavaNotFoundError, match="Spark needs >= 99"):
        require_java(99)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="JAVA_HOME"):
        require_java()
    configs = spark_configs()
    for key in (
        "spark.driver.extraJavaOptions",
        "spark.executor.extraJavaOptions",
        "spark.ray.raydp_app_master.extraJavaOptions",
    ):
        assert "-XX:+IgnoreUnrecognizedVMOptions" in configs[key]
        assert "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED" in configs[key]
    assert configs["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"
    assert configs["spark.sql.session.timeZone"] == "UTC"
    assert configs["spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs"] == "false"


def test_executor_cpus_are_waited_for_a_bounded_time_then_what_fits_is_taken(
    writer: ray.actor.ActorHandle,
) -> None:
    """More executors than the Ray has free CPUs for: after ``wait_s`` the reservation takes
    as many as fit now instead of waiting for ever (RayDP's own group waits without
    timeout); executors bigger than any node: None, and the reason names the setting."""
    ray.get(writer.ready.remote(), timeout=120)  # its executor holds its CPU from now on
    free = int(ray.available_resources().get("CPU", 0))
    t0 = time.monotonic()
    reservation = reserve_executors(free + 1, 1, "1MB", "SPREAD", wait_s=1)
    try:
        if free == 0:
            assert reservation is None
        else:
            assert reservation is not None and reservation.count == free
        assert time.monotonic() - t0 < 30
    finally:
        release(reservation)
    cores = int(ray.cluster_resources()["CPU"]) + 1
    assert reserve_executors(1, cores, "1MB", "SPREAD", wait_s=1) is None
    assert "spark.executor_wait_s=1" in no_room(cores, "1MB", 1)


def test_when_needed_writes_here_until_busy_then_starts_spark(
    writer: ray.actor.ActorHandle, tmp_path: Path
) -> None:
    """``spark.start: when_needed``: the writer is ready without Spark and writes in its own
    process while that leaves it idle; once its writes keep it busy (here half of a 3-s
    window) Spark starts, and from then on a write is a Spark job. Every write's rows
    exactly, whoever wrote them. Its Spark runs beside the module's writer's, in the same
    Ray namespace: RayDP's JVMs get a namespace per Spark app (raydp#386)."""
    lazy_name = names.writer(f"lazy-{uuid.uuid4().hex[:6]}")
    lazy = start_writer(
        lazy_name,
        namespace=NAMESPACE,
        spark=SparkSettings(start="when_needed", busy_window_s=3, start_when_busy=0.5),
    )
    try:
        stats = ray.get(lazy.stats.remote())
        assert stats.spark_start == "when_needed" and stats.spark_start_s is None
        table = tmp_path / "t"
        for i in range(5):  # a light load over more than a window: Spark is not needed
            files = ray.get(lazy.write.remote(str(table), [ray.put(records(0, i * 100, 100))]))
            assert key_set(read_files(table, files)) == expected_keys(0, i * 100, 100)
            time.sleep(0.8)
        stats = ray.get(lazy.stats.remote())
        assert stats.writes_here == 5 and stats.spark_writes == 0
        job, expected = _search_job(tmp_path)  # a merge-on-read search: here too
        assert [p.tolist() for p in SearchOnWriter(lazy_name, NAMESPACE)(job)] == expected
        stats = ray.get(lazy.stats.remote())
        assert stats.searches_here == 1 and stats.spark_searches == 0
        assert stats.spark_started_because is None and stats.spark_start_s is None

        big = ray.put(records(1, 0, 300_000))  # writes back to back: ~all of the window busy
        deadline = time.monotonic() + 60
        while stats.spark_started_because is None:
            assert time.monotonic() < deadline, stats
            for files in ray.get([lazy.write.remote(str(table), [big]) for _ in range(4)]):
                assert sum(f.records for f in files) == 300_000  # (read back below: slow)
            stats = ray.get(lazy.stats.remote())
        assert key_set(read_files(table, files)) == expected_keys(1, 0, 300_000)
        assert "of the last 3 s (start_when_busy 0.5)" in stats.spark_started_because
        assert stats.spark_writes == 0  # written here while Spark starts

        deadline = time.monotonic() + 150
        while stats.warm_up_s is None:  # Spark up and warmed up
            assert time.monotonic() < deadline and stats.problem is None, stats
            time.sleep(1)
            stats = ray.get(lazy.stats.remote())
        before = stats
        files = ray.get(lazy.write.remote(str(table), [ray.put(records(2, 0, 500))]))
        assert key_set(read_files(table, files)) == expected_keys(2, 0, 500)
        assert jobs_delta(lazy, before) == (1, 1)
        for w in (writer, lazy):  # each Spark's app master in a namespace of its own
            app = ray.get(w.stats.remote()).app_name
            ray.get_actor("RAY_APP_MASTER", namespace=f"rayconnect-spark-{app}")
        with pytest.raises(ValueError):
            ray.get_actor("RAY_APP_MASTER", namespace=NAMESPACE)
    finally:
        try:
            ray.get(lazy.close.remote(), timeout=60)
        finally:
            ray.kill(lazy)


def _search_job(tmp_path: Path) -> tuple[SearchJob, list[list[int]]]:
    """A merge-on-read search over 3 real Parquet files of ids (file i holds i*1000 ...
    i*1000+999, shuffled) and the positions it must answer, per file."""
    rng = np.random.default_rng(5)
    files, ids = [], []
    for i in range(3):
        column = rng.permutation(np.arange(i * 1000, i * 1000 + 1000))
        path = tmp_path / f"part-{i}.parquet"
        pq.write_table(pa.table({"id": column, "v": column.astype(str)}), path)
        files.append(LiveFile(str(path), None, len(column)))
        ids.append(column.tolist())
    wanted = {5, 999, 1000, 1500, 2999, 7777}  # 7777: in no file
    keys = pa.table({"id": pa.array(sorted(wanted), pa.int64())})
    job = SearchJob(tuple(files), keys, (), ColumnReader(pafs.LocalFileSystem()))
    expected = [sorted(p for p, k in enumerate(column) if k in wanted) for column in ids]
    return job, expected


def test_a_merge_on_read_search_runs_on_sparks_executors_once_spark_is_up(
    writer: ray.actor.ActorHandle, tmp_path: Path
) -> None:
    """``write_modes.key_search``: the coordinator sends a round's key search to the writer,
    whose Spark (up: ``with_pipeline``) runs it as one job over the files; the answer is
    the one the search gives in-process. Without a writer to ask, it runs where it was
    asked, and says why."""
    job, expected = _search_job(tmp_path)
    assert [p.tolist() for p in search_here(job)] == expected
    before = ray.get(writer.stats.remote())
    on_writer = SearchOnWriter(WRITER_NAME, NAMESPACE)
    found = on_writer(job)
    assert [p.tolist() for p in found] == expected
    after = ray.get(writer.stats.remote())
    assert after.spark_searches == before.spark_searches + 1
    assert after.searches_here == before.searches_here
    assert on_writer.counts.on_writer == 1 and on_writer.counts.here == 0

    away = SearchOnWriter("no-such-pipeline/writer", NAMESPACE)
    assert [p.tolist() for p in away(job)] == expected
    assert away.counts.here == 1 and away.counts.on_writer == 0
    assert "no-such-pipeline/writer" in (away.counts.last_fallback or "")


def test_when_needed_goes_on_writing_here_while_spark_cannot_start(
    writer: ray.actor.ActorHandle, tmp_path: Path
) -> None:
    """``spark.start: when_needed``: a writer whose Spark, asked for once its writes kept it
    busy, cannot start - here its executors' CPUs never fit (4 cores on a 2-CPU Ray) - keeps
    writing in its own process and says why in ``problem`` (status)."""
    lazy_name = names.writer(f"lazy-{uuid.uuid4().hex[:6]}")
    lazy = start_writer(
        lazy_name,
        namespace=NAMESPACE,
        spark=SparkSettings(
            start="when_needed",
            busy_window_s=2,
            start_when_busy=0.5,
            executor_cores=4,
            executor_wait_s=1,
        ),
    )
    try:
        table = tmp_path / "t"
        stats = ray.get(lazy.stats.remote())
        assert stats.spark_start_s is None and stats.problem is None
        big = ray.put(records(1, 0, 300_000))
        deadline = time.monotonic() + 60
        while stats.spark_started_because is None:
            assert time.monotonic() < deadline, stats
            for files in ray.get([lazy.write.remote(str(table), [big]) for _ in range(4)]):
                assert sum(f.records for f in files) == 300_000
            stats = ray.get(lazy.stats.remote())
        deadline = time.monotonic() + 60
        while stats.problem is None:
            assert time.monotonic() < deadline, stats
            time.sleep(0.5)
            stats = ray.get(lazy.stats.remote())
        assert stats.problem.startswith("waiting for CPUs: no Ray node had room for one ")
        assert "writes go on in the writer's process until one fits" in stats.problem
        before = stats
        files = ray.get(lazy.write.remote(str(table), [ray.put(records(2, 0, 500))]))
        assert key_set(read_files(table, files)) == expected_keys(2, 0, 500)
        after = ray.get(lazy.stats.remote())
        assert after.writes_here == before.writes_here + 1 and after.spark_writes == 0
    finally:
        ray.kill(lazy)  # its start waits for CPUs that never come: close() would wait 25 s
