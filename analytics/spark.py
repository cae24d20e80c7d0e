"""Building the SparkSession: one place that knows the settings the jobs rely on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analytics.errors import JobError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def session(
    master: str | None = None,
    *,
    app_name: str = "mdeci-analytics",
    shuffle_partitions: int | None = None,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the churn jobs.

    ``master`` is any Spark master URL (``local[2]``, ``spark://host:7077``, ``yarn``,
    ``k8s://...``). With None, a master already set by ``spark-submit`` is kept, and
    ``local[*]`` is used otherwise. Times are UTC whatever the machine's zone is, because
    the log's timestamps are UTC and hour buckets must not move with the host.

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
    spark_conf.set("spark.sql.session.timeZone", "UTC")
    is_local = (spark_conf.get("spark.master") or "").startswith("local")
    if shuffle_partitions is not None:
        spark_conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
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
        spark = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    except Exception as exc:  # py4j and JVM start-up errors have no common base class
        raise JobError(f"cannot start Spark: {str(exc).splitlines()[0]}") from exc
    spark.sparkContext.setLogLevel("WARN")
    return spark
