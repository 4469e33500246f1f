"""The writer's Spark settings: one Struct that the Python API (``rc.SparkSettings``), a
pipeline file's ``spark:`` block and the writer actor all read, so a default is written once."""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        require(self.executors >= 1, "spark.executors must be >= 1")
        require(self.executor_cores >= 1, "spark.executor_cores must be >= 1")
        require(self.executor_wait_s > 0, "spark.executor_wait_s must be > 0")
        require(self.executor_lost_s > 0, "spark.executor_lost_s must be > 0")
        require(self.write_here_max_rows >= 0, "spark.write_here_max_rows must be >= 0")
