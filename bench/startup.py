"""Start-up: how long ``start()`` takes and when the first records are in the table.

    .venv/bin/python bench/startup.py [--records 200000] [--partitions 8] [--no-wait]

A backlog of ``--records`` demo records over ``--partitions`` partitions is in the broker
before the pipeline starts (rayconnect's defaults); prints one JSON object: ``start_s``
(``start()`` returning, ``--no-wait``: without waiting for Spark), its phases, the first
data version's commit time and the last record's, all from the call to ``start()`` (Ray is
up before it), and the load average. Issue 28 point 3; not part of ``run.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RaySession,
    cleanup_private_tmp,
    delta_visibility,
    produce_backlog,
)
from rc_runner import pipeline, stop, wait_committed  # noqa: E402

from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--no-wait", action="store_true", help="start(wait_for_spark=False)")
    a = ap.parse_args()
    with EmbeddedBroker("startup") as broker, tempfile.TemporaryDirectory() as tmp:
        bs = broker.bootstrap_servers
        counts = produce_backlog(bs, "startup", a.records, a.partitions)
        with RaySession():
            handle = None
            table = f"{tmp}/t"
            load_before = os.getloadavg()[0]
            t0 = time.time()
            try:
                p = pipeline("startup", bs, "startup", table)
                handle = p.start(wait_for_spark=False) if a.no_wait else p.start()
                start_s = time.time() - t0
                wait_committed(handle, "startup", counts, timeout_s=300)
                all_s = time.time() - t0
            finally:
                stop("startup", handle)
        data = [(v, when) for v, when, adds in delta_visibility(table) if adds]
        print(
            json.dumps(
                {
                    "records": a.records,
                    "partitions": a.partitions,
                    "wait_for_spark": not a.no_wait,
                    "start_s": round(start_s, 1),
                    "phases": handle.startup if handle else None,
                    "first_commit_s": round(data[0][1] - t0, 1),
                    "all_committed_s": round(all_s, 1),
                    "versions": len(data),
                    "load_avg_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
                }
            )
        )


if __name__ == "__main__":
    try:
        main()
    finally:
        cleanup_private_tmp()
