"""``mdeci analytics churn``: read the logs, run every job of :mod:`analytics.jobs`, write tables.

This module owns the I/O (finding input files, caching, writing Parquet and CSV); the
jobs themselves stay pure functions of DataFrames.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from analytics import figures, jobs, output, parse, recommend
from analytics import schema as S
from analytics.errors import InputError, JobError
from analytics.inputs import Inputs, find_inputs, is_remote, read_parsed

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
    "handover_matrix": "subnet to subnet: handovers, users, restore p50/p95 after the move",
    "networks": "per subnet: disconnections that began there, restores and their p50/p95",
    "sms_spend": "SMS count and spend per user per UTC day",
    "per_move": "every move: old and new network, restore time, notifications lost and duplicated",
    "per_device": "per user and channel: deliveries, bytes and money",
    "latency_by_network": "end-to-end delivery latency (publish to device) per network type",
    "per_broker": "per broker node: users, sessions, handoffs, failovers",
    "saved": "per user: the network decisions' money and bytes against always deliver now",
    "summary": "headline numbers (metric, value)",
}


# Table jobs of the regular path run this many at a time (see _run_large).
TABLE_THREADS = 3
# The order in which they start when what they share is in the columnar cache (built
# by the first job that reads it): the episodes and the per-user table first.
CACHED_ORDER: tuple[str, ...] = (
    "episodes",
    "per_user",
    "per_hour",
    "transitions",
    "restore_latency",
    "flapping",
    "storms",
    "recommendations",
    "handover_matrix",
    "networks",
    "sms_spend",
    "per_move",
    "per_broker",
    "per_device",
    "latency_by_network",
    "saved",
    "_stats",
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


SUM_COLUMNS = (
    "events",
    "address_changes",
    "handovers",
    "disconnections",
    "disconnected_ms",
    "restores",
    "notify_queued",
    "notify_delivered",
    "notify_dropped",
    "sms_count",
    "sms_cost",
)


@contextmanager
def _settings(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """The session's ``settings`` for the block (read when a plan is made), then what
    they were before, or unset again."""
    saved = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _persist(df: DataFrame, _name: str) -> DataFrame:
    # Planned without adaptive execution (the cached plan is made here): an adaptive plan
    # not yet run reports no partitioning, and every per-user window over the cache would
    # shuffle its rows by user again; see _Held.
    with _settings(df.sparkSession, {ADAPTIVE: "false"}):
        return df.persist(StorageLevel.MEMORY_AND_DISK)


def _tables(
    events: DataFrame,
    cfg: jobs.JobConfig,
    hold: Callable[[DataFrame, str], DataFrame] = _persist,
    *,
    last_ms: int | None = None,
    ready: Callable[[str, DataFrame], None] | None = None,
) -> tuple[dict[str, DataFrame], list[DataFrame]]:
    """The table jobs over ``events``, and what they cache (for the caller to drop):
    ``hold`` keeps what several tables read (the sparse events, the episode starts, the
    episodes, the per-user table). ``last_ms`` is the last instant of ``events``, if
    known (the episodes then need no scan of every event for it).

    ``ready`` is told of each table as soon as what it reads is held, and of ``_stats``
    (the restore percentiles of the summary, :func:`_restore_percentiles`): with a
    ``hold`` that computes as it holds, the tables that need only the sparse events
    start while the episodes are still being computed.
    """
    window = cfg.window
    tell = ready or (lambda _name, _df: None)
    tables: dict[str, DataFrame] = {}

    def add(name: str, df: DataFrame) -> None:
        tables[name] = df
        tell(name, df)

    current = jobs.in_window(events, window)
    # Eight of the tables read only a sixth of the lines (moves, media edges, SMS): they
    # read them from a frame of their own, held like the rest, instead of each scanning
    # every event (notifications are three quarters of a log).
    sparse = hold(jobs.sparse(events), "sparse events")
    sparse_now = jobs.in_window(sparse, window)
    tell("_stats", _restore_percentiles(sparse_now))
    add("transitions", jobs.transitions(sparse_now))
    add("restore_latency", jobs.restore_latency(sparse_now, cfg))
    add("flapping", jobs.flapping(sparse_now, cfg))
    add("storms", jobs.storms(sparse_now, cfg))
    add("handover_matrix", jobs.handover_matrix(sparse_now))
    add("sms_spend", jobs.sms_spend(sparse_now))
    add("per_move", figures.per_move(sparse_now))
    add("per_broker", figures.per_broker(sparse_now))
    starts = hold(jobs.episode_starts(sparse), "episode starts")
    add("networks", jobs.networks(sparse, window, starts))
    eps = hold(jobs.episodes(events, window, starts, last_ms), "episodes")
    add("episodes", eps)
    add("per_hour", jobs.per_hour(current, eps, window))
    add("recommendations", recommend.recommendations(current, eps, cfg))
    add("per_device", figures.per_device(current, cfg))
    add("latency_by_network", figures.latency_by_network(current))
    add("saved", figures.saved(current))
    user = hold(jobs.per_user(current, eps), "per_user")
    add("per_user", user)
    return tables, [sparse, starts, eps, user]


def _restore_percentiles(sparse_now: DataFrame) -> DataFrame:
    """The restore percentiles of the summary, from the sparse events in the window: every
    restore is a ``media_connected``, one of the sparse events, so this reads a sixth of
    the lines that :func:`_stats` reads for the same figures."""
    return sparse_now.agg(F.percentile(jobs.restore_ms(), [0.5, 0.95, 0.99]).alias("p"))


def _event_metrics(window: jobs.TimeWindow) -> tuple[Column, ...]:
    """What the summary and the episodes need to know of all the events, as aggregates
    computed on the way to the held or cached events: their number, the last instant
    of the log (the end of an open episode), and the first and last fact and the
    other-role copies in the window (:func:`_stats`'s figures other than percentiles)."""
    now = jobs.within(window)
    fact = jobs.is_fact()
    ts = F.col("ts_ms")
    return (
        F.count(F.lit(1)).alias("events"),
        F.max(ts).alias("last_ms"),
        F.min(F.when(now & fact, ts)).alias("a"),
        F.max(F.when(now & fact, ts)).alias("b"),
        F.count(F.when(now & ~fact, 1)).alias("copies"),
    )


def _stats(current: DataFrame) -> DataFrame:
    """Restore percentiles over the window, its first and last fact, other-role copies."""
    return current.agg(
        F.percentile(jobs.restore_ms(), [0.5, 0.95, 0.99]).alias("p"),
        F.min(F.when(jobs.is_fact(), F.col("ts_ms"))).alias("a"),
        F.max(F.when(jobs.is_fact(), F.col("ts_ms"))).alias("b"),
        F.count(F.when(~jobs.is_fact(), 1)).alias("copies"),
    )


@dataclass(frozen=True, slots=True)
class Counts:
    """What a run knows when its tables are written, for the summary (:func:`summarise`):
    lines read, invalid, events kept, rows per table, the per-user totals of
    :data:`SUM_COLUMNS` and the figures of :func:`_stats`."""

    lines: int
    invalid: int
    events: int
    rows: dict[str, int]
    totals: dict[str, Any]
    stats: dict[str, Any]


def _run(
    spark: SparkSession,
    inputs: Inputs,
    out: str,
    cfg: jobs.JobConfig,
    csv: bool,
    keep_extra: bool,
    say: Callable[[str], None],
) -> ChurnResult:
    # One parse: the parsed lines are cached (compressed columns; the raw text is kept
    # only for invalid lines) for the two things read from them, the quarantine and the
    # de-duplicated events, which are cached in turn, partitioned by user, for every job.
    say(f"parsing {len(inputs.paths)} {inputs.fmt} input(s), quarantining invalid lines")
    local = not is_remote(out)
    if inputs.small and local and not keep_extra:
        parsed = read_parsed(spark, inputs, keep_extra=keep_extra)
        counts = _run_small(spark, parsed, out, cfg, csv, say)
    else:
        again = None
        if inputs.fmt == "parquet":
            # The first read of a Parquet log feeds the events only (invalid lines are
            # counted, not written): no source; the quarantine pass reads it again.
            parsed = read_parsed(spark, inputs, keep_extra=keep_extra, source=False)

            def again() -> DataFrame:
                return read_parsed(spark, inputs, keep_extra=keep_extra)

        else:
            parsed = read_parsed(spark, inputs, keep_extra=keep_extra)
        # Rows instead of the columnar cache: a moderate log on this machine (a local
        # checkpoint lives in the executors' memory, which a cluster may take back).
        rows = inputs.moderate and (spark.sparkContext.master or "").startswith("local")
        counts = _run_large(spark, parsed, out, cfg, csv, keep_extra, local, say, again, rows=rows)
    summary = summarise(counts, cfg.window)
    output.write_summary(spark, summary, out, csv=csv, local=local)
    output.write_provenance(spark, inputs, out, local=local)
    return ChurnResult(summary=summary, output=out)


def summarise(counts: Counts, window: jobs.TimeWindow) -> dict[str, float]:
    """The ``summary`` table of a run, in its order (either engine)."""
    summary: dict[str, float] = {
        "lines": float(counts.lines),
        "invalid_lines": float(counts.invalid),
        "duplicates_dropped": float(counts.lines - counts.invalid - counts.events),
        "events": float(counts.events),
        "other_role_copies": float(counts.stats["copies"] or 0),
        "users": float(counts.rows["per_user"]),
    }
    for key, value in counts.totals.items():
        summary["events_in_window" if key == "events" else key] = float(value or 0)
    summary["disconnected_hours"] = round(summary.pop("disconnected_ms") / 3_600_000, 3)
    pct = counts.stats["p"] or (None, None, None)
    for q, value in zip(("p50", "p95", "p99"), pct, strict=True):
        summary[f"restore_{q}_ms"] = float("nan") if value is None else float(value)
    summary["flaps"] = float(counts.rows["flapping"])
    summary["storms"] = float(counts.rows["storms"])
    for key, name in (("a", "first_ts_ms"), ("b", "last_ts_ms")):
        value = counts.stats[key]
        summary[name] = float("nan") if value is None else float(value)
    if window.since_ms is not None:
        summary["since_ms"] = float(window.since_ms)
    if window.until_ms is not None:
        summary["until_ms"] = float(window.until_ms)
    return summary


def no_events(lines: int, invalid: int, out: str) -> InputError:
    # Nothing to analyse: empty tables would look like a quiet week, not a bad input.
    return InputError(
        f"no valid churn-log lines in the input ({lines} line(s), {invalid} invalid; "
        f"see {out}/quarantine)"
    )


def _run_large(
    spark: SparkSession,
    parsed: DataFrame,
    out: str,
    cfg: jobs.JobConfig,
    csv: bool,
    keep_extra: bool,
    local: bool,
    say: Callable[[str], None],
    reparse: Callable[[], DataFrame] | None = None,
    rows: bool = False,
) -> Counts:
    """The tables of a log too large for :func:`_run_small`, a job or more each, a few
    at a time. With ``rows`` (a local run of a few million lines) the events and what
    several tables share are held as rows (:class:`_Held`), else in Spark's columnar
    cache."""
    held = _Held(spark) if rows else None
    # Held rows: adaptive execution off for the whole run, not only while each frame is
    # held (see _Held): the table jobs now start while later frames are being held, and
    # a setting of the session flipped for one of those would reach them half-way.
    with _settings(spark, {ADAPTIVE: "false"} if rows else {}):
        return _run_tables(spark, parsed, out, cfg, csv, keep_extra, local, say, reparse, held)


def _run_tables(
    spark: SparkSession,
    parsed: DataFrame,
    out: str,
    cfg: jobs.JobConfig,
    csv: bool,
    keep_extra: bool,
    local: bool,
    say: Callable[[str], None],
    reparse: Callable[[], DataFrame] | None,
    held: _Held | None,
) -> Counts:
    spark.sparkContext.setJobDescription("events")
    observed = Observation("lines")
    metrics = (F.count(F.lit(1)).alias("lines"), F.count("error").alias("invalid"))
    if reparse is None:
        # JSON lines: parse once. The parsed rows go to a disk cache (held in memory next
        # to the de-duplication of 10M lines they overran a 3 GB driver) for the two
        # readers, the de-duplicated events and the quarantine.
        parsed = parsed.observe(observed, *metrics).persist(StorageLevel.DISK_ONLY)
        valid = parse.valid_events(parsed)
        events, known = _cached(spark, _for_jobs(valid, keep_extra), held, cfg.window)
        parse.quarantine(parsed).write.mode("overwrite").json(f"{out}/quarantine")
        parsed.unpersist()
    else:
        # Parquet: one read when every line is valid (the usual case): the lines are
        # counted on the way to the cached events, and the quarantine pass, a second
        # read of every column, runs only when there is something to set aside.
        valid = parse.valid_events(parsed.observe(observed, *metrics))
        events, known = _cached(spark, _for_jobs(valid, keep_extra), held, cfg.window)
        spark.sparkContext.setJobDescription("quarantine")
        if int(observed.get["invalid"]) > 0:
            parse.quarantine(reparse()).write.mode("overwrite").json(f"{out}/quarantine")
        elif local:
            output.write_json_lines(Path(f"{out}/quarantine"), [])
        else:
            empty = spark.createDataFrame([], S.QUARANTINE_SCHEMA)
            empty.coalesce(1).write.mode("overwrite").json(f"{out}/quarantine")
    lines, invalid = int(observed.get["lines"]), int(observed.get["invalid"])
    n_events = int(known["events"])
    if n_events == 0:
        raise no_events(lines, invalid, out)
    say(f"{lines} lines, {invalid} invalid, {n_events} events after de-duplication")
    if keep_extra:
        say("writing events")
        events.write.mode("overwrite").parquet(f"{out}/events")
    # Row counts and the per-user totals are observed while the tables are written:
    # no job of their own. The summary's figures other than the restore percentiles
    # were computed on the way to the events (_event_metrics).
    sizes: dict[str, Observation] = {}
    totals = Observation("totals")
    stats: dict[str, Any] = {key: known[key] for key in ("a", "b", "copies")}

    def write(name: str, table: DataFrame) -> None:
        # Named after its table in the Spark UI and event log (a local property of the
        # thread the job is started from).
        spark.sparkContext.setJobDescription(name)
        if name == "_stats":
            stats.update(_first(table).asDict())
            return
        say(f"writing {name}")
        df = table.observe(sizes[name], F.count(F.lit(1)).alias("rows"))
        if name == "per_user":
            df = df.observe(totals, *[F.sum(c).alias(c) for c in SUM_COLUMNS])
        df.write.mode("overwrite").parquet(f"{out}/{name}")
        if csv:
            if local:
                output.write_local_csv(Path(f"{out}/{name}"), Path(f"{out}/csv/{name}"))
            else:
                output.spark_csv(spark.read.parquet(f"{out}/{name}"), f"{out}/csv/{name}")

    # A few tables at a time: one job's driver-side planning, code generation and
    # single-task stages leave a core idle much of the time, which the next job's tasks
    # fill. Held frames are computed as they are held, so each table starts as soon as
    # what it reads is there (the six tables of the sparse events while the episodes
    # are computed). Cached ones are built by the first job that reads them: the
    # episodes and the per-user table go first, three others read their cache.
    with ThreadPoolExecutor(TABLE_THREADS, thread_name_prefix="table") as pool:
        pending: list[Future[None]] = []
        later: dict[str, DataFrame] = {}

        def ready(name: str, table: DataFrame) -> None:
            if name != "_stats":
                sizes[name] = Observation(f"rows_{name}")
            if held is None:
                later[name] = table
            else:
                pending.append(pool.submit(write, name, table))

        try:
            _, cached = _tables(
                events, cfg, held or _persist, last_ms=known["last_ms"], ready=ready
            )
            for name in sorted(later, key=CACHED_ORDER.index):
                pending.append(pool.submit(write, name, later[name]))
        finally:
            for done in pending:
                done.result()
    for df in (*cached, events):
        df.unpersist()
    if held is not None:
        held.release()
    return Counts(
        lines=lines,
        invalid=invalid,
        events=n_events,
        rows={name: int(o.get["rows"]) for name, o in sizes.items()},
        totals=dict(totals.get),
        stats=stats,
    )


# Read when an aggregate is planned: see _cached.
BYPASS_PARTIAL = "spark.sql.execution.bypassPartialAggregation"
ADAPTIVE = "spark.sql.adaptive.enabled"


class _Held:
    """What the table jobs of a moderate local log share, computed once and kept as rows
    (local checkpoints), not in Spark's columnar cache.

    The columnar cache (compressed column batches) cost more to build than anything it
    saved for a log of a million lines: its compressibility statistics alone were a
    seventh of the events job's task time, and the quick JIT of such a run (see
    spark.session) runs that code slowly. Rows in the block manager are copied once.
    At 10M lines rows would fill a 3 GB driver's old generation (the collector then
    took more CPU than the columnar cache's build), so large logs keep the cache.

    Each frame is computed when held, with adaptive execution off for its plan: the
    result then keeps the partitioning of its plan (by user), so the per-user windows
    and aggregates over it need no shuffle; an adaptive plan reports none.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._rdds: set[int] = set()

    def __call__(self, df: DataFrame, name: str, one_pass: bool = False) -> DataFrame:
        """``df`` computed now and held. With ``one_pass``, its aggregates run without
        Spark's pre-aggregation (see :func:`_cached`)."""
        spark = self._spark
        jsc = spark.sparkContext._jsc
        before = set(jsc.getPersistentRDDs().keySet())
        settings = {ADAPTIVE: "false", **({BYPASS_PARTIAL: "true"} if one_pass else {})}
        spark.sparkContext.setJobDescription(name)
        with _settings(spark, settings):
            rows = df.localCheckpoint(eager=True)
        self._rdds |= set(jsc.getPersistentRDDs().keySet()) - before
        return rows

    def release(self) -> None:
        """Drop every frame held (a session may run more jobs after this one)."""
        rdds = self._spark.sparkContext._jsc.getPersistentRDDs()
        for rdd_id in self._rdds:
            rdd = rdds.get(rdd_id)
            if rdd is not None:
                rdd.unpersist(False)
        self._rdds.clear()


def _cached(
    spark: SparkSession,
    events: DataFrame,
    held: _Held | None = None,
    window: jobs.TimeWindow | None = None,
) -> tuple[DataFrame, dict[str, Any]]:
    """``events`` (:func:`analytics.parse.valid_events`) cached, or ``held`` as rows, and
    what :func:`_event_metrics` knows of them for ``window``: their number first.

    Their de-duplication runs on rows already partitioned by user, so Spark's usual
    pre-aggregation before the exchange would be a second hash pass over every row after
    it (the exchange is the repartition's): the de-duplication is planned as one pass
    (the setting is read when the plan is made) and the setting restored for the tables,
    whose aggregates shuffle and want their pre-aggregation. The cache keeps the
    settings of the moment it is planned (Spark plans it in a copy of the session's
    settings), so the setting can be restored before the aggregate that builds the
    cache and computes the metrics (it was a count) runs.
    """
    metrics = _event_metrics(window or jobs.TimeWindow())
    if held is not None:
        counted = Observation("events")
        rows = held(events.observe(counted, *metrics), "events", True)
        return rows, dict(counted.get)
    with _settings(spark, {BYPASS_PARTIAL: "true"}):
        cached = events.persist(StorageLevel.MEMORY_AND_DISK)
    return cached, _first(cached.agg(*metrics)).asDict()


def _run_small(
    spark: SparkSession,
    parsed: DataFrame,
    out: str,
    cfg: jobs.JobConfig,
    csv: bool,
    say: Callable[[str], None],
) -> Counts:
    """A log of a few MB: every table in *one* Spark job, written here with pyarrow.

    Each table becomes rows of (table, JSON text) in one union that the driver collects:
    the JVM start and one job's scheduling are the whole cost, not a job per table.
    """
    parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
    events = parse.valid_events(parsed).persist(StorageLevel.MEMORY_AND_DISK)
    tables, cached = _tables(events, cfg)
    parts: dict[str, DataFrame] = {
        "_quarantine": parse.quarantine(parsed),
        "_lines": parsed.agg(F.count(F.lit(1)).alias("lines"), F.count("error").alias("invalid")),
        "_events": events.agg(F.count(F.lit(1)).alias("events")),
        "_stats": _stats(jobs.in_window(events, cfg.window)),
        **tables,
    }
    union: DataFrame | None = None
    for name, df in parts.items():
        tagged = df.select(
            F.lit(name).alias("t"),
            F.to_json(
                F.struct(*[F.col(c) for c in df.columns]), {"ignoreNullFields": "false"}
            ).alias("j"),
        )
        union = tagged if union is None else union.unionAll(tagged)
    assert union is not None
    say("computing every table in one job (small input)")
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in parts}
    for row in union.collect():
        rows[row["t"]].append(json.loads(row["j"]))
    for df in (*cached, events, parsed):
        df.unpersist()
    lines = int(rows["_lines"][0]["lines"])
    invalid = int(rows["_lines"][0]["invalid"])
    n_events = int(rows["_events"][0]["events"])
    output.write_json_lines(Path(f"{out}/quarantine"), rows["_quarantine"])
    if n_events == 0:
        raise no_events(lines, invalid, out)
    say(f"{lines} lines, {invalid} invalid, {n_events} events after de-duplication")
    for name, df in tables.items():
        schema = output.arrow_schema(df.schema)
        values = [
            {f.name: output.from_json(r.get(f.name), f.type) for f in schema} for r in rows[name]
        ]
        csv_dir = Path(f"{out}/csv/{name}") if csv else None
        output.write_rows(Path(f"{out}/{name}"), df.schema, values, csv_dir=csv_dir)
    users = rows["per_user"]
    totals = {c: sum(float(r[c] or 0) for r in users) for c in SUM_COLUMNS}
    return Counts(
        lines=lines,
        invalid=invalid,
        events=n_events,
        rows={name: len(rows[name]) for name in tables},
        totals=totals,
        stats=rows["_stats"][0],
    )


def _for_jobs(events: DataFrame, keep_extra: bool) -> DataFrame:
    """``events`` with only the columns the jobs read (all of them for ``keep_extra``, which
    writes the events): the cache of 10M events is then a third smaller, and cheaper to
    build."""
    return events if keep_extra else events.select(*jobs.JOB_COLUMNS)
