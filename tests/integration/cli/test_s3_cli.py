"""``rayconnect run FILE --embedded-broker --embedded-s3``, as a newcomer runs it: the table
lands on a local S3 that lives as long as the command, Ctrl-C commits the last round to it
(the store is out of the terminal's process group: it must outlive the last round) and then
everything is cleaned up."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from test_demo_cli import committed_at_stop, run_then_ctrl_c

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "orders-sink.yaml"


def _s3_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("rayconnect-s3-*"))


@pytest.mark.timeout(420)  # a Ray, Spark and the store start in the subprocess
def test_run_with_embedded_s3_commits_there_and_cleans_up(tmp_path: Path) -> None:
    before = _s3_folders()
    read: list[subprocess.CompletedProcess[str]] = []

    def read_it_as_printed(lines: list[str]) -> None:
        """The read command ``run`` printed, run while the store is up (it goes with run)."""
        command = next(line for line in lines if line.startswith("  read it  "))
        read.append(subprocess.run(command[11:], shell=True, capture_output=True, text=True))

    lines = run_then_ctrl_c(
        [str(EXAMPLE), "--embedded-broker", "--embedded-s3"]
        + ["--demo-records", "3000", "--demo-rate", "500", "--interval", "1"],
        {"ORDERS_TABLE": str(tmp_path / "orders")},
        while_running=read_it_as_printed,
    )
    out = "".join(lines)
    assert "embedded S3 at http://127.0.0.1:" in out
    assert "table s3://rayconnect/orders" in out
    # its keys, a read command that works as printed, and when it goes
    keys = r"^  keys     AWS_ENDPOINT_URL=http://127.0.0.1:\d+ AWS_ACCESS_KEY_ID=\S+ AWS_SECRET"
    assert re.search(keys, out, re.M), out
    assert read[0].returncode == 0, read[0].stderr
    assert re.search(r"shape: \([\d_]+, \d+\)", read[0].stdout), read[0].stdout
    assert "removed when this command exits" in out
    assert "SIGINT: committing what was read, then stopping..." in out
    assert committed_at_stop(lines) > 3000  # the last round committed to the store
    assert not (tmp_path / "orders").exists()  # nothing written to the local path
    assert _s3_folders() <= before  # the store's folder went with it
