"""Pipeline metrics for the Ray dashboard and Prometheus (``ray.util.metrics``).

Every metric is named ``rayconnect_*`` (Prometheus shows it as ``ray_rayconnect_*``: Ray adds
its prefix) and tagged with ``pipeline``; per-partition metrics also carry ``cluster``,
``topic`` and ``partition``. Tags never hold Kafka properties or any other credential.

| metric                          | type      | tags            | recorded by |
|---------------------------------|-----------|-----------------|-------------|
| rayconnect_records_read         | counter   | per partition   | reader      |
| rayconnect_bytes_read           | counter   | per partition   | reader (Arrow bytes) |
| rayconnect_high_watermark       | gauge     | per partition   | reader      |
| rayconnect_read_lag             | gauge     | per partition   | reader: high watermark - next offset to read |
| rayconnect_committed_offset     | gauge     | per partition   | coordinator: next offset, as committed in the table |
| rayconnect_records_written      | counter   | pipeline        | coordinator: records in committed table versions |
| rayconnect_rounds_committed     | counter   | pipeline        | coordinator (partial rounds included) |
| rayconnect_rounds_discarded     | counter   | pipeline        | coordinator |
| rayconnect_round_duration_s     | histogram | pipeline        | coordinator: START to committed |
| rayconnect_commit_latency_s     | histogram | pipeline        | coordinator: the table commit alone |
| rayconnect_dead_letter_records  | counter   | per partition   | whoever routes a record to a dead-letter queue |
| rayconnect_table_records_written | counter | pipeline, table | coordinator: rows committed to a route table (``sink.routes``) |
| rayconnect_table_version        | gauge     | pipeline, table | coordinator: a route table's version, as last committed |
| rayconnect_table_last_commit_time_s | gauge | pipeline, table | coordinator: Unix time of a route table's last commit |
| rayconnect_table_lag            | gauge     | pipeline, table | coordinator, every ``TABLE_LAG_EVERY_S``: records in Kafka not in a route table yet (the sum over its partitions of high watermark - its own offset; the readers' high watermarks) |
| rayconnect_outage_s             | gauge     | pipeline        | coordinator: how long the oldest outage under way (broker unreachable, table store failing) has lasted; 0 when none |
| rayconnect_source_lag_bytes     | gauge     | pipeline, task  | source task: bytes of its source not in Kafka yet (Postgres: WAL behind the slot's confirmed position); 0 when caught up |
| rayconnect_source_lag_s         | gauge     | pipeline, task  | source task: how old the oldest data not in Kafka yet is (Postgres: since the commit of the last transaction read) |

Lag behind the table, per partition, is ``high_watermark - committed_offset`` (a PromQL
expression; ``rayconnect status`` shows it computed). With routes, a partition's
``committed_offset`` is the smallest among its tables, so a table fed by a field route (one
partition, several tables) has its own lag only in ``rayconnect_table_lag``: one series per
table, not per table and partition (that would be 800 more series at 200 tables x 4).

Series (before the tags Ray adds): 5 per partition (records_read, bytes_read,
high_watermark, read_lag, committed_offset; dead_letter_records only for partitions with
dead letters), 4 per route table, and ~32 per pipeline (counters, gauges and the two
histograms' buckets). 200 tables of 4 partitions: 5 x 800 + 4 x 200 + ~32 = ~4,832; measured
4,832 ``ray_rayconnect_*`` series on a Prometheus scrape (``bench/metric_series.py``; 4,632 before ``table_lag``).
Nothing is per record, per file or per round.

Metrics are reported by each worker to its node's metrics agent every
``metrics_report_interval_ms`` (Ray's default 10 s) and served in Prometheus text format on the
node's metrics export port (``ray start --metrics-export-port=8080``; ``ray.init`` picks one
and records it as ``metrics_export_port`` of the node in ``ray.nodes()``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from rayconnect.protocol.types import TopicPartition

PARTITION_TAGS = ("pipeline", "cluster", "topic", "partition")
PIPELINE_TAGS = ("pipeline",)
TABLE_TAGS = ("pipeline", "table")
TASK_TAGS = ("pipeline", "task")

# seconds: a round is ~commit_interval_s (default 10 s), a commit ~10 ms - 1 s
ROUND_BOUNDARIES = [0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300]
COMMIT_BOUNDARIES = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]

# Ray drops a gauge series that was not set again within 2 report intervals (its TTL), so
# the last value of every gauge this process set is set again every GAUGE_REFRESH_S by one
# daemon thread: a partition with no new data keeps showing its offsets.
GAUGE_REFRESH_S = 2.0
#: how often the coordinator of a routed sink asks its readers for their high watermarks
#: and sets each table's lag (Ray reports every 10 s by default: more often shows nothing)
TABLE_LAG_EVERY_S = 10.0

_lock = threading.Lock()
_metrics: dict[str, Any] = {}
_gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
_refresher: threading.Thread | None = None


def _refresh_forever() -> None:
    import time

    while True:
        time.sleep(GAUGE_REFRESH_S)
        with _lock:
            items = list(_gauges.items())
        for (name, tags), value in items:
            with contextlib.suppress(Exception):  # best effort
                _metrics[name].set(value, tags=dict(tags))


def _remember_gauge(name: str, value: float, tags: dict[str, str]) -> None:
    global _refresher
    with _lock:
        _gauges[(name, tuple(sorted(tags.items())))] = value
        if _refresher is None:
            _refresher = threading.Thread(
                target=_refresh_forever, name="rayconnect-gauges", daemon=True
            )
            _refresher.start()


def _registry() -> dict[str, Any]:
    """One instance of each metric per process (created on first use, in a Ray worker)."""
    with _lock:
        if _metrics:
            return _metrics
        from ray.util.metrics import Counter, Gauge, Histogram

        def counter(name: str, doc: str, tags=PARTITION_TAGS) -> None:
            _metrics[name] = Counter(f"rayconnect_{name}", doc, tag_keys=tags)

        def gauge(name: str, doc: str, tags=PARTITION_TAGS) -> None:
            _metrics[name] = Gauge(f"rayconnect_{name}", doc, tag_keys=tags)

        counter("records_read", "Kafka records read, per partition")
        counter("bytes_read", "Bytes read (Arrow batch size), per partition")
        gauge("high_watermark", "High watermark of the partition, as last fetched")
        gauge("read_lag", "Records in Kafka not read yet: high watermark - next offset")
        gauge("committed_offset", "Next offset to read, as committed in the table")
        gauge(
            "partition_idle_rounds",
            "Rounds in a row a partition read nothing while its log had data past its reader "
            "(stalled from 3: protocol.participant's liveness rule re-syncs it meanwhile)",
        )
        counter("records_written", "Records in committed table versions", PIPELINE_TAGS)
        counter("rounds_committed", "Rounds committed as a table version", PIPELINE_TAGS)
        counter("rounds_discarded", "Rounds discarded (commit failed or refused)", PIPELINE_TAGS)
        counter("dead_letter_records", "Records routed to a dead-letter queue")
        gauge(
            "outage_s",
            "Seconds the oldest outage under way has lasted (0: none)",
            PIPELINE_TAGS,
        )
        counter("table_records_written", "Rows committed to a route table", TABLE_TAGS)
        gauge("table_version", "A route table's version, as last committed", TABLE_TAGS)
        gauge("table_last_commit_time_s", "Unix time of a route table's last commit", TABLE_TAGS)
        gauge("table_lag", "Records in Kafka not in a route table yet", TABLE_TAGS)
        gauge("source_lag_bytes", "Bytes of the source not in Kafka yet", TASK_TAGS)
        gauge("source_lag_s", "Seconds the oldest data not in Kafka yet is old", TASK_TAGS)
        _metrics["round_duration_s"] = Histogram(
            "rayconnect_round_duration_s",
            "Round duration, START-COMMIT to committed, seconds",
            boundaries=ROUND_BOUNDARIES,
            tag_keys=PIPELINE_TAGS,
        )
        _metrics["commit_latency_s"] = Histogram(
            "rayconnect_commit_latency_s",
            "Table commit latency, seconds",
            boundaries=COMMIT_BOUNDARIES,
            tag_keys=PIPELINE_TAGS,
        )
        return _metrics


def _partition_tags(pipeline: str, key: str) -> dict[str, str]:
    tp = TopicPartition.from_key(key)
    return {
        "pipeline": pipeline,
        "cluster": tp.cluster,
        "topic": tp.topic,
        "partition": str(tp.partition),
    }


def _record(name: str, method: str, value: float, tags: dict[str, str]) -> None:
    try:
        getattr(_registry()[name], method)(value, tags=tags)
        if method == "set":
            _remember_gauge(name, value, tags)
    except Exception:  # pragma: no cover - metrics are best effort
        import logging

        logging.getLogger(__name__).debug("metric %s not recorded", name, exc_info=True)


class SourceMetrics:
    """The metrics of one source task (its actor records them every few seconds). Never
    raises."""

    def __init__(self, pipeline: str, task: int) -> None:
        self._tags = {"pipeline": pipeline, "task": str(task)}

    def lag(self, lag_bytes: int | None, lag_s: float | None) -> None:
        """How far behind its source the task is (None: not known, not recorded)."""
        if lag_bytes is not None:
            _record("source_lag_bytes", "set", lag_bytes, self._tags)
        if lag_s is not None:
            _record("source_lag_s", "set", lag_s, self._tags)


class SinkMetrics:
    """The metrics of one sink pipeline, as seen from one actor. Never raises: a metric that
    cannot be recorded must not stop a pipeline."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self._tags = {"pipeline": pipeline}
        self._seen_rounds: dict[str, int] = {}

    def _do(self, name: str, method: str, value: float, tags: dict[str, str]) -> None:
        _record(name, method, value, tags)

    # -- reader --------------------------------------------------------------------------

    def read(
        self,
        key: str,
        records: int,
        nbytes: int,
        *,
        high_watermark: int | None = None,
        next_offset: int | None = None,
    ) -> None:
        """A batch of ``records`` was read from partition ``key`` (cluster/topic/partition)."""
        tags = _partition_tags(self.pipeline, key)
        self._do("records_read", "inc", records, tags)
        self._do("bytes_read", "inc", nbytes, tags)
        if high_watermark is not None:
            self._do("high_watermark", "set", high_watermark, tags)
            if next_offset is not None:
                self._do("read_lag", "set", max(high_watermark - next_offset, 0), tags)

    # -- participant host ----------------------------------------------------------------

    def idle_rounds(self, key: str, rounds: int) -> None:
        """Rounds in a row partition ``key`` read nothing while behind its log."""
        self._do("partition_idle_rounds", "set", rounds, _partition_tags(self.pipeline, key))

    # -- coordinator ---------------------------------------------------------------------

    def committed(
        self,
        offsets: dict[str, int],
        records: int,
        commit_latency_s: float,
        round_duration_s: float | None,
    ) -> None:
        """A round was committed: its partitions' new offsets and its records."""
        for key, offset in offsets.items():
            self._do("committed_offset", "set", offset, _partition_tags(self.pipeline, key))
        if records:
            self._do("records_written", "inc", records, self._tags)
        self._do("commit_latency_s", "observe", commit_latency_s, self._tags)
        if round_duration_s is not None:
            self._do("round_duration_s", "observe", round_duration_s, self._tags)

    def tables_committed(self, tables: dict[str, tuple[int, int]], at: float) -> None:
        """Route tables a round committed: name -> (version, rows), at Unix time ``at``."""
        for name, (version, rows) in tables.items():
            tags = {"pipeline": self.pipeline, "table": name}
            if rows:
                self._do("table_records_written", "inc", rows, tags)
            self._do("table_version", "set", version, tags)
            self._do("table_last_commit_time_s", "set", at, tags)

    def table_lag(self, lags: dict[str, int | None]) -> None:
        """Each route table's lag (``protocol.table_offsets.table_lag``); a table whose lag
        is not known (None: a reader restarting) keeps its last value."""
        for name, lag in lags.items():
            if lag is not None:
                self._do("table_lag", "set", lag, {"pipeline": self.pipeline, "table": name})

    def dead_letters(self, key: str, records: int) -> None:
        """``records`` bad records of partition ``key`` were committed to the dead-letter
        table (typed tables, ``errors: dead_letter``)."""
        if records:
            self._do("dead_letter_records", "inc", records, _partition_tags(self.pipeline, key))

    def rounds(self, status: Any) -> None:
        """Turn the coordinator's cumulative round counts into counter increments."""
        counts = {
            "rounds_committed": status.rounds_committed,
            "rounds_discarded": status.rounds_discarded,
        }
        for name, total in counts.items():
            delta = total - self._seen_rounds.get(name, 0)
            if delta > 0:
                self._do(name, "inc", delta, self._tags)
            self._seen_rounds[name] = total

    def outage(self, seconds: float) -> None:
        """How long the oldest outage under way has lasted (0: none)."""
        self._do("outage_s", "set", seconds, self._tags)

    # -- dead letters --------------------------------------------------------------------

    def dead_letter(self, key: str, records: int = 1) -> None:
        self._do("dead_letter_records", "inc", records, _partition_tags(self.pipeline, key))
