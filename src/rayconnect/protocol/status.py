"""``PipelineStatus``: what a sink pipeline reports about itself, as one typed Struct.

The coordinator actor builds it (its machine's round state, the table, outages, upkeep);
``PipelineHandle.status()`` adds what other actors know (readers, discovery, the writer, lag
per partition, optionally the actors' processes); ``rayconnect status --json`` prints exactly
its JSON encoding. It lives here, below the actors and the pipeline APIs, because both use it.

Counts a user reads as totals are totals of the table: ``offsets`` and ``dead_letters`` are
read from the table (the dead-letter table when the coordinator starts, then added to per
commit). Counts the coordinator keeps in memory start again at each (re)start of the
coordinator, and say so: ``rounds_since_start``, ``records_committed_since_start``, from
``started_at``.

Fields are also readable by name, ``status["offsets"]``, as the dict this replaced was.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rayconnect.protocol.actor_status import DiscoveryStatus, ReaderStatus
from rayconnect.protocol.commit_outcome import CommitOutcome
from rayconnect.protocol.offset_range import OffsetsOutOfRange
from rayconnect.protocol.upkeep import UpkeepStatus


class ByName:
    """Fields readable by name, ``status["offsets"]``, as the dict a status Struct replaced.

    The package itself reads attributes (mypy finds no use of it in src); tests and bench
    scripts still index statuses by name, which is all that keeps this class alive."""

    __slots__ = ()
    __struct_fields__: tuple[str, ...]

    def __getitem__(self, name: str) -> Any:
        if name not in self.__struct_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in self.__struct_fields__ else default

    def __contains__(self, name: object) -> bool:
        return name in self.__struct_fields__


class RoundCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Rounds since the coordinator (re)started: each restart counts from 0 again."""

    #: rounds committed as a table version, partial ones included
    committed: int
    #: of those, rounds committed without the partitions that did not report in time
    partial: int
    #: rounds given up: the commit failed, or no participant could report in write_timeout_s
    discarded: int
    #: rounds that ended with nothing to commit
    empty: int
    #: rounds ended early by a participant's REQUEST-COMMIT (its buffer kept filling)
    requested: int
    #: rounds ended early because a backlog was drained (``commit_when_drained``)
    drained: int


class PartitionStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One partition, as ``rayconnect status`` lists it."""

    #: the next offset to read, as committed in the table; None: nothing committed yet
    committed_offset: int | None
    #: the broker's high watermark, as the partition's reader last saw it
    high_watermark: int | None
    #: high_watermark - committed_offset (records not in the table yet)
    lag: int | None
    #: the participant host (actor) holding the partition's participant
    host: str | None
    #: ``ok``; ``stalled``: behind its log with nothing read for ``STALL_ROUNDS`` rounds in a
    #: row (the participant re-syncs its reader meanwhile: ``reason`` says how often);
    #: ``offsets_ahead`` / ``offsets_before_log_start``: the table's offset lies outside the
    #: partition's log (``source.offsets_out_of_range`` says what happens; lag is unknown);
    #: ``no_cut_markers``: consistent cuts, and records held round after round with no cut
    #: marker after them (the source writes none: nothing of the partition is committed)
    state: str = "ok"
    #: why the state is not ``ok``
    reason: str | None = None


class TableStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One route table of a sink with routes (``config.routes``), as the coordinator knows
    it; ``PipelineStatus.tables`` holds one per table, ``rayconnect status`` lists them."""

    #: the table's version as this coordinator last committed it; None: not committed
    #: since the coordinator started
    version: int | None = None
    #: rows this coordinator committed to the table since it started (dead letters not
    #: counted; what the table holds in all follows from its ``offsets``)
    rows_since_start: int = 0
    #: Unix time of this coordinator's last commit to the table; None: none yet
    last_commit_at: float | None = None
    #: partition -> the next offset the table holds records up to (its own: a partition
    #: restarts from the smallest among its tables)
    offsets: dict[str, int] = {}
    #: records in Kafka not in the table yet: the sum over its partitions of high
    #: watermark - its offset (added by the handle; None: no reader reported them)
    lag: int | None = None


class WriterStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The writer actor's report (``WriterActor.stats``): the Spark side - executors
    wanted, started with and registered now - and its counters."""

    #: the Spark application's name (a new one after the writer restarted Spark)
    app_name: str | None = None
    #: ``spark.executors``
    executors_wanted: int | None = None
    #: executors Spark started with (fewer when CPUs were short)
    executors_started_with: int | None = None
    #: executors registered now; None: Spark starts with the first write
    executors: int | None = None
    #: why Spark runs with fewer executors than wanted, or refuses writes
    problem: str | None = None
    #: ``spark.start``: ``with_pipeline`` or ``when_needed``
    spark_start: str | None = None
    #: ``when_needed``: why Spark was started (None: not yet; writes are made in the
    #: writer's process)
    spark_started_because: str | None = None
    #: seconds Spark took to start
    spark_start_s: float | None = None
    #: seconds the writer's first (warm-up) job took
    warm_up_s: float | None = None
    #: why the warm-up writes failed (the table's store away while Spark started); the
    #: writer goes on and writes once the store is back
    warm_up_failed: str | None = None
    #: merge-on-read key searches the writer ran on Spark's executors
    spark_searches: int | None = None
    #: ... and in its own process (Spark not up)
    searches_here: int | None = None
    #: write calls received (a participant host's flushes of one moment are one)
    calls: int = 0
    #: writes made as Spark jobs
    spark_writes: int = 0
    #: Spark jobs those writes ran (equal to ``spark_writes``: one job per write)
    spark_jobs: int = 0
    #: writes made in the writer's own process (before Spark was up, or small ones)
    writes_here: int = 0
    #: the last Spark write's job ids
    last_job_ids: tuple[int, ...] = ()
    #: the last Spark write's groups (flushes gathered into it)
    last_groups: int = 0
    #: seconds of the last Spark write in all
    last_write_s: float | None = None
    #: ... of which preparing the job (lending the blocks, building the DataFrame)
    last_prepare_s: float | None = None
    #: ... and the Spark job itself
    last_spark_s: float | None = None
    #: seconds of the last write made in the writer's process
    last_write_here_s: float | None = None
    #: a routed sink: how often the writer read its route tables' schemas
    route_schema_reads: int | None = None
    #: why the writer did not answer (it is restarting)
    error: str | None = None


class KeySearchCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Where the coordinator's merge-on-read rounds searched their keys (the ones not in a
    key index): sent to the writer, or run in the coordinator because the writer did not
    answer (``write_modes.key_search``)."""

    on_writer: int = 0
    here: int = 0
    #: why the last search did not run in the writer
    last_fallback: str | None = None


class ActorStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One of the pipeline's actors, from Ray's state API (``?``/None when it has none)."""

    #: the actor's name (``<pipeline>/<role>...``)
    name: str
    #: Ray's actor state: ALIVE, RESTARTING, PENDING_CREATION...
    state: str
    #: the actor's process
    pid: int | None
    #: the first 8 characters of its node's id
    node: str | None
    #: how often Ray restarted it
    restarts: int | None


class PipelineStatus(ByName, msgspec.Struct, frozen=True, kw_only=True):
    """A sink pipeline's status (see the module docstring for where each part comes from)."""

    #: ``sink`` (a source pipeline's status is its tasks' reports)
    kind: str = "sink"
    #: the pipeline's name
    pipeline: str
    #: the coordinator machine's state: ``started`` (participants write), ``ended``
    #: (collecting WRITE-STATUS), ``committing``, ``reloading``, ``fenced``, ``stopped``...
    state: str
    #: this coordinator's epoch (claimed in the table at its start: older ones are fenced)
    epoch: int
    #: the round under way (counts from 1 in each epoch)
    txn_id: int
    #: Unix time this coordinator started: the ``..._since_start`` counts run from here
    started_at: float
    #: the table, as errors and status lines name it
    table: str
    #: the table's version (Iceberg: its last sequence number); None before the first read
    table_version: int | None
    #: the partitions in the pipeline's rounds (``cluster/topic/partition``)
    partitions: tuple[str, ...]
    #: the partitions the round under way still waits for (after its END)
    waiting_for: tuple[str, ...] = ()
    #: partitions leaving the pipeline once a round has finished
    retiring: tuple[str, ...] = ()
    #: partition -> committed offset (the next to read), read from the table
    offsets: dict[str, int] = {}
    #: partition -> records in the dead-letter table, read from it at the coordinator's
    #: start and added to per commit (typed tables with ``errors: dead_letter``)
    dead_letters: dict[str, int] = {}
    #: partition -> the participant host (actor) holding it
    participant_hosts: dict[str, str] = {}
    #: rounds by outcome since this coordinator started
    rounds_since_start: RoundCounts
    #: records in the rounds this coordinator committed (read since its start; what the
    #: table holds in all is in ``offsets``)
    records_committed_since_start: int = 0
    #: WRITE-STATUS messages refused (stale or inconsistent) since the start
    statuses_rejected_since_start: int = 0
    #: messages of older rounds or epochs ignored since the start
    messages_ignored_since_start: int = 0
    #: START to ACK of the last finished round
    last_round_duration_s: float | None = None
    #: END of the last round to the START of the next: writing, reporting, committing
    last_end_to_start_s: float | None = None
    #: median START to ACK of the recent rounds
    round_s_median: float | None = None
    #: longest START to ACK of the recent rounds
    round_s_max: float | None = None
    #: median END to next START of the recent rounds
    end_to_start_s_median: float | None = None
    #: median time of the recent table commits
    commit_s_median: float | None = None
    #: consistent cuts (``commit.consistent_cuts``): the LSN of the last cut committed
    #: whole, read from the table at the coordinator's start, then each commit's
    #: (None: cuts are off, or none committed yet)
    committed_cut: int | None = None
    #: the last round's failure (a commit that failed, a partition's bad record...)
    last_error: str | None = None
    #: the coordinator's own failure (recovery, reload), cleared when it passes
    error: str | None = None
    #: why this coordinator stopped: a newer epoch claimed the table
    fenced: str | None = None
    #: how the last commit that failed or timed out ended (committed after all, refused as
    #: fenced, not committed), as the table read after it showed; None: none failed
    last_failed_commit: CommitOutcome | None = None
    #: why the pipeline gave up (an outage that lasted ``give_up_after_s``, a broken table,
    #: a table offset outside its partition's log)
    gave_up: str | None = None
    #: partitions whose table offset lies outside their log, as readers reported them
    #: (``source.offsets_out_of_range``)
    out_of_range: dict[str, OffsetsOutOfRange] = {}
    #: the setting: seconds of one outage before the pipeline gives up
    give_up_after_s: float | None = None
    #: one line per outage under way (a cluster's broker, the table's store)
    outages: tuple[str, ...] = ()
    #: table upkeep so far: compactions, tidies, files since the last compaction
    upkeep: UpkeepStatus | None = None
    #: with routes: each route table's upkeep, once it was committed by this coordinator
    upkeep_by_table: dict[str, UpkeepStatus] = {}
    #: what the last upkeep jobs did (each job's own report)
    upkeep_recent: tuple[dict[str, Any], ...] = ()
    #: a sink with routes: route table -> its version, rows, last commit, offsets and lag
    #: (empty for a sink of one table)
    tables: dict[str, TableStatus] = {}
    #: merge-on-read rounds' key searches: in the writer, or here when it did not answer
    key_searches: KeySearchCounts = KeySearchCounts()
    # -- added by the handle, from the other actors ------------------------------------------
    #: the enumerator's report: clusters, streams, splits per reader, last error
    discovery: DiscoveryStatus | None = None
    #: reader actor -> its own report (partitions with positions and high watermarks,
    #: broker reachability)
    readers: dict[str, ReaderStatus] = {}
    #: every reader the enumerator assigned splits to has its metadata
    readers_ready: bool = False
    #: the writer's Spark executors (or why the writer did not answer)
    writer: WriterStatus | None = None
    #: partition -> high watermark - committed offset
    lag: dict[str, int | None] = {}
    #: partition -> committed offset, high watermark, lag and host
    partition_status: dict[str, PartitionStatus] = {}
    #: the actors' processes (``status(actors=True)``; ``rayconnect status`` asks for them)
    actors: tuple[ActorStatus, ...] | None = None

    def partition_problems(self) -> list[str]:
        """One line per partition whose state is not ``ok``, with why (stalled, offsets
        outside its log, no cut markers...): ``rayconnect status``, ``run``'s progress and
        the mirror's live lines show them."""
        parts = self.partition_status.items()
        return [f"{key}: {p.state}: {p.reason}" for key, p in parts if p.state != "ok"]


def encode(status: PipelineStatus) -> bytes:
    """The JSON ``rayconnect status --json`` prints. The upkeep jobs' reports are their own
    dicts: a value JSON has no type for is written as its text rather than failing the
    whole status."""
    return msgspec.json.encode(status, enc_hook=str)


def decode(data: bytes | str) -> PipelineStatus:
    return msgspec.json.decode(data, type=PipelineStatus)


class StopResult(msgspec.Struct, frozen=True, kw_only=True):
    """What ``PipelineHandle.stop()`` returns: the coordinator's last status, or why there
    is none (the last round could not be had: nothing is lost, it is read again)."""

    #: the coordinator's status after the last round
    final: PipelineStatus | None = None
    #: why there is no last status (the last round was not committed)
    error: str | None = None
