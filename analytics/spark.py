"""Building the SparkSession: one place that knows the settings the jobs rely on."""

from __future__ import annotations

import hashlib
import os
import shutil
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
    class_cache: bool = False,
    quick_jit: bool = False,
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

    ``quick_jit`` (a log of up to a few million lines) keeps the driver JVM on its quick
    compiler: the optimising one spent 33 s of CPU compiling during a 1M-event run on 2
    cores, more than its faster code saved; from ~10M lines on it pays.

    With ``class_cache`` the driver JVM maps the classes of an earlier run from a
    class-data archive (:func:`class_archive`), and the first run writes one when it
    ends; call :func:`finish` at the end of the run.

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
    if is_local and not verbose:
        # The web UI of a local run that ends in seconds is never opened, and its server
        # starts with the driver; --verbose (or a cluster master) keeps it.
        spark_conf.set("spark.ui.enabled", "false")
    java: list[str] = []
    if not verbose:
        # The JVM logs from its first line, before setLogLevel can run: a log4j2 file at
        # ERROR for the driver keeps its start-up WARN lines (native-hadoop, loopback
        # address) off stderr. Read by the driver JVM that pyspark launches.
        java.append(f"-Dlog4j2.configurationFile={LOG4J2_QUIET.as_uri()}")
    if is_local:
        # The throughput collector: G1's concurrent marking and its write barriers buy
        # short pauses, which a batch job does not need; on 2 cores the parallel collector
        # took the 10M-event run's JVM from 164-167 to 142 s of CPU, and the 1M run's from
        # 35 to 32 s.
        java.append("-XX:+UseParallelGC")
    if (small_input or quick_jit) and is_local:
        java.append("-XX:TieredStopAtLevel=1")
    elif is_local:
        # A large log keeps the optimising JIT, but only for code three times as hot as
        # it would wait for by default: Spark generates new classes for every table
        # job, and C2 spent ~31 s of CPU compiling during a 10M-event run on 2 cores;
        # with these thresholds 27 s, and the run's JVM 122 s of CPU against 130 s.
        java.extend(
            [
                "-XX:Tier4InvocationThreshold=15000",
                "-XX:Tier4MinInvocationThreshold=1800",
                "-XX:Tier4CompileThreshold=45000",
                "-XX:Tier4BackEdgeThreshold=120000",
            ]
        )
    if small_input and is_local:
        # A run of a few seconds never repays the optimising JIT or the compilation of
        # generated code: the quick compiler alone and interpreted operators took a
        # 250-line run from 41 s to 23 s on the loaded 2-core test machine.
        spark_conf.set("spark.sql.codegen.wholeStage", "false")
        # Nor the per-expression code (janino, then the JIT, for each projection and
        # predicate of a plan that sees a few thousand rows): interpreted expressions
        # took the 1,036-event run's JVM from 10.8-11.1 to 9.4 s of CPU.
        spark_conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        # With one shuffle partition adaptive execution has nothing to merge, and it
        # plans and submits every shuffle stage as a job of its own (32 jobs for the
        # one union of the small-input path, against 13 without): ~1 s of CPU more.
        if shuffle_partitions in (None, 1):
            spark_conf.set("spark.sql.adaptive.enabled", "false")
    if class_cache:
        java.extend(_archive_options())
    if java and not spark_conf.contains("spark.driver.extraJavaOptions"):
        spark_conf.set("spark.driver.extraJavaOptions", " ".join(java))
    if shuffle_partitions is not None:
        spark_conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    elif is_local and small_input:
        # One task per stage: a few thousand rows are not worth splitting, and every
        # task of a cold JVM pays for its classes and code (the 1,000-line run's job took
        # ~11 s of CPU with 1, 13-16 s with 2, on the loaded test machine).
        spark_conf.set("spark.sql.shuffle.partitions", "1")
    elif is_local:
        # The default of 200 is tuned for clusters; on one machine most would be overhead
        # (each task of each stage is scheduled, and its map side writes one block per
        # partition). 8 tasks keep 2 cores busy, and a task's share of a 10M-event
        # shuffle (~1.3M rows) within the driver's memory; adaptive execution merges
        # the small partitions of the later stages.
        spark_conf.set("spark.sql.shuffle.partitions", "8")
    if is_local and not spark_conf.contains("spark.driver.memory"):
        spark_conf.set("spark.driver.memory", "3g")  # the cached events of 10M lines
    if is_local:
        # Smaller input splits: less memory per task, and more tasks to balance 2 cores.
        # At 64 MB the 24 Parquet files of 10M events (5.5 MB each, plus Spark's 4 MB
        # opening cost) made 3 tasks of 3.1M rows and one of 1.2M: the last big one ran
        # alone for 6 s of the events job. At 16 MB, 12 tasks of two files each.
        spark_conf.set("spark.sql.files.maxPartitionBytes", str(16 << 20))
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


# Where a JVM of this run dumps the classes it loaded, to be renamed by finish().
_DUMPING: list[Path] = []


def class_archive() -> Path | None:
    """The class-data archive of the driver JVM for this pyspark and this Java, or None
    unless ``MDECI_SPARK_CLASS_CACHE=on``.

    Opt-in: the archive takes ~180 MB in the user's cache and the run that writes it is
    slower (it waits for the dump: 87 s against 35 s for the next run on the test
    machine); an operator who runs the jobs often turns it on.

    A cold driver spends seconds of CPU finding, reading and verifying the ~10,000
    classes of Spark in 280 jars before any work (half the start-up, and a third of a
    1,000-line run, on the 2-core test machine). HotSpot can map them from an archive
    written by an earlier JVM (AppCDS); the key holds what would make an archive
    unusable, and HotSpot itself ignores one that does not fit.
    """
    setting = os.environ.get("MDECI_SPARK_CLASS_CACHE", "")
    if setting.lower() not in ("on", "1", "true", "yes"):
        return None
    try:
        import pyspark
    except ImportError:  # pragma: no cover - session() reports it
        return None
    home = os.environ.get("JAVA_HOME")
    java = Path(home, "bin", "java") if home else shutil.which("java")
    if java is None:
        return None
    real = Path(java).resolve()
    jars = Path(pyspark.__file__).with_name("jars")
    try:
        stamp = real.stat().st_mtime_ns
    except OSError:
        return None
    key = f"{pyspark.__version__}|{jars}|{real}|{stamp}|{sys.platform}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "mdeci" / f"spark-classes-{digest}.jsa"


def _archive_options() -> list[str]:
    archive = class_archive()
    if archive is None:
        return []
    # HotSpot's own notes on the archive (classes it cannot store, an archive of another
    # build it falls back from) are not the admin's business: off.
    quiet = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", *quiet]
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return []
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    _DUMPING.append(partial)
    return [f"-XX:ArchiveClassesAtExit={partial}", *quiet]


def finish(spark: SparkSession) -> None:
    """End a run of ``spark``. When its JVM is writing the class archive (the first run
    with ``class_cache``), stop Spark, wait for the JVM to exit and put the archive in
    place; otherwise nothing: the JVM exits with this process, as it always has.

    The JVM writes the archive as it exits, to a name of this process; the rename makes
    it visible whole or not at all to the runs that start meanwhile.
    """
    from pyspark import SparkContext

    if not _DUMPING:
        return
    gateway = SparkContext._gateway
    spark.stop()
    partial = _DUMPING.pop()
    proc = getattr(gateway, "proc", None)
    try:
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()  # the gateway exits on end of input
            proc.wait(timeout=300)
        if proc is not None and proc.returncode == 0 and partial.is_file():
            os.replace(partial, partial.with_name(partial.name.rsplit(".", 2)[0]))
    except (OSError, subprocess.TimeoutExpired):
        pass  # no archive this time; the next run writes one
    finally:
        partial.unlink(missing_ok=True)


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
