"""Start and stop the Spark-on-Ray session (RayDP) that writes the Parquet files.

Everything here encodes facts measured on Java 17 + raydp 1.6.5 + pyspark 3.5.7
(see shared notes ray-spark.md / tables.md):

- Java 17 refuses Spark's and Arrow's reflective access unless every JVM - the driver, the
  executors *and* RayDP's app master - gets the ``--add-opens`` flags. Missing them on the app
  master makes ``to_spark`` hang for minutes instead of failing, so we set all three.
- Executors must run the same Python as the caller (``PYSPARK_PYTHON``), or they start the
  system python that has no pyspark.
- Parquet files must be readable by delta-rs *and* pyiceberg: microsecond timestamps (INT96
  is rejected by Iceberg), UTC session time zone, and no ``_SUCCESS`` marker file in the
  table folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rayconnect import ray_internals
from rayconnect.spark_bridge.java import MIN_JAVA, use_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Packages Spark / Arrow / Netty open reflectively on Java 17.
ADD_OPENS_PACKAGES: tuple[str, ...] = (
    "java.lang",
    "java.lang.invoke",
    "java.lang.reflect",
    "java.io",
    "java.net",
    "java.nio",
    "java.math",
    "java.text",
    "java.util",
    "java.util.concurrent",
    "java.util.concurrent.atomic",
    "sun.nio.ch",
    "sun.nio.cs",
    "sun.security.action",
    "sun.util.calendar",
)


def require_java(min_version: int = MIN_JAVA) -> int:
    """Choose the Java Spark will run (``java.py``: the user's Java 17, else the packaged
    one), export it into this process's environment, and return its major version.

    Called before Ray starts (a local Ray inherits the environment) and in the process that
    starts Spark; raises JavaNotFoundError when a Java the user forces is not usable.
    """
    return use_java(min_version).major


def spark_tmp_dir() -> str:
    """Where Spark's JVMs put scratch files (block managers, native libraries they unpack):
    one folder of ours instead of hundreds of entries straight in /tmp, so it can be cleaned.
    ``RAYCONNECT_SPARK_TMP`` overrides it (tests give each Ray session its own)."""
    path = os.environ.get("RAYCONNECT_SPARK_TMP") or os.path.join(
        tempfile.gettempdir(), "rayconnect-spark"
    )
    os.makedirs(path, exist_ok=True)
    return path


def java_options() -> str:
    """JVM options every Spark JVM of the session needs on Java 17."""
    opens = " ".join(f"--add-opens=java.base/{pkg}=ALL-UNNAMED" for pkg in ADD_OPENS_PACKAGES)
    return f"-XX:+IgnoreUnrecognizedVMOptions {opens} -Djava.io.tmpdir={spark_tmp_dir()}"


def _ray_logging_option() -> str:
    logs = ray_internals.logs_dir()
    return f" -Dray.logging.dir={logs}" if logs is not None else ""


#: RayDP gives ``<prefix><resource>`` to both of its master actors (the Python master and the
#: app master JVM that owns the executors) as Ray resource requests.
MASTER_RESOURCE = "spark.ray.raydp_spark_master.actor.resource."


def spark_configs() -> dict[str, str]:
    """Spark settings for a writer session (see the module docstring for why each is here)."""
    opts = java_options()
    return {
        # RayDP's Java agent in the driver JVM logs to /tmp/ray/session_latest/logs unless
        # told where this Ray's logs are: with a Ray temp dir of its own (``ray start
        # --temp-dir``, RAY_TMPDIR) that link is missing or another Ray's.
        "spark.driver.extraJavaOptions": f"{opts}{_ray_logging_option()}",
        "spark.executor.extraJavaOptions": opts,
        "spark.ray.raydp_app_master.extraJavaOptions": opts,
        # Files both delta-rs and pyiceberg accept.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.session.timeZone": "UTC",
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        # One small executor: don't let Spark fan a small write out into 200 shuffle tasks,
        # and don't stop the job for the UI.
        "spark.sql.shuffle.partitions": "1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.local.dir": spark_tmp_dir(),
        # A failed write is retried by the protocol (the round is lost, the data re-read),
        # not by Spark: retrying a task whose object refs died only delays that by ~25 s.
        "spark.task.maxFailures": "1",
        # RayDP's app master only coordinates: without this it asks for a CPU to be placed
        # and waits forever on a cluster whose CPUs the executors' placement group holds.
        MASTER_RESOURCE + "CPU": "0",
    }


def start_spark(
    app_name: str,
    executors: int = 1,
    cores: int = 1,
    memory: str = "1GB",
    extra_configs: dict[str, str] | None = None,
    placement_group: Any = None,
) -> SparkSession:
    """Start RayDP's Spark cluster in this process and return its SparkSession.

    One session per process (RayDP keeps a global context), so ``app_name`` must be unique per
    process: RayDP names an actor ``<app_name>_SPARK_MASTER``. Requires ``ray.init`` done
    (RayDP would otherwise start a private local Ray). ``placement_group`` (one bundle per
    executor, already placed: ``executor_group.reserve_executors``) holds the executors; a
    bundle on a lost node is re-placed by Ray and RayDP restarts its executor there.
    """
    import raydp  # heavy import: only where Spark is really started

    use_java()  # the Spark driver JVM starts from this process
    # Executors are started by the JVM; they must run this interpreter, which has pyspark.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    configs = spark_configs()
    configs.update(_app_master_on_this_node())
    configs.update(extra_configs or {})
    with _master_on_this_node(SPARK_NAMESPACE_PREFIX + app_name):
        session: SparkSession = raydp.init_spark(
            app_name=app_name,
            num_executors=executors,
            executor_cores=cores,
            executor_memory=memory,
            configs=configs,
            placement_group=placement_group,
        )
    return session


#: RayDP names its Java app master ``RAY_APP_MASTER`` and its executors
#: ``raydp-executor-<n>`` in the Ray namespace of its master's JVM - by default the caller's,
#: which all of rayconnect's actors share: a second pipeline's Spark then failed to start
#: ("Actor of name RAY_APP_MASTER exists", ray-project/raydp#386). Each Spark app gets a
#: namespace of its own, so every pipeline on a cluster can have Spark.
SPARK_NAMESPACE_PREFIX = "rayconnect-spark-"


def _master_class(namespace: str) -> Any:
    """RayDP's master actor class, its JVMs (app master, executors) in ``namespace``."""
    import ray
    from raydp.spark.ray_cluster_master import RayDPSparkMaster as Master

    body: Any = ray_internals.remote_class_body(Master)

    class RayDPSparkMaster(body):  # type: ignore[misc]  # RayDP's name: tools and tests know its actors by it
        def _generate_ray_configs(self) -> str:
            options = json.loads(super()._generate_ray_configs())
            options["ray.job.namespace"] = namespace
            return json.dumps(options)

    return ray.remote(RayDPSparkMaster)


@contextlib.contextmanager
def _master_on_this_node(namespace: str) -> Iterator[None]:
    """Start RayDP's master actor on this process's node (raydp 1.6.5 places it with Ray's
    default policy, which on a cluster may pick any node), its JVMs in ``namespace``. It
    must run here: the driver JVM joins Ray through the raylet socket of the *master's* node
    (``_generate_ray_configs``), which exists only on that machine; and a master on another
    node ties Spark's life to a second node. Hard affinity: if this node dies, so does the
    writer that owns it."""
    import ray
    import raydp.spark.ray_cluster as raydp_cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    original = raydp_cluster.RayDPSparkMaster
    master = _master_class(namespace)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)

    class _Pinned:
        @staticmethod
        def options(**options: object) -> object:
            return master.options(scheduling_strategy=here, **options)

    raydp_cluster.RayDPSparkMaster = _Pinned
    try:
        yield
    finally:
        raydp_cluster.RayDPSparkMaster = original


def _app_master_on_this_node() -> dict[str, str]:
    """Keep RayDP's app master on this node too. It is a Java actor that the master's JVM
    creates with nothing to place it by but resources (no node affinity, no labels), so
    Ray's default policy put it on any node - measured: on an executor's node, whose loss
    then took every executor of the session with it. Every Ray node has the resource
    ``node:<its ip>``; asking for a sliver of this node's one pins it here (on a cluster of
    one node per machine, as Ray deploys; test nodes sharing a machine get distinct
    loopback addresses)."""
    import ray

    ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return {f"{MASTER_RESOURCE}node:{ip}": "0.001"}


def registered_executors(spark: SparkSession, app_name: str) -> int | None:
    """How many executors the Spark session ``app_name`` of this process has registered now;
    None when RayDP's master (and with it the app master JVM that owns the executors) is
    lost, or the driver JVM itself: then a job would wait for executors forever instead of
    failing. Checked from any thread."""
    import ray
    from raydp.spark.ray_cluster_master import RAYDP_SPARK_MASTER_SUFFIX

    try:
        master = ray.get_actor(app_name + RAYDP_SPARK_MASTER_SUFFIX)
        ray.get(master.get_master_url.remote(), timeout=10)
        # The driver's block manager counts as one.
        return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1
    except Exception:
        return None


def stop_spark() -> None:
    """Stop this process's RayDP session (its master and executor actors) if one runs."""
    import raydp

    raydp.stop_spark()
