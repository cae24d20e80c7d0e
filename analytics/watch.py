"""``mdeci analytics watch``: live churn per minute with Structured Streaming.

Theory of operation. The query reads the churn-log directory as a stream of files
(Spark's file source: each *new* file is read once, whole; the broker's rotated
``churn.log.N`` files, or the files a log shipper drops there). Every line goes through
the same parser and the same one-source-of-truth rule as the batch jobs
(:func:`analytics.parse.parse_lines`, :func:`analytics.jobs.is_fact`,
:func:`analytics.jobs.restore_ms`), then:

1. an event-time watermark (``--watermark``, default 2 minutes) on the line's ``ts``:
   a line that arrives later than that behind the newest one seen is dropped as late,
   and Spark keeps no state older than it;
2. exact duplicate lines are dropped within the watermark
   (``dropDuplicatesWithinWatermark``). Rotation renames ``churn.log.1`` to
   ``churn.log.2``, which the file source sees as a new file: its lines are read again
   and dropped here, as long as the rename comes within the watermark;
3. one row per 1-minute event-time window, emitted once the watermark has passed the
   window's end (append mode, so a minute is written once and never revised):
   ``handovers`` (``session_reinvited``), ``disconnections`` (the broker's
   ``media_disconnected``, except the tear-down after a session ended, whose reason is
   ``session ended``), ``restores`` with their p50/p95 latency, ``users_restored``
   (distinct), and ``storm`` (true when ``users_restored`` reaches ``--storm-users``).

Each micro-batch (``foreachBatch``, so the stream is computed once for both outputs)
appends its minutes to ``<output>/minutes/`` and the storms among them to
``<output>/alerts/`` (Parquet), and prints one line per minute, ``STORM`` marked, on the
console. The checkpoint (``<output>/_checkpoint`` by default) makes a restarted watch
carry on where it stopped, without reading a file twice.

The batch ``storms`` table compares a minute with its hour's mean; a live query cannot
know the hour's mean before the hour is over, so the live alert uses the user threshold
alone (documented in docs/analytics.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analytics import jobs, parse
from analytics.errors import InputError

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

MINUTE_SCHEMA = T.StructType(
    [
        T.StructField("minute", T.TimestampType(), True),
        T.StructField("handovers", T.LongType(), True),
        T.StructField("disconnections", T.LongType(), True),
        T.StructField("restores", T.LongType(), True),
        T.StructField("users_restored", T.LongType(), True),
        T.StructField("restore_p50_ms", T.DoubleType(), True),
        T.StructField("restore_p95_ms", T.DoubleType(), True),
        T.StructField("storm", T.BooleanType(), True),
    ]
)


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchConfig:
    """The live query's knobs; each default says why."""

    watermark: str = "2 minutes"
    """How late a line may come (event time) and still count; older state is dropped."""
    storm_users: int = 8
    """Distinct users restoring within one minute that raise a storm alert."""
    trigger_s: float = 5.0
    """Seconds between micro-batches."""
    checkpoint: str | None = None
    """Where the query keeps its progress; default ``<output>/_checkpoint``."""


def minutes(lines: DataFrame, cfg: WatchConfig) -> DataFrame:
    """Per-minute churn of a stream (or a batch) of raw lines (``value``, ``source``);
    schema :data:`MINUTE_SCHEMA`. A pure function: the tests run it on a batch too."""
    parsed = parse.parse_lines(lines)
    valid = parsed.where(F.col("error").isNull()).select(
        "role", "event", "uri", "addr", "latency_ms", "reason", "ts_ms", "node", "call_id"
    )
    timed = valid.select("*", F.timestamp_millis(F.col("ts_ms")).alias("t"))
    if timed.isStreaming:
        timed = timed.withWatermark("t", cfg.watermark).dropDuplicatesWithinWatermark(
            [c for c in timed.columns if c != "t"]
        )
    else:
        timed = timed.dropDuplicates()
    fact = jobs.is_fact()
    event = F.col("event")
    restore = jobs.restore_ms()
    teardown = F.coalesce(F.col("reason"), F.lit("")) == F.lit("session ended")
    per_minute = timed.groupBy(F.window("t", "1 minute").alias("w")).agg(
        F.count(F.when(fact & (event == "session_reinvited"), 1)).alias("handovers"),
        F.count(F.when(fact & (event == "media_disconnected") & ~teardown, 1)).alias(
            "disconnections"
        ),
        F.count(restore).alias("restores"),
        F.size(F.collect_set(F.when(restore.isNotNull(), F.col("uri")))).alias("users_restored"),
        F.percentile(restore, [0.5, 0.95]).alias("_pct"),
    )
    out = per_minute.select(
        F.col("w.start").alias("minute"),
        "handovers",
        "disconnections",
        "restores",
        "users_restored",
        F.col("_pct")[0].alias("restore_p50_ms"),
        F.col("_pct")[1].alias("restore_p95_ms"),
        (F.col("users_restored") >= F.lit(cfg.storm_users)).alias("storm"),
    )
    return parse.conform(out, MINUTE_SCHEMA)


def console_line(row: dict[str, Any]) -> str:
    """One minute as the console shows it."""
    p50 = row["restore_p50_ms"]
    p95 = row["restore_p95_ms"]
    lat = "" if p50 is None else f" restore p50 {p50:.0f} ms p95 {p95:.0f} ms"
    alert = f"  STORM: {row['users_restored']} users reconnected" if row["storm"] else ""
    return (
        f"{row['minute']:%Y-%m-%d %H:%M} UTC  handovers {row['handovers']}  "
        f"disconnections {row['disconnections']}  restores {row['restores']}{lat}{alert}"
    )


def start(
    spark: SparkSession,
    input_dir: str,
    output: str,
    cfg: WatchConfig,
    *,
    available_now: bool = False,
    echo: Callable[[str], None] | None = None,
) -> StreamingQuery:
    """Start the live query over ``input_dir``; returns the running query.

    With ``available_now`` it processes the files there now and stops (a cron job's
    mode; a rerun with the same checkpoint carries on).

    Raises:
        InputError: if ``input_dir`` is not a directory (for a local path).
    """
    from pathlib import Path

    out = output.rstrip("/")
    if "://" not in input_dir and not Path(input_dir).is_dir():
        raise InputError(f"--input {input_dir} is not a directory (watch reads a log folder)")
    say = echo or (lambda text: print(text, file=sys.stdout, flush=True))
    lines = (
        spark.readStream.format("text")
        .option("pathGlobFilter", "[^._]*")  # not hidden files nor a writer's temp files
        .load(input_dir)
        .select("value", F.col("_metadata.file_path").alias("source"))
    )
    table = minutes(lines, cfg)

    def write(batch: DataFrame, batch_id: int) -> None:
        rows = [r.asDict() for r in batch.orderBy("minute").collect()]
        if not rows:
            return
        frame = spark.createDataFrame(rows, MINUTE_SCHEMA).coalesce(1)
        frame.write.mode("append").parquet(f"{out}/minutes")
        storms = [r for r in rows if r["storm"]]
        if storms:
            spark.createDataFrame(storms, MINUTE_SCHEMA).coalesce(1).write.mode("append").parquet(
                f"{out}/alerts"
            )
        for r in rows:
            say(console_line(r))

    writer = (
        table.writeStream.outputMode("append")
        .foreachBatch(write)
        .option("checkpointLocation", cfg.checkpoint or f"{out}/_checkpoint")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{cfg.trigger_s} seconds")
    return writer.queryName("mdeci_churn_watch").start()
