"""``rayconnect run FILE --embedded-broker --embedded-s3``, as a newcomer runs it: the table
lands on a local S3 that lives as long as the command, Ctrl-C commits the last round to it
(the store is out of the terminal's process group) and then everything is cleaned up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders-sink.yaml"


def _s3_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("rayconnect-s3-*"))


@pytest.mark.timeout(300)
def test_run_with_embedded_s3_commits_there_and_cleans_up(tmp_path: Path) -> None:
    before = _s3_folders()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayconnect.cli", "run", str(EXAMPLE), "--embedded-broker"]
        + ["--embedded-s3", "--demo-records", "3000", "--demo-rate", "500", "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal job has
        env=dict(os.environ, ORDERS_TABLE=str(tmp_path / "orders")),
    )
    lines: list[str] = []
    committed = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "rounds 2 committed" in line:
                committed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert committed.wait(240), "".join(lines)[-3000:]
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the store must outlive the last round
        assert proc.wait(120) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    out = "".join(lines)
    assert "embedded S3 at http://127.0.0.1:" in out
    assert "table s3://rayconnect/orders" in out
    stopped = next(line for line in lines if line.startswith("stopped orders:"))
    assert "error" not in stopped.lower(), stopped
    assert int(stopped.rsplit("offsets ", 1)[1].split()[0].replace(",", "")) > 3000
    assert not (tmp_path / "orders").exists()  # nothing written to the local path
    assert _s3_folders() <= before  # the store's folder went with it
