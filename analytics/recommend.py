"""The recommendations table: the settings the data argues for, each with its basis."""

from __future__ import annotations

import math

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics import schema as S
from analytics.jobs import JobConfig, facts, is_event, tie_rank
from analytics.parse import conform


def recommendations(events: DataFrame, eps: DataFrame, cfg: JobConfig) -> DataFrame:
    """Settings the data argues for; schema RECOMMENDATION_SCHEMA (one row per setting).

    - ``rudp_initial_rto_ms``: twice the p99 of live IP delivery latency (a delivery is
      live if faster than ``live_delivery_ms``; slower ones sat in a queue), at least
      200 ms, rounded up to 50 ms, so that a healthy path never retransmits;
    - ``rudp_max_retries``: the fewest retries whose back-off (x2) adds up to the p90 of
      the short disconnections (< ``short_disconnection_ms``), so that blips are ridden
      out instead of declaring the peer DISCONNECTED; between 1 and 15;
    - ``subscription_ttl_s``: 1.5 x the p99 of closed disconnection durations, rounded up
      to 5 minutes, at least 600 s, so subscriptions outlive the breaks users return from;
    - ``queue_max_per_uri``: the deepest backlog a lossless queue would have held: per
      user and per stretch between two restores, the highest ``queue_depth`` queued plus
      the notifications dropped, maximised.

    Each value needs a sample (``cfg.min_tail_observations``, see :func:`needed`): as
    many deliveries as a p99 needs for the timeout, short disconnections as a p90 needs
    for the retries, disconnections as a p99 needs for the TTL, and stretches between
    restores as a p90 needs for the queue. Below it the value is null and the basis says
    "not enough data" with the count; the give-up time needs both of its inputs.
    """
    events = facts(events)
    live = events.where(
        is_event("notify_delivered")
        & (F.coalesce(F.col("channel"), F.lit("ip")) == "ip")
        & (F.col("latency_ms") < cfg.live_delivery_ms)
    )
    rtt = live.agg(F.percentile("latency_ms", 0.99).alias("_rtt_p99"), F.count("*").alias("_rtt_n"))
    closed = eps.where(~F.col("open"))
    short = closed.where(F.col("duration_ms") < cfg.short_disconnection_ms).agg(
        F.percentile("duration_ms", 0.9).alias("_blip_p90"), F.count("*").alias("_blip_n")
    )
    long = closed.agg(
        F.percentile("duration_ms", 0.99).alias("_dur_p99"), F.count("*").alias("_dur_n")
    )
    by_time = (
        Window.partitionBy("uri")
        .orderBy("ts_ms", tie_rank())
        .rowsBetween(Window.unboundedPreceding, 0)
    )
    stretch = events.where(
        is_event("media_connected") | is_event("notify_queued") | is_event("notify_dropped")
    ).select(
        "uri",
        "event",
        "queue_depth",
        F.sum(F.when(is_event("media_connected"), 1).otherwise(0)).over(by_time).alias("_stretch"),
    )
    backlog = (
        stretch.groupBy("uri", "_stretch")
        .agg(
            (
                F.coalesce(F.max(F.when(is_event("notify_queued"), F.col("queue_depth"))), F.lit(0))
                + F.sum(F.when(is_event("notify_dropped"), 1).otherwise(0))
            ).alias("_need")
        )
        .agg(F.max("_need").alias("_queue"), F.count("*").alias("_queue_n"))
    )
    one = rtt.crossJoin(short).crossJoin(long).crossJoin(backlog)
    p99, p90 = needed(cfg, 0.99), needed(cfg, 0.9)
    rto_ok = F.col("_rtt_n") >= p99
    rto = F.greatest(F.lit(200.0), F.ceil(F.col("_rtt_p99") * 2 / 50) * 50)
    blip = F.col("_blip_p90")
    retries_ok = rto_ok & (F.col("_blip_n") >= p90)
    retries = F.least(F.lit(15.0), F.greatest(F.lit(1.0), F.ceil(F.log2(blip / rto + 1))))
    ttl_ok = F.col("_dur_n") >= p99
    ttl = F.greatest(F.lit(600.0), F.ceil(F.col("_dur_p99") * 1.5 / 300_000) * 300)
    queue_ok = F.col("_queue_n") >= p90
    rows = F.array(
        _row(
            "rudp_initial_rto_ms",
            rto_ok,
            rto,
            "ms",
            _basis(
                "2 x p99 of live delivery latency (", F.round("_rtt_p99", 1), " ms), at least 200"
            ),
            _short_of("_rtt_n", p99, "live deliveries"),
        ),
        _row(
            "rudp_max_retries",
            retries_ok,
            retries,
            "retries",
            _basis("back-off covers p90 of short disconnections (", F.round(blip, 0), " ms)"),
            F.when(rto_ok, _short_of("_blip_n", p90, "short disconnections")).otherwise(
                _short_of("_rtt_n", p99, "live deliveries")
            ),
        ),
        _row(
            "rudp_give_up_after_ms",
            retries_ok,
            rto * (F.pow(F.lit(2.0), retries) - 1),
            "ms",
            F.lit("initial RTO x (2^retries - 1)"),
            F.lit("not enough data for the timeout or the retries"),
        ),
        _row(
            "subscription_ttl_s",
            ttl_ok,
            ttl,
            "s",
            _basis(
                "1.5 x p99 of disconnection durations (",
                F.round(F.col("_dur_p99") / 1000, 1),
                " s), at least 600",
            ),
            _short_of("_dur_n", p99, "disconnections"),
        ),
        _row(
            "queue_max_per_uri",
            queue_ok,
            F.col("_queue"),
            "notifications",
            F.lit("deepest backlog plus drops between two restores"),
            _short_of("_queue_n", p90, "stretches between restores"),
        ),
    )
    return conform(one.select(F.inline(rows)), S.RECOMMENDATION_SCHEMA)


def needed(cfg: JobConfig, quantile: float) -> int:
    """The sample a recommendation from ``quantile`` needs: ``min_tail_observations``
    above the quantile (a p99 from 50 values is their maximum, not a p99), and one at
    the least."""
    return max(1, math.ceil(cfg.min_tail_observations / (1.0 - quantile) - 1e-9))


def _basis(before: str, figure: Column, after: str) -> Column:
    return F.concat(F.lit(before), figure.cast("string"), F.lit(after))


def _short_of(count: str, need: int, what: str) -> Column:
    return F.concat(
        F.lit("not enough data: "),
        F.coalesce(F.col(count), F.lit(0)).cast("string"),
        F.lit(f" {what}, {need:,} needed"),
    )


def _row(
    setting: str, enough: Column, value: Column, unit: str, basis: Column, short_of: Column
) -> Column:
    """One recommendation: the value with its basis, or null and why there is none."""
    return F.struct(
        F.lit(setting).alias("setting"),
        F.when(enough, value.cast("double")).alias("value"),
        F.lit(unit).alias("unit"),
        F.when(enough, basis).otherwise(short_of).alias("basis"),
    )
