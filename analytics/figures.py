"""The figures the seed papers judge a mobility service by, per move, device, network and broker.

- Per move (Siena's Table 3 is the model): each address change with its old and new
  network, the restore time that followed it, and the notifications lost and duplicated
  because of it. A line after a move is charged to the user's latest move at or before
  it (at the same millisecond the move comes first): the first restore, every gap's
  ``missed`` count (notifications the broker discarded and said so) and every duplicate
  the agent's gate refused.
- Per device (the thesis): the deliveries, bytes and money of each channel. Bytes are
  the device's own count (its ``notify_delivered`` lines); money is what the broker paid
  for SMS (``sms_sent``'s ``cost``) and, for IP, the bytes at ``ip_cost_per_mb``.
- End-to-end latency (Walkabout): publish to delivery at the device (the agent's
  ``notify_delivered``: its ``latency_ms``, from ``published`` to ``ts``) per network
  type: the SMS channel, or for IP the subnet of the device's address at that moment.
- Per user, the network decisions against "always deliver now" (the thesis' selector):
  from the broker's ``channel_decided`` lines, one notification (``nseq``) at a time,
  counting those that were delivered (a line whose reason says ``decision=deliver``).
  ``cost_now`` is what its first line priced (a ``wait`` line: the network the device
  was on then; a ``deliver`` line: where it went), ``cost_paid`` what its last
  ``deliver`` line priced; ``saved`` is the difference. ``waited`` counts the ones with
  a ``wait`` line, ``bytes_moved`` their bytes when the deliver line's ``network=`` is
  not the first line's (carried off the network they would have gone on). At one
  millisecond a ``wait`` line comes before a ``deliver`` line. A missing cost counts 0.
- Per broker (several brokers): sessions started, handoffs (re-INVITEs) and failovers
  (a session started at a broker while the user's last session, at another broker, never
  ended), from the broker's lines and their ``node``; empty for a log without them.

Device-side lines are the agent's, or role-less ones (logs from before the ``role``
field), as for the restore latency (see :mod:`analytics.jobs`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics import schema as S
from analytics.jobs import JobConfig, facts, is_event, is_fact, ordered, restore_ms, subnet_of
from analytics.parse import conform


def _device() -> Column:
    """True for a line the device wrote (or a role-less one)."""
    return F.col("role").isNull() | (F.col("role") == F.lit("agent"))


def per_move(events: DataFrame) -> DataFrame:
    """One row per move with what followed it; PER_MOVE_SCHEMA, in time order per user."""
    move = is_event("ip_changed") & is_fact()
    charged = (
        is_event("notify_gap") | is_event("notify_duplicate") | restore_ms().isNotNull()
    ) & _device()
    lines = events.where(move | charged).select(
        "uri",
        "ts_ms",
        F.when(move, 0).otherwise(1).alias("_rank"),
        F.when(move, F.col("ts_ms")).alias("_move"),
        F.when(is_event("notify_gap"), F.coalesce(F.col("missed"), F.lit(0))).alias("_lost"),
        F.when(is_event("notify_duplicate"), 1).alias("_dup"),
        F.when(
            restore_ms().isNotNull(), F.struct(F.col("ts_ms"), restore_ms().alias("latency_ms"))
        ).alias("_up"),
    )
    upto = (
        Window.partitionBy("uri")
        .orderBy("ts_ms", "_rank")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    after = (
        lines.select("*", F.last("_move", ignorenulls=True).over(upto).alias("_at"))
        .where((F.col("_rank") == 1) & F.col("_at").isNotNull())
        .groupBy("uri", "_at")
        .agg(
            F.sum("_lost").alias("_lost"),
            F.count("_dup").alias("_dup"),
            F.min("_up").alias("_up"),
        )
        .withColumnRenamed("_at", "ts_ms")
    )
    moves = events.where(move).select(
        "uri",
        "ts_ms",
        subnet_of(F.col("prev_addr")).alias("old_network"),
        subnet_of(F.col("addr")).alias("new_network"),
        F.col("reason"),
    )
    out = moves.join(after, ["uri", "ts_ms"], "left").select(
        "uri",
        "ts_ms",
        "old_network",
        "new_network",
        "reason",
        F.col("_up.latency_ms").alias("restore_ms"),
        F.coalesce(F.col("_lost"), F.lit(0)).alias("lost"),
        F.coalesce(F.col("_dup"), F.lit(0)).alias("duplicated"),
    )
    return ordered(conform(out, S.PER_MOVE_SCHEMA), "uri", "ts_ms")


def per_device(events: DataFrame, cfg: JobConfig) -> DataFrame:
    """Deliveries, bytes and money per user and channel; PER_DEVICE_SCHEMA."""
    channel = F.coalesce(F.col("channel"), F.lit("ip"))
    got = (
        events.where(is_event("notify_delivered") & _device())
        .groupBy("uri", channel.alias("channel"))
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            F.sum(F.coalesce(F.col("bytes"), F.lit(0))).alias("bytes"),
        )
    )
    paid = (
        facts(events)
        .where(is_event("sms_sent"))
        .groupBy("uri", F.lit("sms").alias("channel"))
        .agg(F.sum(F.coalesce(F.col("cost"), F.lit(0.0))).alias("_sms_cost"))
    )
    zero = F.lit(0).cast("long")
    ip_cost = F.col("bytes") / F.lit(1_000_000.0) * F.lit(cfg.ip_cost_per_mb)
    out = got.join(paid, ["uri", "channel"], "full_outer").select(
        "uri",
        "channel",
        F.coalesce(F.col("deliveries"), zero).alias("deliveries"),
        F.coalesce(F.col("bytes"), zero).alias("bytes"),
        F.round(
            F.when(F.col("channel") == "sms", F.coalesce(F.col("_sms_cost"), F.lit(0.0)))
            .otherwise(F.coalesce(ip_cost, F.lit(0.0)))
            .cast("double"),
            4,
        ).alias("cost"),
    )
    return ordered(conform(out, S.PER_DEVICE_SCHEMA), "uri", "channel")


def latency_by_network(events: DataFrame) -> DataFrame:
    """End-to-end delivery latency per network type; LATENCY_BY_NETWORK_SCHEMA."""
    where = F.col("addr").isNotNull() & (
        is_event("registered")
        | is_event("session_started")
        | is_event("ip_changed")
        | is_event("media_connected")
    )
    delivery = is_event("notify_delivered") & _device() & F.col("latency_ms").isNotNull()
    lines = events.where(where | delivery).select(
        "uri",
        "ts_ms",
        F.when(where, 0).otherwise(1).alias("_rank"),
        F.when(where, F.col("addr")).alias("_addr"),
        F.when(delivery, F.col("latency_ms")).alias("_lat"),
        F.coalesce(F.col("channel"), F.lit("ip")).alias("channel"),
    )
    upto = (
        Window.partitionBy("uri")
        .orderBy("ts_ms", "_rank")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    placed = lines.select(
        "channel", "_lat", F.last("_addr", ignorenulls=True).over(upto).alias("_where")
    ).where(F.col("_lat").isNotNull())
    network = F.when(F.col("channel") == "sms", F.lit("sms")).otherwise(
        F.coalesce(subnet_of(F.col("_where")), F.lit("unknown"))
    )
    out = placed.groupBy("channel", network.alias("network")).agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.percentile("_lat", [0.5, 0.95, 0.99]).alias("_pct"),
        F.avg("_lat").alias("mean_ms"),
    )
    out = out.select(
        "channel",
        "network",
        "deliveries",
        F.col("_pct")[0].alias("p50_ms"),
        F.col("_pct")[1].alias("p95_ms"),
        F.col("_pct")[2].alias("p99_ms"),
        "mean_ms",
    )
    return ordered(conform(out, S.LATENCY_BY_NETWORK_SCHEMA), F.desc("deliveries"), "network")


def saved(events: DataFrame) -> DataFrame:
    """The network decisions per user against "always deliver now"; SAVED_SCHEMA."""
    reason = F.coalesce(F.col("reason"), F.lit(""))
    wait = reason.contains("decision=wait")
    deliver = reason.contains("decision=deliver")
    net = F.regexp_extract(reason, r"network=(\S*)", 1)
    cost = F.coalesce(F.col("cost"), F.lit(0.0)).cast("double")
    lines = (
        facts(events)
        .where(is_event("channel_decided") & F.col("nseq").isNotNull() & (wait | deliver))
        .select(
            "uri",
            "nseq",
            F.struct(
                F.col("ts_ms"),
                F.when(wait, 0).otherwise(1).alias("r"),
                cost.alias("c"),
                net.alias("n"),
            ).alias("_at"),
            wait.alias("_wait"),
            deliver.alias("_deliver"),
            F.coalesce(F.col("bytes"), F.lit(0)).cast("long").alias("_bytes"),
        )
    )
    each = (
        lines.groupBy("uri", "nseq")
        .agg(
            F.min("_at").alias("_first"),
            F.max(F.when(F.col("_deliver"), F.col("_at"))).alias("_last"),
            F.max(F.col("_wait").cast("int")).alias("_waited"),
            F.max("_bytes").alias("_bytes"),
        )
        .where(F.col("_last").isNotNull())
    )
    moved = (F.col("_waited") == 1) & (F.col("_first.n") != F.col("_last.n"))
    zero = F.lit(0).cast("long")
    out = each.groupBy("uri").agg(
        F.count(F.lit(1)).alias("decided"),
        F.sum("_waited").cast("long").alias("waited"),
        F.sum(F.when(moved, F.col("_bytes")).otherwise(zero)).alias("bytes_moved"),
        F.sum("_first.c").alias("cost_now"),
        F.sum("_last.c").alias("cost_paid"),
    )
    out = out.select("*", (F.col("cost_now") - F.col("cost_paid")).alias("saved"))
    return ordered(conform(out, S.SAVED_SCHEMA), "uri")


def per_broker(events: DataFrame) -> DataFrame:
    """Sessions, handoffs and failovers per broker node; PER_BROKER_SCHEMA."""
    mine = events.where(
        (F.col("role") == F.lit("broker"))
        & F.col("node").isNotNull()
        & F.col("event").isin("session_started", "session_reinvited", "session_ended")
    )
    edges = mine.where(~is_event("session_reinvited"))
    last = Window.partitionBy("uri").orderBy("ts_ms", F.when(is_event("session_ended"), 0))
    starts = edges.select(
        "uri",
        "node",
        "event",
        (
            is_event("session_started")
            & (F.lag("event").over(last) == F.lit("session_started"))
            & (F.lag("node").over(last) != F.col("node"))
        ).alias("_failover"),
    ).where(is_event("session_started"))
    started = starts.groupBy(F.col("node").alias("broker")).agg(
        F.count(F.lit(1)).alias("sessions"),
        F.sum(F.col("_failover").cast("long")).alias("failovers"),
    )
    moved = (
        mine.where(is_event("session_reinvited"))
        .groupBy(F.col("node").alias("broker"))
        .agg(F.count(F.lit(1)).alias("handoffs"))
    )
    users = mine.groupBy(F.col("node").alias("broker")).agg(F.countDistinct("uri").alias("users"))
    zero = F.lit(0).cast("long")
    out = (
        users.join(started, "broker", "left")
        .join(moved, "broker", "left")
        .select(
            "broker",
            "users",
            F.coalesce(F.col("sessions"), zero).alias("sessions"),
            F.coalesce(F.col("handoffs"), zero).alias("handoffs"),
            F.coalesce(F.col("failovers"), zero).alias("failovers"),
        )
    )
    return ordered(conform(out, S.PER_BROKER_SCHEMA), "broker")
