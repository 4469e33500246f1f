"""The README's flow, end to end: ``ray start --head``, ``ray job submit -- rayconnect run
examples/orders-sink.yaml``, rows in the table, ``rayconnect status``, the dashboard's actor
list, Ray's Prometheus endpoint, ``rayconnect stop``.

The head is private to this test: its own temp dir and free ports, token auth disabled
(Ray 2.60 enables it by default), and it is ended by PID - never with ``ray stop``, which
would end every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from fixtures.processes import free_port, kill_pids, pids_of

from rayconnect.spark_bridge.java import find_java

REPO = Path(__file__).parents[3]
BIN = Path(sys.executable).parent
EXAMPLE = "examples/orders-sink.yaml"
RECORDS = 2000
PARTITIONS = 4


def _scrape(port: int) -> dict[str, dict[tuple, float]]:
    """``{metric: {labels: value}}`` of the rayconnect metrics on a node's metrics port."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for line in text.splitlines():
        m = re.match(r"^(ray_rayconnect_\w+?)(?:\{(.*)\})? ([0-9.eE+-]+|NaN)$", line)
        if m:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m[2] or "")))
            labels = tuple(
                kv for kv in labels if kv[0] in ("pipeline", "cluster", "topic", "partition", "le")
            )
            name = m[1].removesuffix("_total")  # counters carry it or not, by exporter
            out[name][labels] = out[name].get(labels, 0.0) + float(m[3])
    return out


def _total(metrics, name: str) -> float:
    return sum(metrics.get(name, {}).values())


@pytest.mark.timeout(420)
def test_ray_job_submit_status_dashboard_metrics_stop(tmp_path):
    from deltalake import DeltaTable

    # Short path: Ray's unix sockets live under the temp dir (108-byte limit).
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-job-", dir="/tmp"))
    gcs, dash, metrics_port = free_port(), free_port(), free_port()
    table = tmp_path / "orders"
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_metrics_report_interval_ms": "1000",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("RAY_ADDRESS", None)
    # The README's `eval "$(python -m rayconnect.spark_bridge.java)"` before `ray start`
    env.update(find_java(env).environment(env))

    def run(*cmd, timeout=120, check=True):
        done = subprocess.run(
            cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd[:3])} exited {done.returncode}\n"
                f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
            )
        return done

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    job_id = f"rayconnect-test-{os.getpid()}"
    try:
        run(
            str(BIN / "ray"),
            "start",
            "--head",
            f"--temp-dir={temp_dir}",
            "--num-cpus=2",
            f"--port={gcs}",
            f"--dashboard-port={dash}",
            "--dashboard-host=127.0.0.1",
            f"--metrics-export-port={metrics_port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--include-dashboard=true",
            "--disable-usage-stats",
            timeout=120,
        )
        timings["ray start"] = time.monotonic() - t0
        runtime_env = {
            "env_vars": {"ORDERS_TABLE": str(table)},
            "excludes": [".venv", ".git", "bench", "tests", "**/__pycache__", "*.egg-info"],
        }
        run(
            str(BIN / "ray"),
            "job",
            "submit",
            f"--address=http://127.0.0.1:{dash}",
            f"--submission-id={job_id}",
            "--no-wait",
            "--working-dir=.",
            f"--runtime-env-json={json.dumps(runtime_env)}",
            "--",
            "rayconnect",
            "run",
            EXAMPLE,
            "--embedded-broker",
            f"--demo-records={RECORDS}",
            f"--partitions={PARTITIONS}",
            "--interval=1",
        )

        def job(command: str) -> str:
            """``ray job <command>`` (logs, status) of the submitted job, its output."""
            return run(
                str(BIN / "ray"),
                "job",
                command,
                f"--address=http://127.0.0.1:{dash}",
                job_id,
                check=False,
            ).stdout

        def job_logs() -> str:
            return job("logs")

        # rows in the table (the pipeline commits every 5 s)
        deadline = time.monotonic() + 240
        rows = 0
        while time.monotonic() < deadline:
            state = job("status")
            assert not re.search(r"failed|stopped", state, re.I), f"{state}\n{job_logs()[-3000:]}"
            if (table / "_delta_log").exists():
                try:
                    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["offset"]).num_rows
                except Exception:
                    rows = 0
                if rows >= RECORDS:
                    break
            time.sleep(1)
        timings["submit -> all rows"] = time.monotonic() - t0 - timings["ray start"]
        assert rows == RECORDS, f"{rows} rows in the table; job logs:\n{job_logs()[-3000:]}"

        # rayconnect status --json from another process, against the same cluster
        out = run(
            str(BIN / "rayconnect"), "status", "orders", "--json", f"--address=127.0.0.1:{gcs}"
        ).stdout
        status = json.loads(out)
        parts = status["partition_status"]
        assert sum(p["committed_offset"] for p in parts.values()) == RECORDS
        assert all(p["lag"] == 0 for p in parts.values()), parts
        assert all(p["high_watermark"] == RECORDS // PARTITIONS for p in parts.values()), parts
        assert status["rounds_since_start"]["committed"] >= 1
        actor_names = {a["name"]: a["state"] for a in status["actors"]}
        assert actor_names["orders/coordinator"] == "ALIVE"
        assert actor_names["orders/writer"] == "ALIVE"
        assert "orders/participants/local/orders/0" in actor_names  # one host holds them all
        text = run(str(BIN / "rayconnect"), "status", "orders", f"--address=127.0.0.1:{gcs}").stdout
        assert "local/orders/0" in text and "orders/reader/local/0" in text
        listed = run(str(BIN / "rayconnect"), "list", f"--address=127.0.0.1:{gcs}").stdout
        assert re.search(r"^orders\s", listed, re.M), listed

        # the dashboard's actor list shows the pipeline's shape by name
        with urllib.request.urlopen(
            f"http://127.0.0.1:{dash}/api/v0/actors?limit=1000", timeout=30
        ) as resp:
            dash_actors = json.loads(resp.read())["data"]["result"]["result"]
        dash_names = {a.get("name") for a in dash_actors}
        assert {"orders/coordinator", "orders/writer", "orders/reader/local/0"} <= dash_names

        # Prometheus: values settle once everything is committed (reported every 1 s)
        offsets = {k: p["committed_offset"] for k, p in parts.items()}
        deadline = time.monotonic() + 60
        while True:
            m = _scrape(metrics_port)
            read = (
                {dict(k)["partition"]: v for k, v in m["ray_rayconnect_records_read"].items()}
                if "ray_rayconnect_records_read" in m
                else {}
            )
            committed = {
                "/".join(dict(k)[t] for t in ("cluster", "topic", "partition")): v
                for k, v in m.get("ray_rayconnect_committed_offset", {}).items()
            }
            ok = (
                # a partition seeks back to the table's offset at START: reads may repeat
                _total(m, "ray_rayconnect_records_read") >= RECORDS
                and _total(m, "ray_rayconnect_records_written") == RECORDS
                and committed == offsets
                and _total(m, "ray_rayconnect_read_lag") == 0
                and _total(m, "ray_rayconnect_rounds_committed") >= 1
                and _total(m, "ray_rayconnect_round_duration_s_count") >= 1
                and _total(m, "ray_rayconnect_commit_latency_s_count") >= 1
                # gauges arrive with their worker's own report (seen missing while every
                # counter was in): wait for them too, not only for the totals
                and len(m.get("ray_rayconnect_high_watermark", {})) == PARTITIONS
                and len(m.get("ray_rayconnect_read_lag", {})) == PARTITIONS
            )
            if ok or time.monotonic() > deadline:
                break
            time.sleep(1)
        print({k: dict(v) for k, v in m.items() if "_bucket" not in k})
        assert ok, {k: (_total(m, k) if "_bucket" not in k else "...") for k in sorted(m)} | {
            "committed": committed,
            "expected": offsets,
        }
        assert sorted(read) == [str(p) for p in range(PARTITIONS)]
        assert all(v >= RECORDS // PARTITIONS for v in read.values())
        hw = m["ray_rayconnect_high_watermark"]
        assert {dict(k)["partition"]: v for k, v in hw.items()} == {
            str(p): RECORDS // PARTITIONS for p in range(PARTITIONS)
        }
        assert all(dict(k)["pipeline"] == "orders" for k in m["ray_rayconnect_bytes_read"])

        # records are committed while Spark still starts, so the job's `run` may not have
        # returned from start() yet: stop it once it watches (its first status line), which
        # is the stop this test is about
        deadline = time.monotonic() + 240
        while not re.search(r"orders: committed [\d,]+ records", job_logs()):
            assert time.monotonic() < deadline, job_logs()[-3000:]
            time.sleep(2)

        # rayconnect stop: the job's foreground `run` notices and exits 0
        t1 = time.monotonic()
        stopped = run(
            str(BIN / "rayconnect"), "stop", "orders", f"--address=127.0.0.1:{gcs}", timeout=180
        )
        assert "stopped orders" in stopped.stdout
        deadline = time.monotonic() + 120
        state = ""
        while time.monotonic() < deadline:
            state = job("status")
            if re.search(r"succeeded|failed|stopped", state, re.I):
                break
            time.sleep(1)
        timings["stop"] = time.monotonic() - t1
        logs = job_logs()
        assert re.search(r"succeeded", state, re.I), f"{state}\n{logs[-3000:]}"
        assert "pipeline 'orders' was stopped" in logs
        assert re.search(r"orders: committed [\d,]+ records", logs), logs[-3000:]
        again = run(
            str(BIN / "rayconnect"), "status", "orders", f"--address=127.0.0.1:{gcs}", check=False
        )
        assert again.returncode == 4, again
    finally:
        kill_pids(pids_of(str(temp_dir)))
        shutil.rmtree(temp_dir, ignore_errors=True)
        print("\ntimings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
