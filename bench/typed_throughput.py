"""Typed tables at pipeline level: bench (a)'s workload decoded as JSON vs kept raw.

    .venv/bin/python bench/typed_throughput.py [--records 1000000] [--partitions 8]

One broker, one backlog of demo records (~230 B JSON values of 10 fields:
``kafka.admin.demo_value_wide``; ``--narrow``: bench (a)'s ~200 B of 5 fields), then,
over the same records: the one-process baseline raw and with ``--json`` (``json.loads`` per
record -> ``from_pylist`` -> delta-rs, txn app ids), and rayconnect with
``value_format: raw``, ``json`` (inferred) and ``json`` with the 10 fields declared
(``value_schema``), each into its own Delta table, in one Ray session. Prints one JSON object: records/s of each and the ratios the issue asks for
(rayconnect json / raw >= 0.8, rayconnect json / baseline json >= 1.5).
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

from common import RaySession, produce_backlog, run_helper  # noqa: E402
from rc_runner import run_backlog  # noqa: E402

from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402

RC_THROUGHPUT = dict(commit_interval_s=10.0, commit_when_caught_up=True)
#: the demo's wide values, declared (``kafka.admin.demo_value_wide``): the parser is told
#: every column, nothing is inferred
WIDE_SCHEMA = {
    "id": "long",
    "key": "string",
    "ts": "timestamp_millis",
    "amount": "long",
    "price": "double",
    "currency": "string",
    "country": "string",
    "paid": "boolean",
    "created": "timestamp",
    "note": "string",
}
SOURCES = {
    "raw": {"value_format": "raw"},
    "json": {"value_format": "json"},  # inferred: the default without a value_schema
    "json_declared": {"value_format": "json", "value_schema": WIDE_SCHEMA},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--narrow", action="store_true", help="bench (a)'s 5-field values")
    ap.add_argument(
        "--order",
        default="raw,json,json_declared",
        help="the rayconnect runs, in this order (one Ray session: the first one warms it)",
    )
    args = ap.parse_args()
    out: dict = {
        "records": args.records,
        "partitions": args.partitions,
        "value_fields": 5 if args.narrow else 10,
        "load_before": os.getloadavg(),
    }
    work = tempfile.mkdtemp(prefix="rc-typed-bench-")
    broker = EmbeddedBroker("bench").start()
    try:
        bs = broker.bootstrap_servers
        counts = produce_backlog(bs, "typed", args.records, args.partitions, wide=not args.narrow)
        for kind, extra in (("raw", ()), ("json", ("--json",))):
            r = run_helper(
                "baseline.py", bs, "typed", f"{work}/baseline-{kind}", args.records, *extra
            )
            out[f"baseline_{kind}"] = r["records_per_s"]
            print(f"baseline {kind}: {r['records_per_s']:,.0f} rec/s", file=sys.stderr)
        with RaySession():
            kinds = [k for k in args.order.split(",") if not (args.narrow and k == "json_declared")]
            out["order"] = kinds
            for kind in kinds:
                settings = dict(RC_THROUGHPUT, source=SOURCES[kind])
                r = run_backlog(
                    f"typed-{kind}",
                    bs,
                    "typed",
                    f"{work}/rc-{kind}",
                    counts,
                    settings,
                    exclude_pids=(broker.pid,),
                )
                out[f"rayconnect_{kind}"] = r["records_per_s"]
                out[f"rayconnect_{kind}_sustained"] = r["sustained_records_per_s"]
                out[f"rayconnect_{kind}_rounds"] = r["rounds_committed"]
                print(f"rayconnect {kind}: {r['records_per_s']:,.0f} rec/s", file=sys.stderr)
    finally:
        broker.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    out["json_vs_raw"] = out["rayconnect_json"] / out["rayconnect_raw"]
    out["json_vs_raw_sustained"] = (
        out["rayconnect_json_sustained"] / out["rayconnect_raw_sustained"]
    )
    if "rayconnect_json_declared" in out:
        out["json_declared_vs_raw"] = out["rayconnect_json_declared"] / out["rayconnect_raw"]
        out["json_declared_vs_raw_sustained"] = (
            out["rayconnect_json_declared_sustained"] / out["rayconnect_raw_sustained"]
        )
    out["json_vs_baseline_json"] = out["rayconnect_json"] / out["baseline_json"]
    out["at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
