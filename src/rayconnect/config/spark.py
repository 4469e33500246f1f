"""The writer's Spark settings: one Struct that the Python API (``rc.SparkSettings``), a
pipeline file's ``spark:`` block and the writer actor all read, so a default is written once."""

from __future__ import annotations

from typing import Literal

import msgspec

from rayconnect.errors import require


class SparkSettings(msgspec.Struct, frozen=True):
    """The writer's Spark on Ray: one executor of 1 core / 1 GB suits a 2-core machine."""

    #: Spark executors of the writer: Ray actors in one placement group (``placement`` spreads or
    #: packs them)
    executors: int = 1
    #: CPUs of each executor
    executor_cores: int = 1
    #: memory of each executor (Spark's notation)
    executor_memory: str = "1GB"
    #: how long a (re)started writer waits for the CPUs of all its executors before it starts with as
    #: many as fit (status says ``degraded: 1 of 2 Spark executors``); while not even one fits, writes
    #: are refused with that reason instead of hanging
    executor_wait_s: float = 120.0
    #: how long Spark may stay an executor short after a node loss (RayDP replaces a lost executor
    #: itself, ~25 s) before the writer restarts Spark to get them all back
    executor_lost_s: float = 60.0
    #: a write of at most this many rows is made by the writer process itself with Arrow's Parquet
    #: writer (the same files a Spark task writes), not as a Spark job, which costs 0.3-0.7 s however
    #: small: the ``latency`` profile's lever (docs/guides/sink.md). 0: every write is a Spark job once
    #: Spark is up. While Spark starts, every write is made so (a transform's waits for Spark)
    write_here_max_rows: int = 0
    #: when Spark starts: ``with_pipeline`` (its JVMs start beside the readers; 20-30 s, 26-30
    #: CPU-s), or ``when_needed``: writes are made in the writer's process until they keep it
    #: writing ``start_when_busy`` of the last ``busy_window_s``, then Spark starts (a transform
    #: needs Spark SQL and starts it with the pipeline either way). See
    #: ``spark_bridge/start_policy.py`` and docs/guides/sink.md
    start: Literal["with_pipeline", "when_needed"] = "when_needed"
    #: ``when_needed``: the share of ``busy_window_s`` spent writing that starts Spark
    start_when_busy: float = 0.8
    #: ``when_needed``: the window over which the writer's busy share is measured
    busy_window_s: float = 20.0

    def __post_init__(self) -> None:
        require(self.executors >= 1, "spark.executors must be >= 1")
        require(self.executor_cores >= 1, "spark.executor_cores must be >= 1")
        require(self.executor_wait_s > 0, "spark.executor_wait_s must be > 0")
        require(self.executor_lost_s > 0, "spark.executor_lost_s must be > 0")
        require(self.write_here_max_rows >= 0, "spark.write_here_max_rows must be >= 0")
        require(0 < self.start_when_busy <= 1, "spark.start_when_busy must be in (0, 1]")
        require(self.busy_window_s > 0, "spark.busy_window_s must be > 0")
