"""``mdeci analytics churn``: read the logs, run every job of :mod:`analytics.jobs`, write tables.

This module owns the I/O (finding input files, caching, writing Parquet and CSV); the
jobs themselves stay pure functions of DataFrames.
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from analytics import jobs
from analytics import schema as S
from analytics.errors import InputError, JobError

FORMATS = ("auto", "jsonl", "parquet")

# Table name -> what it holds; the report and docs/analytics.md follow these names.
TABLES: dict[str, str] = {
    "per_user": "one row per user: moves, breaks, restores, notifications, SMS, churn score",
    "per_hour": "one row per UTC hour: active users, handovers, disconnections, SMS",
    "episodes": "every disconnection episode, with its true and its clipped edges",
    "transitions": "subnet-to-subnet moves: the mobility graph",
    "restore_latency": "restore latency histogram with its cumulative fraction (CDF)",
    "flapping": "users changing address many times within minutes",
    "storms": "minutes in which many users reconnected at once",
    "recommendations": "RUDP timeout and retries, subscription TTL, queue size",
    "summary": "headline numbers (metric, value)",
}


@dataclass(frozen=True, slots=True)
class Inputs:
    """What will be read: the format and the paths (files, or one URL for remote storage)."""

    fmt: str
    paths: list[str]
    skipped: list[str] = field(default_factory=list)  # files that are not churn logs


# How much of a file is read to tell a churn log from anything else.
SNIFF_BYTES = 64 * 1024
SNIFF_LINES = 50


def _head(path: Path) -> bytes:
    """The first bytes of ``path``, decompressed when it is gzip or bzip2 (as Spark reads it)."""
    with path.open("rb") as raw:
        magic = raw.read(3)
    opener = gzip.open if magic[:2] == b"\x1f\x8b" else bz2.open if magic == b"BZh" else open
    try:
        with opener(path, "rb") as f:
            return bytes(f.read(SNIFF_BYTES))
    except (OSError, EOFError):  # a corrupt archive is not a log either
        return b""


def looks_like_log(path: Path) -> bool:
    """Whether ``path`` holds churn-log lines: one of its first lines is a JSON object with
    ``ts`` and ``event``. Parquet must have the magic bytes (and ``ts``/``event`` columns).

    Only a sample is read, so that a folder of other files (a README, images, a
    pretty-printed JSON config) is refused before the JVM starts, with one error line
    instead of a Spark job that quarantines every line. A log whose first lines are all
    damaged is the price; its later lines would be counted anyway if any file is a log.
    """
    try:
        if path.suffix == ".parquet":
            with path.open("rb") as f:
                if f.read(4) != b"PAR1":
                    return False
            try:
                import pyarrow.parquet as pq
            except ImportError:  # pragma: no cover - pyarrow comes with the analytics extra
                return True
            try:
                names = set(pq.read_schema(path).names)
            except Exception:  # pyarrow raises several types for a bad footer
                return False
            return {"ts", "event"} <= names
        head = _head(path)
    except OSError:
        return False
    for n, raw in enumerate(head.splitlines()):
        if n >= SNIFF_LINES:
            break
        try:
            record = json.loads(raw)
        except ValueError:  # includes UnicodeDecodeError: binary files
            continue
        if isinstance(record, dict) and "ts" in record and "event" in record:
            return True
    return False


def _is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def find_inputs(path: str, fmt: str = "auto") -> Inputs:
    """The churn-log files under ``path``.

    A local directory is walked recursively: ``*.parquet`` files are Parquet copies, any
    other regular file (``churn.log``, ``churn.log.1``, ``x.jsonl``, ``x.jsonl.gz``) is
    JSON lines; names starting with ``.`` or ``_`` are skipped. With ``auto`` and both
    kinds present, JSON lines win: they are the log itself, the Parquet files a copy.
    Files that do not look like churn logs (:func:`looks_like_log`) are skipped and
    listed in ``skipped``. A URL of remote storage (``hdfs://``, ``s3a://``) is handed
    to Spark as it is.

    Raises:
        InputError: if the path does not exist or holds no log files.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    if _is_remote(path):
        guessed = "parquet" if path.rstrip("/").endswith(".parquet") else "jsonl"
        return Inputs(guessed if fmt == "auto" else fmt, [path])
    local = Path(path.removeprefix("file://"))
    if not local.exists():
        raise InputError(f"input {path} does not exist")
    if local.is_file():
        files = [local]
    else:
        files = sorted(
            Path(root) / name
            for root, dirs, names in os.walk(local)
            for name in names
            if not name.startswith((".", "_"))
            and not any(part.startswith((".", "_")) for part in Path(root).relative_to(local).parts)
        )
    files = [f for f in files if f.suffix != ".crc"]
    if not files:
        raise InputError(f"no churn-log files (JSON lines or Parquet) under {path}: it is empty")
    logs = [f for f in files if looks_like_log(f)]
    skipped = [str(f) for f in files if f not in logs]
    parquet = [f for f in logs if f.suffix == ".parquet"]
    text = [f for f in logs if f.suffix != ".parquet"]
    if not logs:
        examples = ", ".join(Path(f).name for f in skipped[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        raise InputError(
            f"no churn-log files (JSON lines or Parquet) under {path}: {len(skipped)} "
            f"file(s) that are not churn logs ({examples}{more})"
        )
    if fmt == "auto":
        fmt = "jsonl" if text else "parquet"
    chosen = text if fmt == "jsonl" else parquet
    if not chosen:
        raise InputError(f"no {fmt} churn-log files under {path}")
    return Inputs(fmt, [str(f.resolve()) for f in chosen], skipped)


def read_parsed(spark: SparkSession, inputs: Inputs, *, keep_extra: bool = False) -> DataFrame:
    """The parsed lines of ``inputs`` (see :func:`analytics.jobs.parse_lines`)."""
    source = F.col("_metadata.file_path").alias("source")
    if inputs.fmt == "parquet":
        df = spark.read.option("recursiveFileLookup", "true").parquet(*inputs.paths)
        return jobs.parse_records(df.select("*", source))
    reader = spark.read.option("recursiveFileLookup", "true")
    return jobs.parse_lines(
        reader.text(inputs.paths).select("value", source), keep_extra=keep_extra
    )


@dataclass(frozen=True, slots=True)
class ChurnResult:
    """Headline numbers of one run, also written as the ``summary`` table."""

    summary: dict[str, float]
    output: str


def run_churn(
    spark: SparkSession,
    input_path: str,
    output_path: str,
    cfg: jobs.JobConfig,
    *,
    fmt: str = "auto",
    csv: bool = True,
    keep_extra: bool = False,
    step: Callable[[str], None] | None = None,
) -> ChurnResult:
    """Run every job over ``input_path`` and write the tables under ``output_path``.

    Tables go to ``<output>/<table>/`` as Parquet and ``<output>/csv/<table>/`` as CSV
    with a header; invalid lines to ``<output>/quarantine/`` as JSON lines. With
    ``keep_extra`` the de-duplicated events, unknown fields in ``extra``, go to
    ``<output>/events/`` (Parquet).

    Raises:
        InputError: if there is nothing to read.
        JobError: if Spark fails (the first line of its error is kept).
    """
    inputs = find_inputs(input_path, fmt)
    say = step or (lambda _msg: None)
    out = output_path.rstrip("/")
    try:
        return _run(spark, inputs, out, cfg, csv, keep_extra, say)
    except InputError:
        raise
    except Exception as exc:
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise JobError(f"Spark job failed: {first}") from exc
        raise


def _first(df: DataFrame) -> Row:
    row = df.first()
    if row is None:  # an aggregate without grouping always has one row
        raise JobError("an aggregate returned no row")
    return row


def _run(
    spark: SparkSession,
    inputs: Inputs,
    out: str,
    cfg: jobs.JobConfig,
    csv: bool,
    keep_extra: bool,
    say: Callable[[str], None],
) -> ChurnResult:
    # Two passes over the input rather than caching every parsed line: the cache of a
    # 10M-line log (plus the de-duplication next to it) overran a 2 GB driver, while a
    # second parse costs less than a third of the run.
    say(f"parsing {len(inputs.paths)} {inputs.fmt} input(s), quarantining invalid lines")
    observed = Observation("lines")
    parsed = read_parsed(spark, inputs).observe(
        observed, F.count(F.lit(1)).alias("lines"), F.count("error").alias("invalid")
    )
    jobs.quarantine(parsed).write.mode("overwrite").json(f"{out}/quarantine")
    lines, invalid = int(observed.get["lines"]), int(observed.get["invalid"])
    say(f"{lines} lines, {invalid} invalid; de-duplicating the valid ones")
    valid = read_parsed(spark, inputs, keep_extra=keep_extra)
    events = jobs.valid_events(valid).persist(StorageLevel.MEMORY_AND_DISK)
    n_events = events.count()
    if n_events == 0:
        # Nothing to analyse: empty tables would look like a quiet week, not a bad input.
        raise InputError(
            f"no valid churn-log lines in the input ({lines} line(s), {invalid} invalid; "
            f"see {out}/quarantine)"
        )
    if keep_extra:
        say("writing events")
        events.write.mode("overwrite").parquet(f"{out}/events")
    window = cfg.window
    current = jobs.in_window(events, window)
    eps = jobs.episodes(events, window).persist(StorageLevel.MEMORY_AND_DISK)
    user = jobs.per_user(current, eps).persist(StorageLevel.MEMORY_AND_DISK)
    tables: dict[str, DataFrame] = {
        "per_user": user,
        "per_hour": jobs.per_hour(current, eps, window),
        "episodes": eps,
        "transitions": jobs.transitions(current),
        "restore_latency": jobs.restore_latency(current, cfg),
        "flapping": jobs.flapping(current, cfg),
        "storms": jobs.storms(current, cfg),
        "recommendations": jobs.recommendations(current, eps, cfg),
    }
    sizes: dict[str, int] = {}
    for name, df in tables.items():
        say(f"writing {name}")
        df.write.mode("overwrite").parquet(f"{out}/{name}")
        written = spark.read.parquet(f"{out}/{name}")
        sizes[name] = written.count()
        if csv:
            written.coalesce(1).write.mode("overwrite").option("header", "true").csv(
                f"{out}/csv/{name}"
            )
    totals = _first(
        user.agg(
            F.count(F.lit(1)).alias("users"),
            F.sum("events").alias("events_in_window"),
            F.sum("address_changes").alias("address_changes"),
            F.sum("handovers").alias("handovers"),
            F.sum("disconnections").alias("disconnections"),
            F.sum("disconnected_ms").alias("disconnected_ms"),
            F.sum("restores").alias("restores"),
            F.sum("notify_queued").alias("notify_queued"),
            F.sum("notify_delivered").alias("notify_delivered"),
            F.sum("notify_dropped").alias("notify_dropped"),
            F.sum("sms_count").alias("sms_count"),
            F.sum("sms_cost").alias("sms_cost"),
        )
    )
    restores = current.where(
        (F.col("event") == "media_connected") & F.col("latency_ms").isNotNull()
    )
    pct = _first(restores.agg(F.percentile("latency_ms", [0.5, 0.95, 0.99]).alias("p")))["p"]
    span = _first(current.agg(F.min("ts_ms").alias("a"), F.max("ts_ms").alias("b")))
    summary: dict[str, float] = {
        "lines": float(lines),
        "invalid_lines": float(invalid),
        "duplicates_dropped": float(lines - invalid - n_events),
        "events": float(n_events),
    }
    for key, value in totals.asDict().items():
        summary[key] = float(value or 0)
    summary["disconnected_hours"] = round(summary.pop("disconnected_ms") / 3_600_000, 3)
    for q, value in zip(("p50", "p95", "p99"), pct or (None, None, None), strict=True):
        summary[f"restore_{q}_ms"] = float("nan") if value is None else float(value)
    summary["flaps"] = float(sizes["flapping"])
    summary["storms"] = float(sizes["storms"])
    summary["first_ts_ms"] = float(span["a"]) if span["a"] is not None else float("nan")
    summary["last_ts_ms"] = float(span["b"]) if span["b"] is not None else float("nan")
    if window.since_ms is not None:
        summary["since_ms"] = float(window.since_ms)
    if window.until_ms is not None:
        summary["until_ms"] = float(window.until_ms)
    rows = spark.createDataFrame(list(summary.items()), S.SUMMARY_SCHEMA)
    rows.coalesce(1).write.mode("overwrite").parquet(f"{out}/summary")
    if csv:
        rows.coalesce(1).write.mode("overwrite").option("header", "true").csv(f"{out}/csv/summary")
    for df in (user, eps, events):
        df.unpersist()
    return ChurnResult(summary=summary, output=out)
