"""Micro-benchmark of the read path's per-record Python work: Kafka records -> Arrow batch.

    .venv/bin/python bench/micro_to_arrow.py [--records 50000] [--repeat 20]

Times ``rayconnect.kafka.to_arrow.records_to_batch`` on one poll's worth of aiokafka
``ConsumerRecord``s (demo records, ~200 B values, no headers; and a variant with headers),
next to the floor any conversion pays (one pass reading ``.value`` of every record) and the
plain ``from_pydict`` the baseline uses. Reports ns per record and records/s of one core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aiokafka.structs import ConsumerRecord  # noqa: E402

from rayconnect.kafka.admin import demo_value  # noqa: E402
from rayconnect.kafka.to_arrow import records_to_batch  # noqa: E402


def make_records(n: int, headers: bool = False) -> list[ConsumerRecord]:
    out = []
    for i in range(n):
        key = f"key-{i}"
        value = demo_value(i, key)
        out.append(
            ConsumerRecord(
                "bench",
                3,
                1000 + i,
                1_700_000_000_000 + i,
                0,
                key.encode(),
                value,
                None,
                len(key),
                len(value),
                [("h", b"v")] if headers else [],
            )
        )
    return out


def timeit(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    from baseline import to_batch as plain_to_batch

    recs = make_records(a.records)
    with_headers = make_records(a.records, headers=True)
    cases = {
        "floor: read .value of each record": lambda: [r.value for r in recs],
        "records_to_batch (no headers)": lambda: records_to_batch("local", recs),
        "records_to_batch (1 header each)": lambda: records_to_batch("local", with_headers),
        "baseline from_pydict (no headers)": lambda: plain_to_batch("local", recs),
    }
    print(f"{a.records:,} records per batch, median of {a.repeat}")
    print(f"{'case':<36} {'ms/batch':>9} {'ns/record':>10} {'Mrec/s':>7}")
    for name, fn in cases.items():
        s = timeit(fn, a.repeat)
        print(
            f"{name:<36} {s * 1e3:>9.2f} {s / a.records * 1e9:>10.0f} {a.records / s / 1e6:>7.2f}"
        )


if __name__ == "__main__":
    main()
