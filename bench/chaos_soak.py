"""Chaos soak: a sink and a source pipeline on a Ray cluster of test hosts, a random fault
every 10-30 s, a checker every minute (issue 30). Run on purpose, as root (network
namespaces); a 5-minute version is in the ``slow`` pytest group
(tests/integration/netns/test_chaos_soak.py).

    .venv/bin/python bench/chaos_soak.py --minutes 30          # writes bench/results/chaos/

Hosts (tests/fixtures/netns.py): ``store`` (the sink's broker, durable on an object store of
its own; the source's broker; the table's object store), Ray nodes ``control`` (coordinator,
enumerator, writer) and ``ingest`` (readers, participant hosts), the Ray head and this
process in the root namespace. The sink pipeline reads 16 partitions of typed JSON (5
declared fields) fed at a steady rate into a Delta table on the store; the source pipeline
(a generator, 4 source partitions) writes exactly-once into a topic of the source broker.

Faults, one kind at random, each followed by a wait until the sink has committed every
record acknowledged before the fault ended and the source writes again (its recovery time): ``kill`` (ray.kill or
SIGKILL of a random actor of either pipeline), ``node`` (a Ray node's processes all
SIGKILLed, the node started again 10 s later), ``broker`` (the sink's broker SIGKILLed,
started again 2-10 s later), ``network`` (a partition between the Ray nodes, a one-way cut
of a node from the store, a node cut from the head, a slow link or a link down, 5-30 s),
``store`` (the table's object store down 5-60 s) and ``upkeep`` (a compaction and a VACUUM
of the table by an outside writer). The checker reads the table and the source topic every
minute: no duplicate, no gap below the committed offsets, the source's sequences whole.

The report (``results.json``, ``results.md``, ``run.log``, ``chaos.png``) is written after
every fault and every check, and once more at the end (``"complete": true``): a run that
hangs or dies late keeps what it saw. Beside each memory sample the machine's 1-minute load
average (the recovery times are loaded when other jobs share the machine).

The sink topic's producer sends once a second (~12 records a partition per batch), not a
record at a time: tansu's S3 engine stores every produce batch as an object and lists all of
a partition's objects for every Fetch and ListOffsets, so the per-request cost grows with the
object count (measured: ListOffsets(latest) of 16 partitions 0.26 s at 500 objects a
partition, 4.6 s at 5,000, 12-13 s at 5,000 right after a SIGKILL and restart). The
30-minute run of a record per batch had ~17,000 objects a partition when the sink broker was
SIGKILLed the second time; the admin high-watermark probe (ListOffsets first, 10 s in all)
never fit again, and the readers' fetches slowed with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "integration")]  # the test hosts, ray_tmp

from fixtures.netns import TestNetwork, why_no_namespaces  # noqa: E402
from fixtures.netns_ray import ROLES_ON_HOSTS, NetnsRayCluster  # noqa: E402
from fixtures.processes import pids_of  # noqa: E402
from ray_tmp import cleaned_ray_tmp  # noqa: E402

import rayconnect as rc  # noqa: E402
from rayconnect.actors.directory import pipeline_actor_names  # noqa: E402
from rayconnect.demo import chaos  # noqa: E402
from rayconnect.kafka.admin import create_topic, demo_value, high_watermarks  # noqa: E402
from rayconnect.kafka.broker_storage import on_s3  # noqa: E402
from rayconnect.kafka.embedded import EmbeddedBroker  # noqa: E402
from rayconnect.kafka.read_back import read_topic  # noqa: E402
from rayconnect.source_tasks.generator import sequences  # noqa: E402
from rayconnect.storage.embedded_s3 import EmbeddedS3  # noqa: E402

OUT = Path(__file__).parent / "results" / "chaos"
SINK, SOURCE = "soak", "soak-src"
TOPIC, SOURCE_TOPIC, PARTITIONS = "orders", "generated", 16
WORKERS = {"control": 1, "ingest": 1}
#: demo_value's fields, declared: the table is typed, nothing inferred
SCHEMA = {"id": "long", "key": "string", "ts": "timestamp_millis", "amount": "long"}
KINDS = ("kill", "node", "broker", "network", "store", "upkeep")
NETWORK_FAULTS = ("partition", "one-way", "cut-from-head", "slow", "link-down")
RECOVERY_LIMIT_S = 240.0


async def topic_offsets(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, set[int]]:
    """Partition -> the offsets the topic holds below ``ends``, read from the start. Not
    through ``read_to_high_watermarks``: after a SIGKILL the broker's log may have a hole at
    its end, and the high watermark probe that seeks just below the end then never gets an
    answer (seen in the 30-minute soak)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from rayconnect.kafka import compat

    consumer = compat.own(  # rayconnect's fetch pacing after a broker restart
        AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
    )
    await consumer.start()
    held: dict[int, set[int]] = {p: set() for p in ends}
    try:
        tps = [TopicPartition(topic, p) for p, end in ends.items() if end]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                held[tp.partition].update(r.offset for r in records)
            if all(await consumer.position(tp) >= ends[tp.partition] for tp in tps):
                break
    finally:
        await consumer.stop()
    return held


class Producer(threading.Thread):
    """Demo records at ``rate``/s round-robin over the partitions, sent every ``tick_s`` (a
    batch a partition; see the module's note on tansu's objects); keeps, per partition, the
    offset after the last acknowledged record. A failed send (broker down) is counted and
    the schedule goes on: what matters downstream is offsets, not ids."""

    def __init__(self, bootstrap: str, rate: float, tick_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.rate, self.tick_s = bootstrap, rate, tick_s
        self.acked: dict[int, int] = dict.fromkeys(range(PARTITIONS), 0)
        self.sent = self.failed = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        from aiokafka import AIOKafkaProducer

        # a broker down is a fault injected here: its retries are not news
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", linger_ms=5, request_timeout_ms=10_000
        )
        await producer.start()
        t0, i = time.monotonic(), 0
        try:
            while not self.stop_event.is_set():
                due = int((time.monotonic() - t0) * self.rate)
                futures = []
                for n in range(i, due):
                    p = n % PARTITIONS
                    try:
                        sent = await producer.send(
                            TOPIC, demo_value(n, f"key-{n}"), key=f"key-{n}".encode(), partition=p
                        )
                        futures.append(sent)
                    except Exception:
                        self.failed += 1
                i = max(i, due)
                for result in await asyncio.gather(*futures, return_exceptions=True):
                    if isinstance(result, BaseException):
                        self.failed += 1
                    else:
                        self.sent += 1
                        self.acked[result.partition] = max(
                            self.acked[result.partition], result.offset + 1
                        )
                await asyncio.sleep(self.tick_s)
        finally:
            await producer.stop()


class Memory(threading.Thread):
    """Every ``period_s``: the RSS of every process of the soak (the hosts' namespaces, the
    head's processes, this one) and the machine's used memory, in MB, and the machine's
    1-minute load average."""

    def __init__(self, net: TestNetwork, ray_root: Path, period_s: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.net, self.ray_root, self.period_s = net, ray_root, period_s
        self.samples: list[tuple[float, int, int, float]] = []
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def sample(self) -> None:
        pids = {os.getpid()} | pids_of(str(self.ray_root))
        for host in self.net.hosts.values():
            pids |= host.pids()
        rss = 0
        for pid in pids:
            try:
                rss += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                continue
        used = psutil.virtual_memory().used
        load = round(os.getloadavg()[0], 1)
        self.samples.append((round(time.monotonic() - self.t0), rss >> 20, used >> 20, load))

    def run(self) -> None:
        while not self.stop_event.wait(self.period_s):
            self.sample()


class Soak:
    def __init__(self, args: argparse.Namespace, net: TestNetwork, ray_root: Path) -> None:
        self.args, self.net, self.ray_root = args, net, ray_root
        self.rng = random.Random(args.seed)
        self.faults: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.log: list[str] = []
        self.t0 = time.monotonic()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "run.log").write_text("")

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {text}"
        self.log.append(line)
        print(line, flush=True)
        with (self.out / "run.log").open("a") as f:
            f.write(line + "\n")

    def save(self, complete: bool = False) -> dict[str, Any]:
        """Write the report as it stands (after every fault and check, and at the end)."""
        report = self.report(complete)
        (self.out / "results.json").write_text(json.dumps(report, indent=1))
        (self.out / "results.md").write_text(markdown(report))
        try:
            plot(report, self.out)
        except Exception as e:  # a figure is not worth the report
            self.say(f"plot failed: {type(e).__name__}: {e}")
        return report

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        store = self.net["store"]
        on_store = {"host": store.ip, "launch_prefix": store.command()}
        self.table_s3 = EmbeddedS3(**on_store).start()
        self.broker_s3 = EmbeddedS3(**on_store).start()
        self.sink_broker = EmbeddedBroker("sink", storage=on_s3(self.broker_s3), **on_store).start()
        self.source_broker = EmbeddedBroker("source", **on_store).start()
        self.cluster = NetnsRayCluster(self.net, self.ray_root, WORKERS)
        self.cluster.start()
        bucket = self.table_s3.new_bucket("soak")
        self.sink = rc.DeltaSink(
            f"s3://{bucket}/orders", storage_options=self.table_s3.storage_options
        )
        bs = self.sink_broker.bootstrap_servers
        asyncio.run(create_topic(bs, TOPIC, PARTITIONS))
        asyncio.run(create_topic(self.source_broker.bootstrap_servers, SOURCE_TOPIC, 4))
        self.producer = Producer(bs, self.args.rate)
        self.producer.start()
        meta = rc.StaticMetadataService(
            (rc.KafkaStream(TOPIC, {"sink": rc.ClusterMetadata(bs, (TOPIC,))}),)
        )
        source = rc.KafkaSource(meta, value_format="json", value_schema=SCHEMA)
        self.sink_handle = rc.SinkPipeline(
            SINK,
            source,
            self.sink,
            commit_interval_s=2,
            write_timeout_s=20,
            spark=rc.SparkSettings(
                executors=1,
                executor_memory="512MB",
                executor_wait_s=90,
                executor_lost_s=30,
                start="with_pipeline",  # the soak's kills and node losses reach Spark too
            ),
            placement=ROLES_ON_HOSTS,
        ).start(timeout_s=300)
        generator = rc.GeneratorSource(
            SOURCE_TOPIC, partitions=4, batch_size=20, poll_delay_s=0.4, value_size=100
        )
        self.source_handle = rc.SourcePipeline(
            SOURCE, task=generator, target=rc.KafkaTarget(self.source_broker.bootstrap_servers)
        ).start()
        self.memory = Memory(self.net, self.ray_root)
        self.memory.start()
        self.wait_recovered("start", time.monotonic())

    def start_retrying(self, attempts: int = 5) -> None:
        """``start``, again after a failed start (all stopped first): under a load of 50-100
        ``ray start --head`` outlived Ray's fixed 30 s wait for its raylet twice in a row."""
        for attempt in range(1, attempts + 1):
            try:
                self.start()
                return
            except Exception as e:
                if attempt == attempts:
                    raise
                self.say(f"start failed ({type(e).__name__}: {str(e)[-300:]}); again")
                self.stop()
                time.sleep(30)

    def stop(self) -> None:
        """Stop what was started (each part once: a retried start stops twice)."""
        parts = self.__dict__
        for name in ("source_handle", "sink_handle"):
            if name in parts:
                try:
                    parts.pop(name).stop(timeout_s=60)
                except Exception as e:
                    self.say(f"stopping {name}: {type(e).__name__}: {e}")
        for name in ("producer", "memory"):
            if name in parts:
                parts[name].stop_event.set()  # kept: the report reads them
        if "cluster" in parts:
            parts.pop("cluster").stop()
        for name in ("source_broker", "sink_broker", "broker_s3", "table_s3"):
            if name in parts:
                parts.pop(name).stop()

    # -- recovery -------------------------------------------------------------------------

    def committed(self, timeout_s: float = 10.0) -> dict[int, int]:
        offsets = self.sink_handle.status(timeout_s=timeout_s)["offsets"]
        return {int(k.rsplit("/", 1)[1]): v for k, v in offsets.items()}

    def sink_high_watermarks(self) -> dict[int, int]:
        """The sink topic's high watermarks as the pipeline's readers see them (the admin
        probe can hang on a log the SIGKILLed broker left with a hole at its end)."""
        deadline = time.monotonic() + RECOVERY_LIMIT_S
        while True:
            try:
                found = self.sink_handle.status(timeout_s=10)["partition_status"]
                marks = {int(k.rsplit("/", 1)[1]): s.high_watermark for k, s in found.items()}
                if len(marks) == PARTITIONS and None not in marks.values():
                    return marks
            except Exception:
                if time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def source_written(self) -> int:
        marks = asyncio.run(high_watermarks(self.source_bs, SOURCE_TOPIC))
        return sum(marks.values())

    def wait_recovered(self, what: str, healed_at: float) -> float | None:
        """Seconds from ``healed_at`` until the sink committed every record acknowledged by
        then and the source wrote again; None (a violation) if not within
        RECOVERY_LIMIT_S. Each partition's own catch-up time is kept (``last_catch_up``):
        liveness is per partition - one partition that never moves is the failure a sum
        hides (issue 41)."""
        target = dict(self.producer.acked)
        caught: dict[int, float] = {}
        self.last_catch_up = caught
        try:
            source_before: int | None = self.source_written()
        except Exception:
            source_before = None  # the source's broker is not faulted: a slow answer
        while time.monotonic() - healed_at < RECOVERY_LIMIT_S:
            try:
                if len(caught) < len(target):
                    done = self.committed()
                    now = time.monotonic() - healed_at
                    for p, n in target.items():
                        if p not in caught and done.get(p, 0) >= n:
                            caught[p] = now
                sink_done = len(caught) == len(target)
                if sink_done and (source_before is None or self.source_written() > source_before):
                    return time.monotonic() - healed_at
            except Exception:
                pass  # a coordinator restarting
            time.sleep(1.0)
        behind = sorted(set(target) - set(caught))
        self.violations.append(
            f"{what}: lag did not recover in {RECOVERY_LIMIT_S:.0f} s (partitions behind: "
            f"{behind or 'none; the source did not write again'})"
        )
        return None

    def ensure_nodes(self) -> None:
        """A node Ray declared dead during a fault is started again (its raylet, told it
        is dead once reachable, exits with its workers)."""
        time.sleep(2)
        for name in WORKERS:
            if name not in self.cluster.alive_nodes():
                host = self.net[name]
                deadline = time.monotonic() + 30
                while host.pids() and time.monotonic() < deadline:
                    time.sleep(1)
                host.kill_all()
                self.cluster.add(name)
                self.say(f"  node {name} started again")
        self.cluster.wait_for_nodes(len(WORKERS) + 1)

    # -- faults ---------------------------------------------------------------------------

    def inject(self, kind: str) -> tuple[str, float]:
        """Inject one fault of ``kind`` and undo it; returns (what, when it ended)."""
        rng = self.rng
        if kind == "kill":
            actors = pipeline_actor_names(SINK) + pipeline_actor_names(SOURCE)
            name, how = rng.choice(actors), rng.choice(chaos.HOW)
            chaos.kill_actor(name, how)
            return f"{how} {name}", time.monotonic()
        if kind == "node":
            name = rng.choice(list(WORKERS))
            self.cluster.remove(name)
            time.sleep(10)
            self.cluster.add(name)
            self.cluster.wait_for_nodes(len(WORKERS) + 1)
            return f"node {name} removed 10 s", time.monotonic()
        if kind == "broker":
            down = rng.uniform(2, 10)
            os.kill(self.sink_broker.pid or 0, signal.SIGKILL)
            time.sleep(down)
            self.sink_broker.start()
            return f"sink broker SIGKILL, {down:.0f} s down", time.monotonic()
        if kind == "network":
            return self.network_fault(rng.choice(NETWORK_FAULTS), rng.uniform(5, 30))
        if kind == "store":
            down = rng.uniform(5, 60)
            self.table_s3.kill()
            time.sleep(down)
            self.table_s3.start()
            return f"table store down {down:.0f} s", time.monotonic()
        if kind == "upkeep":
            from deltalake import DeltaTable

            table = DeltaTable(self.sink.path, storage_options=self.sink.storage_options)
            metrics = table.optimize.compact()
            table = DeltaTable(self.sink.path, storage_options=self.sink.storage_options)
            gone = table.vacuum(retention_hours=1, enforce_retention_duration=False, dry_run=False)
            what = f"outside compaction ({metrics.get('numFilesRemoved')} files) + VACUUM"
            return f"{what} ({len(gone)} deleted)", time.monotonic()
        raise ValueError(kind)

    def network_fault(self, fault: str, seconds: float) -> tuple[str, float]:
        control, ingest, store = self.net["control"], self.net["ingest"], self.net["store"]
        host = self.rng.choice([control, ingest])
        if fault == "partition":
            control.partition_from(ingest)
            what = "control<->ingest"
        elif fault == "one-way":
            host.drop_to(store)
            what = f"{host.name}->store one-way"
        elif fault == "cut-from-head":
            host.cut_from_root()
            what = f"{host.name} cut from head"
        elif fault == "slow":
            host.slow("1mbit")
            what = f"{host.name} slow 1 Mbit/s"
        else:
            host.link_down()
            what = f"{host.name} link down"
        try:
            time.sleep(seconds)
        finally:
            self.net.heal()
        ended = time.monotonic()
        self.ensure_nodes()
        return f"{what} {seconds:.0f} s", ended

    # -- checks ---------------------------------------------------------------------------

    def check(self) -> dict[str, Any]:
        """No duplicate and no gap below the committed offsets in the table; the source
        topic's sequences whole (each source partition 0..n-1 once, in order)."""
        from deltalake import DeltaTable

        committed = self.committed(timeout_s=20)
        table = DeltaTable(self.sink.path, storage_options=self.sink.storage_options)
        rows = table.to_pyarrow_table(columns=["_kafka_partition", "_kafka_offset"])
        pairs = list(
            zip(
                rows["_kafka_partition"].to_pylist(), rows["_kafka_offset"].to_pylist(), strict=True
            )
        )
        dupes = sum(c - 1 for c in Counter(pairs).values() if c > 1)
        have: dict[int, set[int]] = {}
        for p, o in pairs:
            have.setdefault(p, set()).add(o)
        missing = {p: set(range(n)) - have.get(p, set()) for p, n in committed.items() if n}
        lost = 0
        if any(missing.values()):  # is it the table's gap, or one in the topic itself?
            held = asyncio.run(topic_offsets(self.sink_broker.bootstrap_servers, TOPIC, committed))
            for p, gone in missing.items():
                lost += len(gone - held.get(p, set()))
                missing[p] = gone & held.get(p, set())
        gaps = sum(len(gone) for gone in missing.values())
        values = [json.loads(v) for _, v in asyncio.run(read_topic(self.source_bs, SOURCE_TOPIC))]
        seqs = sequences(values)
        broken = [p for p, got in seqs.items() if got != list(range(len(got)))]
        result = {
            "at_s": round(time.monotonic() - self.t0),
            "table_rows": len(pairs),
            "committed": sum(committed.values()),
            "duplicates": dupes,
            "gaps_below_committed": gaps,
            # offsets the broker itself no longer holds (lost by a SIGKILLed tansu)
            "broker_lost_offsets": lost,
            "source_records": len(values),
            "source_partitions_broken": broken,
        }
        if dupes or gaps or broken:
            self.violations.append(f"check at {result['at_s']} s: {result}")
        return result

    @property
    def source_bs(self) -> str:
        return self.source_broker.bootstrap_servers

    def checked(self) -> None:
        try:
            result = self.check()
        except Exception as e:  # the store or a coordinator away: the next check counts
            self.say(f"check skipped: {type(e).__name__}: {str(e)[:200]}")
            return
        self.checks.append(result)
        self.say(f"check: {result}")
        self.save()

    # -- the run --------------------------------------------------------------------------

    def run(self) -> None:
        end = time.monotonic() + self.args.minutes * 60  # from the pipelines' start
        next_check = time.monotonic() + 60
        while time.monotonic() < end:
            pause = self.rng.uniform(10, 30)
            while pause > 0 and time.monotonic() < end:
                if time.monotonic() >= next_check:
                    self.checked()
                    next_check = time.monotonic() + 60
                step = min(pause, 1.0)
                time.sleep(step)
                pause -= step
            if time.monotonic() >= end:
                break
            kind = self.rng.choice(self.args.kinds)
            started = time.monotonic()
            self.say(f"fault: {kind} ...")
            try:
                what, ended = self.inject(kind)
            except Exception as e:
                what, ended = f"{kind} failed to inject: {type(e).__name__}: {e}", time.monotonic()
                self.net.heal()
                self.ensure_nodes()
            recovered = self.wait_recovered(what, ended)
            slowest = max(self.last_catch_up.items(), key=lambda pc: pc[1], default=None)
            fault = {
                "kind": kind,
                "what": what,
                "at_s": round(started - self.t0, 1),
                "lasted_s": round(ended - started, 1),
                "recovery_s": None if recovered is None else round(recovered, 1),
                # the partition that caught up last, and when (None: one never did)
                "slowest_partition": None if slowest is None else slowest[0],
                "slowest_partition_s": None
                if slowest is None or recovered is None
                else round(slowest[1], 1),
            }
            self.faults.append(fault)
            self.say(f"  {what}: recovered in {fault['recovery_s']} s")
            self.save()
        try:
            self.final_check()
        except Exception as e:
            self.violations.append(f"final check failed: {type(e).__name__}: {e}")

    def final_check(self) -> None:
        """Producer stopped: the table must hold exactly every offset up to the high
        watermarks, once, and the committed offsets equal them."""
        self.producer.stop_event.set()
        self.producer.join(30)
        time.sleep(5)  # the readers see the last records' high watermarks
        marks = self.sink_high_watermarks()
        deadline = time.monotonic() + RECOVERY_LIMIT_S
        committed: dict[int, int] = {}
        while time.monotonic() < deadline:
            try:
                committed = self.committed()
                if all(committed.get(p, 0) >= n for p, n in marks.items()):
                    break
            except Exception:
                pass
            time.sleep(1)
        if committed != {p: n for p, n in marks.items() if n}:
            self.violations.append(f"final: committed {committed} != high watermarks {marks}")
        last: dict[str, Any] = {}
        for _ in range(3):  # the last check must be read, not skipped
            try:
                last = self.check()
                self.checks.append(last)
                break
            except Exception as e:
                self.say(f"final check: {type(e).__name__}: {str(e)[:200]}")
                time.sleep(10)
        held = last.get("table_rows", 0) + last.get("broker_lost_offsets", 0)
        if held != sum(marks.values()):
            self.violations.append(
                f"final: {last.get('table_rows')} rows + {last.get('broker_lost_offsets')} "
                f"offsets the broker lost != {sum(marks.values())} offsets"
            )
        self.final = {"high_watermarks": sum(marks.values()), **last}

    # -- report ---------------------------------------------------------------------------

    def report(self, complete: bool = False) -> dict[str, Any]:
        by_kind: dict[str, list[float | None]] = {}
        slowest: dict[str, list[float]] = {}
        for f in self.faults:
            by_kind.setdefault(f["kind"], []).append(f["recovery_s"])
            if f.get("slowest_partition_s") is not None:
                slowest.setdefault(f["kind"], []).append(f["slowest_partition_s"])
        kinds = {}
        for kind, times in sorted(by_kind.items()):
            ok = sorted(t for t in times if t is not None)
            kinds[kind] = {
                "faults": len(times),
                "recovered": len(ok),
                # the slowest partition's catch-up after a fault of this kind
                "slowest_partition_max_s": max(slowest.get(kind) or [0.0]) if ok else None,
                "max_s": max(ok) if ok else None,
                "p99_s": round(ok[min(len(ok) - 1, int(0.99 * len(ok)))], 1) if ok else None,
                "median_s": round(statistics.median(ok), 1) if ok else None,
            }
        mem = list(self.memory.samples) if hasattr(self, "memory") else []
        producer = getattr(self, "producer", None)
        return {
            "complete": complete,
            "elapsed_s": round(time.monotonic() - self.t0),
            "minutes": self.args.minutes,
            "seed": self.args.seed,
            "rate_per_s": self.args.rate,
            "records_produced": producer.sent if producer else 0,
            "produce_failures": producer.failed if producer else 0,
            "final": getattr(self, "final", {}),
            "faults_by_kind": kinds,
            "faults": self.faults,
            "checks": self.checks,
            "violations": self.violations,
            "memory_mb": {
                "first": mem[0] if mem else None,
                "max_rss": max(m[1] for m in mem) if mem else None,
                "last": mem[-1] if mem else None,
                "max_load": max(m[3] for m in mem) if mem else None,
                "samples": mem,  # (s, RSS of the soak's processes MB, machine used MB, load)
            },
            "log": self.log,
        }


def markdown(r: dict[str, Any]) -> str:
    state = "" if r["complete"] else f" (IN PROGRESS or cut short at {r['elapsed_s']} s)"
    lines = [
        f"# Chaos soak: {r['minutes']} min, seed {r['seed']}, {r['rate_per_s']} records/s{state}",
        "",
        "| fault kind | injected | recovered | max recovery s | p99 s | median s | "
        "slowest partition s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, k in r["faults_by_kind"].items():
        lines.append(
            f"| {kind} | {k['faults']} | {k['recovered']} | {k['max_s']} | {k['p99_s']} | "
            f"{k['median_s']} | {k.get('slowest_partition_max_s')} |"
        )
    final = r["final"]
    mem = r["memory_mb"]
    lines += [
        "",
        f"records produced (acknowledged): {r['records_produced']}, failed sends "
        f"{r['produce_failures']}; table rows at the end {final.get('table_rows')}, "
        f"high watermarks {final.get('high_watermarks')}, offsets the broker lost "
        f"{final.get('broker_lost_offsets')}; source records "
        f"{final.get('source_records')}",
        f"checks: {len(r['checks'])}; violations: {len(r['violations'])}",
        *[f"- {v}" for v in r["violations"]],
        f"memory (s, RSS of the soak's processes MB, machine used MB, load average): first "
        f"{mem['first']}, last {mem['last']}, max RSS {mem['max_rss']}; max load "
        f"{mem['max_load']}",
        "",
        "| at s | fault | lasted s | recovery s | slowest partition (s) |",
        "| ---: | --- | ---: | ---: | --- |",
        *[
            f"| {f['at_s']} | {f['what']} | {f['lasted_s']} | {f['recovery_s']} | "
            f"{f.get('slowest_partition')} ({f.get('slowest_partition_s')}) |"
            for f in r["faults"]
        ],
        "",
        "| at s | table rows | committed | duplicates | gaps | broker-lost offsets | "
        "source records |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *[
            f"| {c['at_s']} | {c['table_rows']} | {c['committed']} | {c['duplicates']} | "
            f"{c['gaps_below_committed']} | {c['broker_lost_offsets']} | {c['source_records']} |"
            for c in r["checks"]
        ],
        "",
        "memory and load over time (every 2 minutes):",
        "",
        "| at s | RSS of the soak's processes MB | machine used MB | load average (1 min) |",
        "| ---: | ---: | ---: | ---: |",
        *[f"| {t} | {rss} | {used} | {load} |" for t, rss, used, load in mem["samples"][::12]],
    ]
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], out: Path) -> Path:
    """chaos.png: recovery per fault kind (max, p99, median), the checks' table rows and
    violations over time, memory and load average over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (kinds_ax, rows_ax, mem_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    kinds = list(r["faults_by_kind"])
    width = 0.27
    for i, (stat, color) in enumerate(
        (("max_s", "#d62728"), ("p99_s", "#ff7f0e"), ("median_s", "#1f77b4"))
    ):
        vals = [r["faults_by_kind"][k][stat] or 0 for k in kinds]
        kinds_ax.bar(
            [x + (i - 1) * width for x in range(len(kinds))],
            vals,
            width,
            color=color,
            label=stat.removesuffix("_s"),
        )
    kinds_ax.set_xticks(
        range(len(kinds)),
        [
            f"{k}\n{r['faults_by_kind'][k]['recovered']}/{r['faults_by_kind'][k]['faults']}"
            for k in kinds
        ],
    )
    kinds_ax.set_ylabel("recovery s (from the fault's end)")
    kinds_ax.set_title("recovery by fault kind (recovered/injected)")
    kinds_ax.legend(fontsize=8)
    checks = r["checks"]
    rows_ax.plot(
        [c["at_s"] for c in checks], [c["table_rows"] for c in checks], "o-", label="table rows"
    )
    rows_ax.plot(
        [c["at_s"] for c in checks],
        [c["committed"] for c in checks],
        "x--",
        label="committed offsets",
    )
    for f in r["faults"]:
        rows_ax.axvline(f["at_s"], color="#bbbbbb", lw=0.6)
    rows_ax.set_xlabel("s (grey: a fault)")
    rows_ax.set_title(f"checks: {len(checks)}, violations: {len(r['violations'])}")
    rows_ax.legend(fontsize=8)
    samples = r["memory_mb"]["samples"]
    mem_ax.plot([m[0] for m in samples], [m[1] / 1024 for m in samples], label="soak RSS GB")
    mem_ax.plot([m[0] for m in samples], [m[2] / 1024 for m in samples], label="machine used GB")
    mem_ax.set_xlabel("s")
    mem_ax.set_ylabel("GB")
    load_ax = mem_ax.twinx()
    load_ax.plot(
        [m[0] for m in samples],
        [m[3] for m in samples],
        color="#999999",
        lw=0.8,
        label="load average",
    )
    load_ax.set_ylabel("load average (1 min)")
    mem_ax.set_title("memory and load over time")
    mem_ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = out / "chaos.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Run it; returns the report (written to ``args.out`` as it goes and at the end). A
    soak that fails before its end is a violation in the report, not a lost report."""
    with TestNetwork(["store", *WORKERS]) as net, cleaned_ray_tmp() as root:
        run = Soak(args, net, root)
        finished = False
        try:
            run.start_retrying()
            run.say("started: sink and source pipelines running")
            run.run()
            finished = True
        except BaseException as e:
            run.violations.append(f"the soak itself failed: {type(e).__name__}: {e}")
            run.save()
            if not isinstance(e, Exception):
                raise
        finally:
            try:
                run.stop()
            finally:
                report = run.save(complete=finished)
    print(markdown(report))
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=200, help="records/s into the sink topic")
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    ap.add_argument("--out", default=str(OUT))
    return ap.parse_args(argv)


if __name__ == "__main__":
    reason = why_no_namespaces()
    if reason:
        sys.exit(f"chaos soak: {reason}")
    result = soak(parse())
    sys.exit(1 if result["violations"] else 0)
