"""Building the SparkSession: one place that knows the settings the jobs rely on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING

from analytics.errors import JobError

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

LOG4J2_QUIET = Path(__file__).with_name("log4j2-quiet.properties")


def session(
    master: str | None = None,
    *,
    app_name: str = "mdeci-analytics",
    shuffle_partitions: int | None = None,
    conf: dict[str, str] | None = None,
    verbose: bool = False,
    progress: bool = True,
    small_input: bool = False,
) -> SparkSession:
    """A SparkSession for the churn jobs.

    ``master`` is any Spark master URL (``local[2]``, ``spark://host:7077``, ``yarn``,
    ``k8s://...``). With None, a master already set by ``spark-submit`` is kept, and
    ``local[*]`` is used otherwise. Times are UTC whatever the machine's zone is, because
    the log's timestamps are UTC and hour buckets must not move with the host.

    Spark logs only errors unless ``verbose`` (its WARN lines say nothing an admin can act
    on, and they bury the result line); with ``progress`` False the console progress bars
    are off too. ``small_input`` (a log of a few MB, the usual single-day or demo log)
    asks for fewer shuffle partitions and no broadcast timeout dance: the JVM start is
    then most of the run, not 200 empty tasks per stage.

    Raises:
        JobError: if pyspark is not installed or the JVM cannot start.
    """
    try:
        from pyspark import SparkConf
        from pyspark.sql import SparkSession
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise JobError("pyspark is not installed: pip install 'mdeci[analytics]'") from exc
    spark_conf = SparkConf()
    if master is not None:
        spark_conf.setMaster(master)
    elif not spark_conf.contains("spark.master"):
        spark_conf.setMaster("local[*]")
    spark_conf.setAppName(app_name)
    is_local = (spark_conf.get("spark.master") or "").startswith("local")
    spark_conf.set("spark.sql.session.timeZone", "UTC")
    # Adaptive execution (the default since Spark 3.2, set here so a site config cannot
    # drop it): merges the small shuffle partitions and picks broadcast joins at run time.
    spark_conf.set("spark.sql.adaptive.enabled", "true")
    spark_conf.set("spark.sql.adaptive.coalescePartitions.enabled", "true")
    spark_conf.set("spark.ui.showConsoleProgress", "true" if progress else "false")
    java: list[str] = []
    if not verbose:
        # The JVM logs from its first line, before setLogLevel can run: a log4j2 file at
        # ERROR for the driver keeps its start-up WARN lines (native-hadoop, loopback
        # address) off stderr. Read by the driver JVM that pyspark launches.
        java.append(f"-Dlog4j2.configurationFile={LOG4J2_QUIET.as_uri()}")
    if small_input and is_local:
        # A run of a few seconds never repays the optimising JIT or the compilation of
        # generated code: the quick compiler alone and interpreted operators took a
        # 250-line run from 41 s to 23 s on the loaded 2-core test machine.
        java.append("-XX:TieredStopAtLevel=1")
        spark_conf.set("spark.sql.codegen.wholeStage", "false")
    if java and not spark_conf.contains("spark.driver.extraJavaOptions"):
        spark_conf.set("spark.driver.extraJavaOptions", " ".join(java))
    if shuffle_partitions is not None:
        spark_conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    elif is_local and small_input:
        spark_conf.set("spark.sql.shuffle.partitions", "2")
    elif is_local:
        # The default of 200 is tuned for clusters; on one machine most would be overhead.
        # Adaptive execution merges small partitions, so 32 costs little on a small log
        # and keeps each task's share of a 10M-event shuffle within the driver's memory.
        spark_conf.set("spark.sql.shuffle.partitions", "32")
    if is_local and not spark_conf.contains("spark.driver.memory"):
        spark_conf.set("spark.driver.memory", "3g")  # the cached events of 10M lines
    if is_local:
        # Smaller input splits: less memory per task, and more tasks to balance 2 cores.
        spark_conf.set("spark.sql.files.maxPartitionBytes", str(64 << 20))
    for key, value in (conf or {}).items():
        spark_conf.set(key, value)
    try:
        if not verbose:
            _start_quiet_jvm(spark_conf)
        spark = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    except Exception as exc:  # py4j and JVM start-up errors have no common base class
        raise JobError(f"cannot start Spark: {str(exc).splitlines()[0]}") from exc
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    return spark


# What the JVM prints on stderr at every start outside the logger: Spark adds the
# incubator vector module to the driver's options and the JVM announces it; pyspark's
# shell mode announces the log level it is about to set (ERROR, just after).
JVM_NOISE = (
    "WARNING: Using incubator modules",
    'Setting default log level to "',
    "To adjust logging level use sc.setLogLevel(",
)


def _start_quiet_jvm(conf: SparkConf) -> None:
    """Start the driver JVM with its stderr read through a filter that drops
    :data:`JVM_NOISE` and passes every other line (errors included) on, unless a JVM is
    already there (a second session in one process, or ``spark-submit``'s own)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})  # type: ignore[no-untyped-call]
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.stderr is not None:
        threading.Thread(target=_forward, args=(proc.stderr,), daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def _forward(stream: IO[bytes]) -> None:
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    for raw in iter(stream.readline, b""):
        if raw.decode("utf-8", "replace").startswith(JVM_NOISE):
            continue
        if out is not None:
            out.write(raw)
            out.flush()
        else:  # pragma: no cover - a replaced sys.stderr without bytes
            sys.stderr.write(raw.decode("utf-8", "replace"))
