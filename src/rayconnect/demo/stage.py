"""The stage both demos run on: a banner, the live view, an embedded broker with the demo's
topic, a fresh local Ray with its dashboard, and the demo's own scratch folder.

Why a class of its own: the sink demo (``rayconnect demo``) and the source demo
(``rayconnect demo --source``) differ in the pipeline they start and in how they check exactly
once, not in how they set up and clean up. The scratch folder holds the demo's Ray sessions
and Spark files instead of /tmp/ray (where other runs' cleanups could reach them); it is
removed after a good run and kept, and named, after a failed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TextIO

from rayconnect.demo.view import LiveView


@dataclass(kw_only=True)
class DemoRun:
    """What every demo's result says about its run, besides its own verdict."""

    elapsed_s: float = 0.0
    #: "<role> (<how>)" of each kill, in order
    kills: list[str] = field(default_factory=list)
    #: kill label -> seconds until its successor committed
    recoveries: dict[str, float] = field(default_factory=dict)
    #: "<step>_s" -> seconds
    timings: dict[str, float] = field(default_factory=dict)

    def summary_lines(self) -> list[tuple[str, str]]:
        """(label, text) of the summary's kills, recoveries, elapsed time and steps."""
        lines = []
        if self.kills:
            recovery = ", ".join(f"{k} {v:.1f} s" for k, v in self.recoveries.items())
            lines += [("killed", ", ".join(self.kills)), ("recovery", recovery or "-")]
        steps = ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in self.timings.items())
        return [*lines, ("elapsed", f"{self.elapsed_s:.1f} s"), ("steps", steps)]


class DemoStage:
    """``with DemoStage(...) as stage:`` the broker and Ray run inside; ``stage.bootstrap``,
    ``stage.view``, ``stage.timings`` (``stage.step(name, since)`` adds one)."""

    def __init__(
        self, banner: str, out: TextIO, *, cluster_id: str, topic: str | None, partitions: int
    ) -> None:
        """``topic``: the demo's topic, made with ``partitions`` (None: the demo makes its
        own topics)."""
        from rayconnect.kafka import compat

        compat.apply()
        self.out, self.cluster_id, self.topic, self.partitions = out, cluster_id, topic, partitions
        self.started = time.monotonic()
        self.timings: dict[str, float] = {}
        print(banner, file=out, flush=True)
        self.view = LiveView(out, started=self.started)
        self.scratch = ray_scratch()
        os.environ["RAYCONNECT_SPARK_TMP"] = str(self.scratch / "spark")
        self._stack = contextlib.ExitStack()
        self.bootstrap = ""

    def step(self, name: str, since: float) -> None:
        self.timings[f"{name}_s"] = time.monotonic() - since

    def __enter__(self) -> DemoStage:
        from rayconnect.kafka.admin import create_topic
        from rayconnect.kafka.embedded import EmbeddedBroker

        with contextlib.ExitStack() as stack:
            stack.enter_context(self._kept_on_error())
            broker = stack.enter_context(EmbeddedBroker(cluster_id=self.cluster_id))
            self.bootstrap = broker.bootstrap_servers
            t = time.monotonic()
            topic = ""
            if self.topic is not None:
                asyncio.run(create_topic(self.bootstrap, self.topic, self.partitions))
                topic = f", topic {self.topic!r} ({self.partitions} partitions)"
            self.view.event(f"broker   tansu at {self.bootstrap}{topic}")
            self.step("broker", t)
            t = time.monotonic()
            stack.callback(self.stop_ray)
            self._start_ray()
            self.step("ray", t)
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return self._stack.__exit__(kind, error, tb)

    @staticmethod
    def stop_ray() -> None:
        """Before the demo reads back what the pipeline wrote (and on the way out)."""
        import ray

        ray.shutdown()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def finish(self, ok: bool) -> None:
        """After the summary: the scratch folder goes, or is kept and named."""
        if ok:
            shutil.rmtree(self.scratch, ignore_errors=True)
        else:
            print(f"  ray and spark logs {self.scratch}", file=self.out)

    @contextlib.contextmanager
    def _kept_on_error(self):
        """A demo that fails with an error keeps its Ray's logs: say where they are."""
        try:
            yield
        except BaseException:
            print(f"  ray and spark logs {self.scratch}", file=self.out, flush=True)
            raise

    def _start_ray(self) -> None:
        """A new local Ray (never one already running: the demo kills actors) with its
        dashboard on a free port, said in the view."""
        import ray

        for attempt in (1, 2):
            try:
                context = ray.init(
                    address="local",
                    namespace="rayconnect",
                    log_to_driver=False,
                    include_dashboard=True,
                    dashboard_port=_free_port(),
                    _temp_dir=str(self.scratch / "ray"),
                )
                break
            except Exception as e:  # Ray gives its raylet 30 s: not enough on a loaded machine
                if attempt == 2:
                    raise
                self.view.event(f"ray      did not start ({type(e).__name__}: {e}); once more")
                ray.shutdown()
        url = f"http://{context.dashboard_url}" if context.dashboard_url else "(not running)"
        self.view.event(f"ray      dashboard {url}: actors, logs, metrics")


#: Ray's longest unix socket path below its temp dir:
#: ``/ray/session_<date>_<time>_<us>_<pid>/sockets/plasma_store`` (7-digit pid)
_RAY_SOCKET_TAIL = 68
_UNIX_PATH_MAX = 107  # bytes; Ray refuses a longer socket path (AF_UNIX)


def ray_scratch() -> Path:
    """A new folder for the demo's Ray and Spark, short enough for Ray's unix sockets: in
    $TMPDIR, or in /tmp when $TMPDIR is too deep (a test runner's, a CI's) - Ray would
    refuse to start, and whether it fits depended on the digits of a process id."""
    prefix = "rc-demo-"
    base = tempfile.gettempdir()
    if len(base) + 1 + len(prefix) + 8 + _RAY_SOCKET_TAIL > _UNIX_PATH_MAX:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
