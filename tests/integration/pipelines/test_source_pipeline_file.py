"""``rayconnect run`` of a ``kind: source`` file, end to end through the CLI's entry point:
a generator source into the embedded broker, stopped by SIGTERM in the foreground, started
again detached with more tasks, seen by ``status``/``list``/``attach``, stopped by ``stop`` -
and a read_committed consumer sees every record exactly once, in order."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

import rayconnect as rc
from rayconnect.cli import EXIT_NOT_FOUND, EXIT_OK, main
from rayconnect.kafka.admin import create_topic
from rayconnect.kafka.embedded import EmbeddedBroker
from rayconnect.pipelines.source import SourcePipelineHandle

pytestmark = [pytest.mark.usefixtures("ray_session")]

FILE = """\
kind: source
name: {name}
task: {{type: generator, topic: out, partitions: 3, batch_size: 30, poll_delay_s: 0.05}}
target: {{bootstrap_servers: "${{TEST_BOOTSTRAP}}"}}
tasks: {tasks}
exactly_once: required
"""


def _sigterm_once(name: str, min_records: int, timeout_s: float = 150.0) -> threading.Thread:
    """SIGTERM this process once ``run`` watches (its handler is installed) and the pipeline
    committed ``min_records``."""
    default = signal.getsignal(signal.SIGTERM)

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if signal.getsignal(signal.SIGTERM) is not default:
                try:
                    if SourcePipelineHandle(name).status()["records_committed"] >= min_records:
                        break
                except Exception:
                    pass
            time.sleep(0.3)
        if signal.getsignal(signal.SIGTERM) is not default:  # never kill pytest itself
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(240)
def test_source_file_runs_and_restarts_exactly_once(
    kafka_broker: EmbeddedBroker, tmp_path, monkeypatch, capsys
) -> None:
    from test_source_pipeline import assert_exactly_once_in_order, generator_seqs, run

    bootstrap = kafka_broker.bootstrap_servers
    run(create_topic(bootstrap, "out", 2))
    monkeypatch.setenv("TEST_BOOTSTRAP", bootstrap)
    name = "filegen"
    path = tmp_path / "numbers.yaml"

    # 1. foreground, one task; SIGTERM -> the open transaction commits, the task ends
    path.write_text(FILE.format(name=name, tasks=1))
    watcher = _sigterm_once(name, min_records=200)
    assert main(["run", str(path), "--interval", "0.5"]) == EXIT_OK
    watcher.join(timeout=10)
    out = capsys.readouterr().out
    assert "transactions" in out and "committed / 0 aborted" in out, out
    assert "SIGTERM: committing open transactions, then stopping..." in out
    assert f"stopped {name}:" in out
    seqs, _ = generator_seqs(bootstrap)
    assert_exactly_once_in_order(seqs)
    first = sum(len(s) for s in seqs.values())
    assert first >= 200

    # 2. detached, two tasks: resumes from the committed offsets
    path.write_text(FILE.format(name=name, tasks=2))
    assert main(["run", str(path), "--detach"]) == EXIT_OK
    handle = rc.attach(name)
    assert isinstance(handle, SourcePipelineHandle)
    handle.wait_for(lambda s: s["records_committed"] >= 150, timeout_s=90, poll_s=0.3)
    assert main(["run", str(path), "--detach"]) == EXIT_NOT_FOUND  # already running
    capsys.readouterr()
    assert main(["status", name, "--json"]) == EXIT_OK
    status = json.loads(capsys.readouterr().out)
    assert status["kind"] == "source" and len(status["tasks"]) == 2
    assert {f"{name}/task/0", f"{name}/task/1"} <= {a["name"] for a in status["actors"]}
    assert main(["list", "--json"]) == EXIT_OK
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[name]["kind"] == "source" and rows[name]["actors"] == 2
    assert main(["stop", name]) == EXIT_OK
    assert f"stopped {name}: 2 task(s)" in capsys.readouterr().out
    assert main(["status", name]) == EXIT_NOT_FOUND

    seqs, _ = generator_seqs(bootstrap)
    assert_exactly_once_in_order(seqs)  # no duplicate, no gap across the restart
    assert sum(len(s) for s in seqs.values()) >= first + 150
