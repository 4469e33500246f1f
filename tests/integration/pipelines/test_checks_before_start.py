"""Checks before start (issue 42) on real parts: a table path that cannot be written is a
ConfigError before any actor exists (and ``rayconnect run`` exits 2 with one line, before
Ray starts); a table the coordinator cannot recover ends ``start()`` at once with that
error - not after the coordinator's 120 s readiness wait - and leaves no actor behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import ray
import sink_checks
from deltalake import write_deltalake

import rayconnect as rc

pytestmark = [pytest.mark.timeout(240)]


def actors_of(pipeline: str) -> list[str]:
    """The named actors of ``pipeline`` in any namespace."""
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"{pipeline}/")
    ]


def no_actors_left(pipeline: str, within_s: float = 20.0) -> list[str]:
    """``pipeline``'s actors still named after ``within_s`` (killing is asynchronous)."""
    deadline = time.monotonic() + within_s
    while (left := actors_of(pipeline)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[Path]:
    """An immutable folder (``chattr +i``: root cannot write there either); where chattr
    cannot be used, a path under /proc stands in."""
    folder = tmp_path / "frozen"
    folder.mkdir()
    chattr = shutil.which("chattr")
    done = subprocess.run([chattr, "+i", str(folder)], capture_output=True) if chattr else None
    if done is None or done.returncode != 0:
        yield Path("/proc/rayconnect-test")
        return
    try:
        yield folder
    finally:
        subprocess.run([chattr, "-i", str(folder)], check=True)  # type: ignore[list-item]


@pytest.mark.parametrize("where", ["under-a-file", "immutable-folder"])
def test_an_unwritable_table_path_is_refused_before_any_actor_exists(
    ray_session, kafka_broker, tmp_path: Path, frozen: Path, where: str
) -> None:
    topic, name = f"checks-{where}", f"checks-{where}"
    sink_checks.Produced(kafka_broker.bootstrap_servers, topic, 2)
    if where == "under-a-file":
        (tmp_path / "a-file").write_text("")
        table = tmp_path / "a-file" / "orders"
    else:
        table = frozen / "orders"
    pipeline = sink_checks.pipeline(name, kafka_broker.bootstrap_servers, topic, table)
    started = time.monotonic()
    with pytest.raises(rc.ConfigError, match=r"^sink\.path: .* cannot be written"):
        pipeline.start()
    took = time.monotonic() - started
    assert took < 5.0, f"refused after {took:.1f} s"
    assert actors_of(name) == []
    assert not table.exists()


def test_a_table_that_cannot_be_recovered_fails_start_at_once(
    ray_session, kafka_broker, tmp_path: Path
) -> None:
    """The path can be written (the pre-check passes), but a Delta table of another schema is
    there: the coordinator's recovery refuses it, and start() says so within seconds."""
    topic, name = "checks-recovery", "checks-recovery"
    sink_checks.Produced(kafka_broker.bootstrap_servers, topic, 2)
    table = tmp_path / "orders"
    write_deltalake(str(table), pa.table({"something_else": pa.array([1], pa.int64())}))
    pipeline = sink_checks.pipeline(name, kafka_broker.bootstrap_servers, topic, table)
    started = time.monotonic()
    with pytest.raises(rc.TableRecoveryError) as caught:
        pipeline.start()
    took = time.monotonic() - started
    message = str(caught.value)
    assert took < 60, f"start() failed after {took:.1f} s"
    assert message.startswith(f"pipeline {name!r} cannot start: recovering its table")
    assert "another schema" in message and "\n" not in message  # one line, no traceback
    assert isinstance(caught.value, rc.PipelineError)  # exit code 2 on the command line
    assert no_actors_left(name) == []
    print(f"\nstart() failed after {took:.1f} s: {message}")


PIPELINE_FILE = """\
kind: sink
name: checks-cli
source:
  metadata:
    streams:
      - stream_id: orders
        clusters:
          local: {{bootstrap_servers: "127.0.0.1:9", topics: [orders]}}
sink:
  path: {path}
"""


@pytest.mark.timeout(120)
def test_rayconnect_run_exits_2_with_one_line_before_ray_starts(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    file = tmp_path / "pipeline.yaml"
    file.write_text(PIPELINE_FILE.format(path=tmp_path / "a-file" / "orders"))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rayconnect.cli", "run", str(file)],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ""},
        timeout=90,
    )
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"rayconnect: {file}: sink.path: {tmp_path / 'a-file' / 'orders'} cannot be written: "
        f"{tmp_path / 'a-file'} is a file, not a folder"
    ], proc.stderr
    assert "running" not in proc.stdout
    assert took < 30, f"refused after {took:.1f} s"
    print(f"\nrayconnect run exited 2 after {took:.1f} s (process start included)")
