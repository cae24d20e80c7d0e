"""The churn jobs: pure ``DataFrame -> DataFrame`` functions with explicit output schemas.

Theory of operation. Raw lines (``value``, ``source``) are parsed against the churn-log
schema (:func:`parse_lines`, or :func:`parse_records` for Parquet copies); each row then
either carries a reason it is not a valid record (:func:`quarantine`) or is an event
(:func:`valid_events`, which also drops exact duplicates). Lines may be out of order:
every job orders by ``ts_ms`` itself and never trusts file order.

Disconnection episodes are computed over the *whole* log and then clipped to the time
window ``[since, until)``, so an episode that began before ``since`` still has its true
start, and one still open at ``until`` (or at the end of the log) is marked ``open``.
Every other metric counts the events inside the window only.

One source of truth per event: the broker and the agents both log some facts (a
delivery, a re-INVITE, a session start). Each line says its ``role``; a line counts only
when its role is the event's authoritative one (``schema.AUTHORITY``: the agent for
``ip_changed``, the broker for everything else) or when it has no role (an old log).
The restore latency is the one figure only the device measures: it is the
``latency_ms`` of the *agent's* ``media_connected`` (or of a role-less one). Feeding the
broker's and every agent's logs together therefore counts each fact once.

The definitions, each one written down so that the tests' independent implementation
can follow them:

- address change: an ``ip_changed`` event; handover: a ``session_reinvited`` event
  (the dialog survived the move);
- episode: starts at a ``media_disconnected`` (the broker's) or a ``broker_lost`` (the
  agent's: its broker went silent, which a killed broker cannot log) that follows a
  connected state (or no media event at all), ends at the next ``media_connected``, or
  at a ``session_ended`` (the session it broke is gone; what follows is no session, not
  an outage); further disconnects inside an episode belong to it, and neither a
  disconnect after a session ended nor the broker's tear-down of an ended session
  (reason ``session ended``, which may be logged just before its ``session_ended``)
  starts one. At the same millisecond a session end sorts first, then a disconnect,
  then a connect;
- restore latency: ``latency_ms`` of ``media_connected`` events; percentiles are exact
  with linear interpolation between closest ranks (``numpy.percentile``'s default);
- churn score: ``address_changes + 2 * disconnections + disconnected minutes / 10 +
  5 * notify_dropped``, rounded to 3 decimals: one point per move, two per break, more
  for long breaks and for lost notifications.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics import schema as S
from analytics.parse import conform

HOUR_MS = 3_600_000


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeWindow:
    """The half-open window ``[since_ms, until_ms)`` in epoch milliseconds; None is open."""

    since_ms: int | None = None
    until_ms: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    """Thresholds of the detectors and recommendations; each default says why."""

    window: TimeWindow = field(default_factory=TimeWindow)
    """Which events count; episodes are clipped to it."""
    flap_window_ms: int = 5 * 60_000
    """Flapping: this many milliseconds ..."""
    flap_min_changes: int = 5
    """... holding at least this many address changes of one user."""
    storm_window_ms: int = 60_000
    """Reconnect storm: restores are counted in buckets of this length ..."""
    storm_min_users: int = 8
    """... and a bucket with at least this many distinct users ..."""
    storm_factor: float = 4.0
    """... and this many times the mean restores per bucket of its hour is a storm."""
    latency_edges_ms: tuple[float, ...] = (
        0.0,
        50.0,
        100.0,
        200.0,
        300.0,
        500.0,
        750.0,
        1000.0,
        1500.0,
        2000.0,
        3000.0,
        5000.0,
        10000.0,
    )
    """Lower edges of the restore-latency histogram; the last bucket is open above."""
    live_delivery_ms: float = 2000.0
    """A delivery slower than this was held in a queue, so it says nothing about RTT."""
    short_disconnection_ms: int = 60_000
    """Disconnections shorter than this are blips the RUDP retries should ride out."""
    min_tail_observations: float = 10.0
    """A recommendation from a percentile q needs this many observations above q, so at
    least ``min_tail_observations / (1 - q)`` in all (p99: 1,000, p90: 100); with fewer it
    says "not enough data" instead of a value. 0 takes any sample."""
    ip_cost_per_mb: float = 0.0
    """Price of a megabyte delivered by IP, for the per-device money (0: a flat rate)."""


def ordered(df: DataFrame, *cols: str | Column) -> DataFrame:
    """``df`` (an aggregate: a few rows to tens of thousands) sorted by ``cols``, in one
    partition: a global ``orderBy`` would first sample its input in a job of its own to
    split it into ranges, which for a table this size costs more than the sort."""
    return df.repartition(1).sortWithinPartitions(*cols)


# The columns of the events that the jobs read (the cached events hold only these).
JOB_COLUMNS: tuple[str, ...] = (
    "uri",
    "ts_ms",
    "event",
    "role",
    "addr",
    "prev_addr",
    "channel",
    "queue_depth",
    "latency_ms",
    "cost",
    "reason",
    "node",
    "bytes",
    "missed",
    "nseq",
)


# The events that episode_starts, transitions, restore_latency, flapping, storms,
# handover_matrix, networks and sms_spend read, and the only ones (see :func:`sparse`).
SPARSE_EVENTS: tuple[str, ...] = (
    "ip_changed",
    "media_connected",
    "media_disconnected",
    "broker_lost",
    "session_ended",
    "sms_sent",
    "session_started",
    "session_reinvited",
    "notify_gap",
    "notify_duplicate",
)


def sparse(events: DataFrame) -> DataFrame:
    """The lines of ``events`` that the tables of moves, media edges and SMS read (a sixth
    of a log: no notifications): each of those tables gives the same rows from these as
    from all the events."""
    return events.where(F.col("event").isin(*SPARSE_EVENTS))


def within(window: TimeWindow) -> Column:
    """True for a line whose instant is in ``[since, until)``."""
    cond = F.lit(True)
    if window.since_ms is not None:
        cond = cond & (F.col("ts_ms") >= F.lit(window.since_ms))
    if window.until_ms is not None:
        cond = cond & (F.col("ts_ms") < F.lit(window.until_ms))
    return cond


def in_window(events: DataFrame, window: TimeWindow) -> DataFrame:
    """The events whose instant is in ``[since, until)``."""
    return events.where(within(window))


def is_event(event: str) -> Column:
    return F.col("event") == F.lit(event)


def authority() -> Column:
    """The authoritative role of each line's event (see the module docstring)."""
    agent = F.col("event").isin(*S.AGENT_EVENTS)
    return F.when(agent, F.lit("agent")).otherwise(F.lit("broker"))


def is_fact() -> Column:
    """True for a line that counts: its role is its event's authority, or it has none."""
    return F.col("role").isNull() | (F.col("role") == authority())


def facts(events: DataFrame) -> DataFrame:
    """The lines of ``events`` that count (one per fact; see the module docstring)."""
    return events.where(is_fact())


def restore_ms() -> Column:
    """``latency_ms`` of a restore (an agent's or role-less ``media_connected``), else null."""
    device = F.col("role").isNull() | (F.col("role") == F.lit("agent"))
    return F.when(is_event("media_connected") & device, F.col("latency_ms"))


def _count_of(event: str) -> Column:
    return F.sum(F.when(is_event(event) & is_fact(), 1).otherwise(0)).cast("long")


# The lines that say a user's media went down: the broker's, and the agent's when its
# broker went silent.
DISCONNECTS: tuple[str, ...] = ("media_disconnected", "broker_lost")


# Ties at the same millisecond: a session end first, then a disconnect, then a connect.
def tie_rank() -> Column:
    return (
        F.when(is_event("session_ended"), 0)
        .when(F.col("event").isin(*DISCONNECTS), 1)
        .when(is_event("media_connected"), 2)
        .otherwise(3)
    )


# --------------------------------------------------------------------------- episodes


def episode_starts(events: DataFrame) -> DataFrame:
    """The ``media_disconnected`` (or ``broker_lost``) lines that open an episode, with
    ``_next_ts`` (the instant of the edge that closes it, null while open) and their
    ``addr``; what :func:`episodes` and :func:`networks` are built from (pass it to both,
    cached, to sort the media events of each user once)."""
    state = (*DISCONNECTS, "media_connected", "session_ended")
    # The broker's tear-down of an ended session (reason "session ended") is no outage,
    # whichever of it and session_ended was logged first (as the streaming query and
    # the broker's disconnections metric count it).
    teardown = is_event("media_disconnected") & (
        F.coalesce(F.col("reason"), F.lit("")) == F.lit("session ended")
    )
    # A broker_lost is a disconnect like the broker's own (one episode when both log it).
    down = F.when(is_event("broker_lost"), F.lit("media_disconnected")).otherwise(F.col("event"))
    media = (
        facts(events)
        .where(F.col("event").isin(*state) & ~teardown)
        .select("uri", "ts_ms", down.alias("event"), "addr", tie_rank().alias("_rank"))
    )
    by_user = Window.partitionBy("uri").orderBy("ts_ms", "_rank")
    prev = F.lag("event").over(by_user)
    edges = media.select("*", prev.alias("_prev")).where(
        (
            is_event("media_disconnected")
            & (F.col("_prev").isNull() | (F.col("_prev") == "media_connected"))
        )
        | (~is_event("media_disconnected") & (F.col("_prev") == "media_disconnected"))
    )
    # Edges alternate start, end, start, end ... per user, so an end is the next edge.
    return edges.select(
        "uri",
        "ts_ms",
        "event",
        "addr",
        F.lead("ts_ms").over(by_user).alias("_next_ts"),
    ).where(is_event("media_disconnected"))


def episodes(
    events: DataFrame,
    window: TimeWindow,
    starts: DataFrame | None = None,
    last_ms: int | None = None,
) -> DataFrame:
    """Disconnection episodes (all events in, clipped to ``window``); schema EPISODE_SCHEMA.

    An episode with no restore in the log is ``open`` and ends at ``until``, or, with no
    ``until``, at the last instant of the log. ``starts``: :func:`episode_starts` of
    ``events``, if the caller has it; ``last_ms``: the last instant of ``events``, if
    the caller has it (else it is an aggregate over every event, a scan of its own).
    """
    paired = episode_starts(events) if starts is None else starts
    raw = paired.select(
        "uri",
        F.col("ts_ms").alias("start_ms"),
        F.col("_next_ts").alias("end_ms"),
    )
    if window.until_ms is not None:
        horizon: Column = F.lit(window.until_ms)
    elif last_ms is not None:
        # Nullable, as the aggregate it stands for: a bare literal would make the
        # table's window_end_ms a non-null column, another schema for the same rows.
        horizon = F.when(F.col("end_ms").isNull(), F.lit(last_ms).cast("long"))
    else:
        last = events.agg(F.max("ts_ms").alias("_horizon"))
        raw = raw.crossJoin(F.broadcast(last))
        horizon = F.col("_horizon")
    end = F.coalesce(F.col("end_ms"), horizon)
    keep = F.lit(True)
    lo: Column = F.col("start_ms")
    hi: Column = end
    if window.until_ms is not None:
        keep = keep & (F.col("start_ms") < F.lit(window.until_ms))
        hi = F.least(end, F.lit(window.until_ms))
    if window.since_ms is not None:
        since = F.lit(window.since_ms)
        keep = keep & ((end > since) | (F.col("start_ms") >= since))
        lo = F.greatest(F.col("start_ms"), since)
    out = raw.where(keep).select(
        "uri",
        "start_ms",
        "end_ms",
        lo.alias("window_start_ms"),
        hi.alias("window_end_ms"),
        (hi - lo).alias("duration_ms"),
        F.col("end_ms").isNull().alias("open"),
    )
    return conform(out, S.EPISODE_SCHEMA)


# --------------------------------------------------------------------------- per user


def churn_score(
    address_changes: Column, disconnections: Column, disconnected_ms: Column, dropped: Column
) -> Column:
    """The churn score of the module docstring, as a Column."""
    return F.round(
        address_changes + 2 * disconnections + disconnected_ms / F.lit(600_000.0) + 5 * dropped,
        3,
    )


def per_user(events: DataFrame, eps: DataFrame) -> DataFrame:
    """One row per user with events or episodes in the window; schema PER_USER_SCHEMA.

    ``events`` are the events in the window (:func:`in_window`), ``eps`` the episodes of
    :func:`episodes` for the same window.
    """
    restore = restore_ms()
    counts = events.groupBy("uri").agg(
        F.count(F.when(is_fact(), 1)).alias("events"),
        _count_of("ip_changed").alias("address_changes"),
        _count_of("session_reinvited").alias("handovers"),
        F.count(restore).alias("restores"),
        _count_of("session_started").alias("sessions"),
        _count_of("notify_queued").alias("notify_queued"),
        _count_of("notify_delivered").alias("notify_delivered"),
        _count_of("notify_dropped").alias("notify_dropped"),
        _count_of("sms_sent").alias("sms_count"),
        F.sum(F.when(is_event("sms_sent") & is_fact(), F.col("cost"))).alias("_sms_cost"),
    )
    # The percentiles in an aggregate of their own, over the restores only: an exact
    # percentile is an object aggregate, which Spark neither compiles nor keeps in a hash
    # table past 128 keys per task; next to the counts it made Spark sort every event of
    # the log by user (10 of the per-user job's 11 s of CPU at 10M events). The counts
    # alone are a compiled hash aggregate, and the restores are a thirteenth of the log.
    pct = (
        events.where(restore.isNotNull())
        .groupBy("uri")
        .agg(F.percentile(restore, [0.5, 0.95, 0.99]).alias("_pct"))
    )
    # A user seen only through the other role's copies has no fact to report.
    counts = counts.where((F.col("events") > 0) | (F.col("restores") > 0)).join(pct, "uri", "left")
    per_ep = eps.groupBy("uri").agg(
        F.count(F.lit(1)).alias("disconnections"),
        F.sum("duration_ms").alias("disconnected_ms"),
        F.max("duration_ms").alias("longest_disconnection_ms"),
    )
    joined = counts.join(per_ep, "uri", "full_outer")
    zero = F.lit(0).cast("long")
    longs = [
        "events",
        "address_changes",
        "handovers",
        "restores",
        "sessions",
        "notify_queued",
        "notify_delivered",
        "notify_dropped",
        "sms_count",
        "disconnections",
        "disconnected_ms",
        "longest_disconnection_ms",
    ]
    filled = joined.select(
        "uri",
        *[F.coalesce(F.col(c), zero).alias(c) for c in longs],
        F.col("_pct"),
        F.round(F.coalesce(F.col("_sms_cost"), F.lit(0.0)), 4).alias("sms_cost"),
    )
    out = filled.select(
        "*",
        F.col("_pct")[0].alias("restore_p50_ms"),
        F.col("_pct")[1].alias("restore_p95_ms"),
        F.col("_pct")[2].alias("restore_p99_ms"),
        churn_score(
            F.col("address_changes"),
            F.col("disconnections"),
            F.col("disconnected_ms"),
            F.col("notify_dropped"),
        ).alias("churn_score"),
    )
    return conform(out, S.PER_USER_SCHEMA)


# --------------------------------------------------------------------------- per hour


def hour_of(ms: Column) -> Column:
    """The start of the UTC hour holding the instant ``ms`` (epoch milliseconds)."""
    return ms - F.pmod(ms, F.lit(HOUR_MS))


def per_hour(events: DataFrame, eps: DataFrame, window: TimeWindow) -> DataFrame:
    """One row per UTC hour with events in the window; schema PER_HOUR_SCHEMA.

    ``disconnections`` counts the episodes that *began* in that hour (inside the window).
    """
    # Per user and hour first, then per hour: the first step needs no shuffle (the events
    # are partitioned by user) and leaves one row per active user-hour, which the second
    # counts; a distinct count in one step would double every row (Spark's expand) and
    # shuffle them all.
    user_hours = (
        facts(events)
        .groupBy(hour_of(F.col("ts_ms")).alias("_hour"), "uri")
        .agg(
            F.count(F.lit(1)).alias("_events"),
            _count_of("ip_changed").alias("_address_changes"),
            _count_of("session_reinvited").alias("_handovers"),
            _count_of("notify_dropped").alias("_notify_dropped"),
            _count_of("sms_sent").alias("_sms_count"),
            F.sum(F.when(is_event("sms_sent"), F.col("cost"))).alias("_sms_cost"),
        )
    )
    hourly = user_hours.groupBy("_hour").agg(
        F.count(F.lit(1)).alias("active_users"),  # uri is never null in an event
        *[
            F.sum(f"_{c}").alias(c)
            for c in ("events", "address_changes", "handovers", "notify_dropped", "sms_count")
        ],
        F.round(F.coalesce(F.sum("_sms_cost"), F.lit(0.0)), 4).alias("sms_cost"),
    )
    began = eps
    if window.since_ms is not None:
        began = began.where(F.col("start_ms") >= F.lit(window.since_ms))
    starts = began.groupBy(hour_of(F.col("start_ms")).alias("_hour")).agg(
        F.count(F.lit(1)).alias("disconnections")
    )
    out = hourly.join(starts, "_hour", "left").select(
        F.timestamp_millis(F.col("_hour")).alias("hour"),
        *[c for c in hourly.columns if c != "_hour"],
        F.coalesce(F.col("disconnections"), F.lit(0)).alias("disconnections"),
    )
    return ordered(conform(out, S.PER_HOUR_SCHEMA), "hour")


# ----------------------------------------------------------------- mobility graph etc.


def subnet_of(addr: Column) -> Column:
    """``a.b.c.0/24`` for an IPv4 ``ip:port``; otherwise the address without its port."""
    v4 = F.regexp_extract(addr, r"^(\d{1,3}\.\d{1,3}\.\d{1,3})\.\d{1,3}(:\d+)?$", 1)
    v6 = F.regexp_extract(addr, r"^\[([^\]]+)\](:\d+)?$", 1)
    return F.when(v4 != "", F.concat(v4, F.lit(".0/24"))).when(v6 != "", v6).otherwise(addr)


def transitions(events: DataFrame) -> DataFrame:
    """Subnet-to-subnet moves (the mobility graph) from ``ip_changed``; TRANSITION_SCHEMA."""
    moves = (
        facts(events)
        .where(is_event("ip_changed") & F.col("addr").isNotNull() & F.col("prev_addr").isNotNull())
        .select(
            subnet_of(F.col("prev_addr")).alias("from_subnet"),
            subnet_of(F.col("addr")).alias("to_subnet"),
            "uri",
        )
    )
    out = moves.groupBy("from_subnet", "to_subnet").agg(
        F.count(F.lit(1)).alias("transitions"), F.countDistinct("uri").alias("users")
    )
    return ordered(
        conform(out, S.TRANSITION_SCHEMA), F.desc("transitions"), "from_subnet", "to_subnet"
    )


def restore_latency(events: DataFrame, cfg: JobConfig) -> DataFrame:
    """Histogram and CDF of restore latencies (non-empty buckets only); LATENCY_SCHEMA."""
    edges = sorted(cfg.latency_edges_ms)
    lat = F.col("_restore_ms")
    # Walk the edges from the top so that the first matching WHEN is the right bucket.
    lo_expr = F.when(lat >= edges[-1], F.lit(edges[-1]))
    hi_expr = F.when(lat >= edges[-1], F.lit(None).cast("double"))
    for i in range(len(edges) - 2, -1, -1):
        lo_expr = lo_expr.when(lat >= edges[i], F.lit(edges[i]))
        hi_expr = hi_expr.when(lat >= edges[i], F.lit(edges[i + 1]))
    lo = lo_expr.otherwise(F.lit(edges[0]))  # below the first edge: the first bucket
    hi = hi_expr.otherwise(F.lit(edges[1] if len(edges) > 1 else None))
    restores = events.select(restore_ms().alias("_restore_ms")).where(lat.isNotNull())
    buckets = restores.groupBy(lo.alias("bucket_lo_ms"), hi.alias("bucket_hi_ms")).agg(
        F.count(F.lit(1)).alias("restores")
    )
    total = restores.agg(F.count(F.lit(1)).alias("_total"))
    # A dozen buckets: one partition is their honest size, and naming it (rather than
    # leaving the window unpartitioned) says so to Spark, which would warn otherwise.
    upto = (
        Window.partitionBy(F.lit(0))
        .orderBy("bucket_lo_ms")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    out = buckets.crossJoin(F.broadcast(total)).select(
        "*", (F.sum("restores").over(upto) / F.col("_total")).alias("cumulative_fraction")
    )
    return ordered(conform(out, S.LATENCY_SCHEMA), "bucket_lo_ms")


def flapping(events: DataFrame, cfg: JobConfig) -> DataFrame:
    """Users changing address many times within minutes; schema FLAPPING_SCHEMA.

    A change is *flagged* when the trailing ``flap_window_ms`` (inclusive) holds at least
    ``flap_min_changes`` changes of its user; every change inside a flagged window belongs
    to a flap, and flap changes less than a window apart are one row.
    """
    w = cfg.flap_window_ms
    changes = facts(events).where(is_event("ip_changed")).select("uri", "ts_ms")
    by_time = Window.partitionBy("uri").orderBy("ts_ms")
    back = by_time.rangeBetween(-w, 0)
    ahead = by_time.rangeBetween(0, w)
    counted = changes.select("*", F.count(F.lit(1)).over(back).alias("_n"))
    flagged = counted.select("*", (F.col("_n") >= cfg.flap_min_changes).cast("int").alias("_flag"))
    inside = flagged.select("*", F.max("_flag").over(ahead).alias("_in")).where(F.col("_in") == 1)
    gap = F.col("ts_ms") - F.lag("ts_ms").over(by_time)
    bursts = inside.select(
        "*", F.when(gap.isNull() | (gap > w), 1).otherwise(0).alias("_new")
    ).select(
        "*", F.sum("_new").over(by_time.rowsBetween(Window.unboundedPreceding, 0)).alias("_burst")
    )
    out = bursts.groupBy("uri", "_burst").agg(
        F.min("ts_ms").alias("start_ms"),
        F.max("ts_ms").alias("end_ms"),
        F.count(F.lit(1)).alias("changes"),
        F.max("_n").alias("peak_changes_in_window"),
    )
    return ordered(conform(out, S.FLAPPING_SCHEMA), "uri", "start_ms")


def storms(events: DataFrame, cfg: JobConfig) -> DataFrame:
    """Reconnect storms: buckets where many users restore at once; schema STORM_SCHEMA.

    Restores (``media_connected``) are counted per bucket of ``storm_window_ms``. A bucket
    is stormy when its distinct users reach ``storm_min_users`` *and* ``storm_factor``
    times the mean restores per bucket of its UTC hour: at rush hour many users restore
    every minute by chance, and only a burst well above that baseline is a storm.
    Adjacent stormy buckets are one storm.
    """
    w = cfg.storm_window_ms
    ts = F.col("ts_ms")
    restores = (
        facts(events)
        .where(is_event("media_connected"))
        .select("uri", (ts - F.pmod(ts, F.lit(w))).alias("_bucket"), hour_of(ts).alias("_hour"))
    )
    per_bucket = restores.groupBy("_bucket", "_hour").agg(F.countDistinct("uri").alias("_users"))
    baseline = restores.groupBy("_hour").agg(
        (F.count(F.lit(1)) / F.lit(HOUR_MS / w)).alias("_per_bucket")
    )
    stormy = per_bucket.join(baseline, "_hour").where(
        (F.col("_users") >= cfg.storm_min_users)
        & (F.col("_users") >= F.col("_per_bucket") * cfg.storm_factor)
    )
    # Adjacent buckets share (bucket / w - row number): the classic gaps-and-islands trick.
    seq = Window.partitionBy(F.lit(0)).orderBy("_bucket")  # few rows: see restore_latency
    islands = stormy.select(
        "_bucket", (F.col("_bucket") / F.lit(w) - F.row_number().over(seq)).alias("_island")
    )
    joined = restores.join(islands, "_bucket")
    out = joined.groupBy("_island").agg(
        F.min("_bucket").alias("start_ms"),
        (F.max("_bucket") + F.lit(w)).alias("end_ms"),
        F.countDistinct("uri").alias("users"),
        F.count(F.lit(1)).alias("reconnects"),
    )
    return ordered(conform(out, S.STORM_SCHEMA), "start_ms")


# ------------------------------------------------------------------- per network


def handover_matrix(events: DataFrame) -> DataFrame:
    """Moves between subnets with the restore latency that followed them;
    HANDOVER_MATRIX_SCHEMA, heaviest first.

    Each restore (see :func:`restore_ms`) is charged to the user's latest address change
    at or before it (at the same millisecond the change comes first), so the p50/p95 of a
    row say how long sessions took to come back after that kind of move.
    """
    moves = facts(events).where(
        is_event("ip_changed") & F.col("addr").isNotNull() & F.col("prev_addr").isNotNull()
    )
    lines = events.where((is_event("ip_changed") & is_fact()) | restore_ms().isNotNull()).select(
        "uri",
        "ts_ms",
        F.when(is_event("ip_changed"), 0).otherwise(1).alias("_rank"),
        F.when(
            is_event("ip_changed"),
            F.struct(subnet_of(F.col("prev_addr")).alias("f"), subnet_of(F.col("addr")).alias("t")),
        ).alias("_move"),
        restore_ms().alias("_restore"),
    )
    upto = (
        Window.partitionBy("uri")
        .orderBy("ts_ms", "_rank")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    charged = lines.select(
        "_restore", F.last("_move", ignorenulls=True).over(upto).alias("_last")
    ).where(F.col("_restore").isNotNull() & F.col("_last").isNotNull())
    restores = charged.groupBy(
        F.col("_last.f").alias("from_subnet"), F.col("_last.t").alias("to_subnet")
    ).agg(
        F.count(F.lit(1)).alias("restores"),
        F.percentile("_restore", [0.5, 0.95]).alias("_pct"),
    )
    counts = moves.groupBy(
        subnet_of(F.col("prev_addr")).alias("from_subnet"),
        subnet_of(F.col("addr")).alias("to_subnet"),
    ).agg(F.count(F.lit(1)).alias("handovers"), F.countDistinct("uri").alias("users"))
    out = counts.join(restores, ["from_subnet", "to_subnet"], "left").select(
        "from_subnet",
        "to_subnet",
        "handovers",
        "users",
        F.coalesce(F.col("restores"), F.lit(0)).alias("restores"),
        F.col("_pct")[0].alias("restore_p50_ms"),
        F.col("_pct")[1].alias("restore_p95_ms"),
    )
    return ordered(
        conform(out, S.HANDOVER_MATRIX_SCHEMA), F.desc("handovers"), "from_subnet", "to_subnet"
    )


def networks(events: DataFrame, window: TimeWindow, starts: DataFrame | None = None) -> DataFrame:
    """Per subnet: disconnection episodes that began there (in the window), and restores
    that landed there; NETWORK_SCHEMA. ``events`` is the whole log (episodes need it);
    ``starts`` as for :func:`episodes`."""
    starts = (episode_starts(events) if starts is None else starts).where(F.col("addr").isNotNull())
    if window.since_ms is not None:
        starts = starts.where(F.col("ts_ms") >= F.lit(window.since_ms))
    if window.until_ms is not None:
        starts = starts.where(F.col("ts_ms") < F.lit(window.until_ms))
    down = starts.groupBy(subnet_of(F.col("addr")).alias("subnet")).agg(
        F.count(F.lit(1)).alias("disconnections"),
        F.countDistinct("uri").alias("users_disconnected"),
    )
    current = in_window(events, window)
    up = (
        current.where(restore_ms().isNotNull() & F.col("addr").isNotNull())
        .groupBy(subnet_of(F.col("addr")).alias("subnet"))
        .agg(
            F.count(F.lit(1)).alias("restores"),
            F.percentile(restore_ms(), [0.5, 0.95]).alias("_pct"),
        )
    )
    zero = F.lit(0).cast("long")
    out = down.join(up, "subnet", "full_outer").select(
        "subnet",
        F.coalesce(F.col("disconnections"), zero).alias("disconnections"),
        F.coalesce(F.col("users_disconnected"), zero).alias("users_disconnected"),
        F.coalesce(F.col("restores"), zero).alias("restores"),
        F.col("_pct")[0].alias("restore_p50_ms"),
        F.col("_pct")[1].alias("restore_p95_ms"),
    )
    return ordered(conform(out, S.NETWORK_SCHEMA), F.desc("disconnections"), "subnet")


def sms_spend(events: DataFrame) -> DataFrame:
    """SMS sent and their cost per user per UTC day; SMS_SPEND_SCHEMA."""
    sent = facts(events).where(is_event("sms_sent"))
    out = sent.groupBy("uri", F.to_date(F.timestamp_millis(F.col("ts_ms"))).alias("day")).agg(
        F.count(F.lit(1)).alias("sms_count"),
        F.round(F.coalesce(F.sum("cost"), F.lit(0.0)), 4).alias("sms_cost"),
    )
    return ordered(conform(out, S.SMS_SPEND_SCHEMA), "day", "uri")
