"""The coordinator's own CPU per round, with no Ray, Spark or table: how far one coordinator
goes in partitions (issue 28: "10,000 partitions in 40 simulated hosts, a round's coordinator
CPU <= 50 ms").

One round as the actor sees it: END-COMMIT out, then a WRITE-STATUS per partition in,
unpickled as Ray hands them over (one ``deliver`` call per host carrying its partitions'
statuses, which share the host's one file object, as the host's writer makes it), the
``CommitTable`` effect built, ``commit_succeeded`` -> ACK + the next START.
The table commit itself is not in it (delta-rs's own time, measured by scenario (c)).
Baseline in the same run: the same round at 8 partitions. Usage::

    .venv/bin/python bench/coordinator_alone.py [--partitions 8,64,...] [--hosts 40]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from pathlib import Path

from rayconnect.protocol.coordinator import Coordinator
from rayconnect.protocol.effects import CommitTable
from rayconnect.protocol.messages import WriteStatus
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile

RESULTS = Path(__file__).resolve().parent / "results" / "coordinator"


def _keys(partitions: int, topics: int = 4) -> list[str]:
    per_topic = max(1, partitions // topics)
    return [f"c1/t{i // per_topic}/{i % per_topic}" for i in range(partitions)]


def _deliveries(keys: list[str], hosts: int, epoch: int, txn: int, offset: int) -> list[bytes]:
    """One pickled ``deliver`` per host; its partitions share one file (as the writer makes
    it), 1,000 records each."""
    out: list[bytes] = []
    for h in range(hosts):
        group = tuple(keys[h::hosts])
        shared = DataFile(f"h{h}/r{txn}.parquet", 1 << 20, 1000 * len(group), shared_by=group)
        statuses = [
            WriteStatus(epoch, txn, k, (shared,), offset, offset + 1000, 1000) for k in group
        ]
        out.append(pickle.dumps(statuses, protocol=5))
    return out


def one_size(partitions: int, hosts: int, rounds: int) -> dict[str, float]:
    keys = _keys(partitions)
    hosts = min(hosts, partitions)
    coord = Coordinator("bench", keys, CommitSettings(commit_interval_s=1.0, write_timeout_s=60.0))
    coord.recover(1, {k: 0 for k in keys}, now=0.0)
    now, cpu = 0.0, []
    for txn in range(1, rounds + 1):
        wire = _deliveries(keys, hosts, 1, txn, (txn - 1) * 1000)  # made by the hosts: not timed
        now += 1.0
        t0 = time.process_time()
        coord.tick(now)
        commit = None
        for raw in wire:
            for status in pickle.loads(raw):
                for effect in coord.step(status, now):
                    if isinstance(effect, CommitTable):
                        commit = effect
        assert commit is not None, "the round did not reach its commit"
        coord.commit_succeeded(txn, now)
        cpu.append(time.process_time() - t0)
    assert coord.status().rounds_committed == rounds
    return {
        "partitions": partitions,
        "hosts": hosts,
        "round_cpu_ms_median": 1000 * statistics.median(cpu),
        "round_cpu_ms_max": 1000 * max(cpu),
        "us_per_partition": 1e6 * statistics.median(cpu) / partitions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="8,64,256,1024,4096,10000")
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    sizes = [int(p) for p in args.partitions.split(",")]
    base = one_size(8, args.hosts, args.rounds)
    rows = [one_size(n, args.hosts, args.rounds) for n in sizes]
    print(
        f"{'partitions':>10} {'hosts':>5} {'round CPU ms (median)':>22} {'max':>8} "
        f"{'us/partition':>13} {'x 8-partition round':>20}"
    )
    for r in rows:
        print(
            f"{r['partitions']:>10} {r['hosts']:>5} {r['round_cpu_ms_median']:>22.2f} "
            f"{r['round_cpu_ms_max']:>8.2f} {r['us_per_partition']:>13.1f} "
            f"{r['round_cpu_ms_median'] / base['round_cpu_ms_median']:>20.1f}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "coordinator_alone.json").write_text(
        json.dumps({"baseline_8": base, "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
