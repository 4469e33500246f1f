"""The coordinator's own CPU per round, with no Ray, Spark or table: how far one coordinator
goes in partitions (issue 28: "10,000 partitions in 40 simulated hosts, a round's coordinator
CPU <= 50 ms").

One round as the actor sees it: END-COMMIT out, then each host's ``deliver`` call in,
unpickled as Ray hands it over (its partitions share the host's one file, as the host's
writer makes it), the ``CommitTable`` effect built, ``commit_succeeded`` -> ACK + the next
START; the messages out are addressed to the hosts and pickled as Ray would pickle the calls.
Per host (the default, ``protocol.host_rounds``): one HOST-WRITE-STATUS in per host, one
HOST-ROUND per host per message out. ``--per-partition``: the wire before issue 28 point 1,
a WRITE-STATUS per partition in and a dict of per-partition messages per host out.
The table commit itself is not in it (delta-rs's own time, measured by scenario (c)).
Baseline in the same run: the same round at 8 partitions. Usage::

    .venv/bin/python bench/coordinator_alone.py [--partitions 8,64,...] [--hosts 40]
        [--per-partition] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from pathlib import Path

from rayconnect.protocol.coordinator import Coordinator
from rayconnect.protocol.effects import Broadcast, CommitTable, Ready
from rayconnect.protocol.host_rounds import HostAddresses
from rayconnect.protocol.messages import HostRound, HostWriteStatus, Message, WriteStatus
from rayconnect.protocol.settings import CommitSettings
from rayconnect.protocol.types import DataFile

RESULTS = Path(__file__).resolve().parent / "results" / "coordinator"


def _keys(partitions: int, topics: int = 4) -> list[str]:
    per_topic = max(1, partitions // topics)
    return [f"c1/t{i // per_topic}/{i % per_topic}" for i in range(partitions)]


def _host_of(hosts: int):
    return lambda key: f"h{hash(key) % hosts}"


def _deliveries(
    keys: list[str], hosts: int, epoch: int, txn: int, offset: int, per_host: bool
) -> list[bytes]:
    """One pickled ``deliver`` per host; its partitions share one file (as the writer makes
    it), 1,000 records each."""
    out: list[bytes] = []
    for h in range(hosts):
        group = tuple(keys[h::hosts])
        shared = DataFile(f"h{h}/r{txn}.parquet", 1 << 20, 1000 * len(group), shared_by=group)
        statuses = [
            WriteStatus(epoch, txn, k, (shared,), offset, offset + 1000, 1000) for k in group
        ]
        wire: list[Message] = [HostWriteStatus.of(statuses)] if per_host else list(statuses)
        out.append(pickle.dumps(wire, protocol=5))
    return out


def _send(ready: Ready, addresses: HostAddresses, per_host: bool) -> int:
    """Address a Ready's messages to the hosts and pickle each host's call, as the actor
    and Ray do; returns the bytes sent."""
    sent = 0
    if per_host:
        outbox: dict[str, list[HostRound]] = {}
        for effect in ready:
            if isinstance(effect, Broadcast):
                addresses.address(effect.message, effect.to, outbox)
        for rounds in outbox.values():
            sent += len(pickle.dumps(rounds, protocol=5))
        return sent
    old: dict[str, dict[str, list[Message]]] = {}  # the actor's outbox before point 1
    for effect in ready:
        if isinstance(effect, Broadcast):
            for key in effect.to:
                old.setdefault(addresses._host_of(key), {}).setdefault(key, []).append(
                    effect.message
                )
    for messages in old.values():
        sent += len(pickle.dumps(messages, protocol=5))
    return sent


def one_size(partitions: int, hosts: int, rounds: int, per_host: bool) -> dict[str, float]:
    keys = _keys(partitions)
    hosts = min(hosts, partitions)
    addresses = HostAddresses(_host_of(hosts))
    coord = Coordinator("bench", keys, CommitSettings(commit_interval_s=1.0, write_timeout_s=60.0))
    _send(coord.recover(1, {k: 0 for k in keys}, now=0.0), addresses, per_host)
    now, cpu, wire_in, wire_out = 0.0, [], 0, 0
    for txn in range(1, rounds + 1):
        # made by the hosts: not timed
        wire = _deliveries(keys, hosts, 1, txn, (txn - 1) * 1000, per_host)
        wire_in = sum(len(raw) for raw in wire)
        now += 1.0
        t0 = time.process_time()
        wire_out = _send(coord.tick(now), addresses, per_host)
        commit = None
        for raw in wire:
            for message in pickle.loads(raw):
                for effect in coord.step(message, now):
                    if isinstance(effect, CommitTable):
                        commit = effect
        assert commit is not None, "the round did not reach its commit"
        wire_out += _send(coord.commit_succeeded(txn, now), addresses, per_host)
        cpu.append(time.process_time() - t0)
    assert coord.status().rounds_committed == rounds
    return {
        "partitions": partitions,
        "hosts": hosts,
        "wire": "per host" if per_host else "per partition",
        "bytes_in_per_round": wire_in,
        "bytes_out_per_round": wire_out,
        "round_cpu_ms_median": 1000 * statistics.median(cpu),
        "round_cpu_ms_max": 1000 * max(cpu),
        "us_per_partition": 1e6 * statistics.median(cpu) / partitions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="8,64,256,1024,4096,10000")
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--per-partition", action="store_true", help="the wire before per-host rounds"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "coordinator_alone.json")
    args = parser.parse_args()
    per_host = not args.per_partition
    sizes = [int(p) for p in args.partitions.split(",")]
    base = one_size(8, args.hosts, args.rounds, per_host)
    rows = [one_size(n, args.hosts, args.rounds, per_host) for n in sizes]
    print(
        f"{'partitions':>10} {'hosts':>5} {'wire':>13} {'round CPU ms (median)':>22} "
        f"{'max':>8} {'us/partition':>13} {'x 8-partition round':>20} {'KB in':>8} {'KB out':>8}"
    )
    for r in rows:
        print(
            f"{r['partitions']:>10} {r['hosts']:>5} {r['wire']:>13} "
            f"{r['round_cpu_ms_median']:>22.2f} {r['round_cpu_ms_max']:>8.2f} "
            f"{r['us_per_partition']:>13.1f} "
            f"{r['round_cpu_ms_median'] / base['round_cpu_ms_median']:>20.1f} "
            f"{r['bytes_in_per_round'] / 1000:>8.0f} {r['bytes_out_per_round'] / 1000:>8.0f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"baseline_8": base, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
