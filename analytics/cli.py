"""``mdeci analytics generate|churn|report``: the network admin's commands.

``mdeci/cli.py`` dispatches here through :func:`add_arguments` and :func:`run`. Errors
the user can fix are :class:`~analytics.errors.AnalyticsError`; they become one line on
stderr and exit code 2 here, because the top-level CLI only knows mdeci's own errors.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from analytics.errors import AnalyticsError, JobError, OptionError

if TYPE_CHECKING:
    from analytics.churn import ChurnResult
    from analytics.inputs import Inputs
    from analytics.jobs import JobConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``generate``, ``churn`` and ``report`` subcommands on ``parser``."""
    sub = parser.add_subparsers(dest="analytics_command", metavar="STEP", required=True)

    gen = sub.add_parser(
        "generate",
        help="write a synthetic churn log (JSON lines and Parquet)",
        description="Write a synthetic churn log: users moving between subnets under a "
        "mobility model, deterministic for a seed.",
    )
    gen.add_argument("--users", type=int, required=True, help="number of users")
    gen.add_argument("--days", type=int, required=True, help="length of the log in days")
    from analytics.generate import ALIASES, MODELS

    gen.add_argument(
        "--model",
        choices=(*MODELS, *ALIASES),
        default="walkabout-commute",
        help="mobility model, named after its paper (docs/analytics.md)",
    )
    gen.add_argument("--seed", type=int, default=1, help="random seed (same seed, same log)")
    gen.add_argument("--out", type=Path, required=True, help="output directory")
    gen.add_argument(
        "--format",
        choices=("both", "jsonl", "parquet"),
        default="both",
        help="what to write (default: both)",
    )
    gen.add_argument(
        "--notify-rate", type=float, default=4.0, help="notifications per user per hour"
    )
    gen.add_argument(
        "--mobility-ratio",
        type=float,
        default=None,
        help="JECho's mobility-to-communication ratio: moves per notification "
        "(sets the notification rate from the model's move rate)",
    )
    gen.add_argument(
        "--dwell-mean", type=float, default=90.0, help="JECho models: mean stay, minutes"
    )
    gen.add_argument(
        "--remote-share", type=float, default=0.2, help="JECho pop-up: share of remote jumps"
    )
    gen.add_argument(
        "--favourite-share",
        type=float,
        default=0.8,
        help="JECho fixed: share of time at the two favourite locations",
    )
    gen.add_argument(
        "--start", default="2024-03-04", help="first day of the log, UTC (default 2024-03-04)"
    )
    gen.add_argument("--quiet", action="store_true", help="no progress bar")

    churn = sub.add_parser(
        "churn",
        help="run the churn jobs over a log",
        description="Run the churn jobs over churn logs (with Spark, or in this process for a "
        "small local log) and write Parquet and CSV tables; invalid lines are counted and set "
        "aside in <output>/quarantine.",
    )
    churn.add_argument("--input", required=True, help="log file or directory (or a URL)")
    churn.add_argument("--output", required=True, help="output directory (or a URL)")
    churn.add_argument(
        "--master",
        default=None,
        help="Spark master URL: local[2], spark://host:7077, yarn, k8s://... "
        "(default: the one spark-submit set, else local[*])",
    )
    churn.add_argument("--since", default=None, help="window start, RFC 3339 (inclusive)")
    churn.add_argument("--until", default=None, help="window end, RFC 3339 (exclusive)")
    churn.add_argument(
        "--format", choices=("auto", "jsonl", "parquet"), default="auto", help="input format"
    )
    churn.add_argument("--no-csv", action="store_true", help="write Parquet tables only")
    churn.add_argument(
        "--keep-extra",
        action="store_true",
        help="also write the events, unknown fields kept, to <output>/events (slower)",
    )
    churn.add_argument(
        "--engine",
        choices=("auto", "spark", "local"),
        default="auto",
        help="spark, or local: in this process without Spark, for a small local log of JSON "
        "lines (default auto: local when the master is local and the input small)",
    )
    churn.add_argument(
        "--shuffle-partitions", type=int, default=None, help="Spark shuffle partitions"
    )
    churn.add_argument("--flap-window", type=float, default=300.0, help="flapping window, seconds")
    churn.add_argument("--flap-changes", type=int, default=5, help="address changes that flap")
    churn.add_argument("--storm-window", type=float, default=60.0, help="storm bucket, seconds")
    churn.add_argument("--storm-users", type=int, default=8, help="users restoring that storm")
    churn.add_argument(
        "--ip-cost-per-mb",
        type=float,
        default=0.0,
        help="price of a MB delivered by IP, for the per-device money (default 0: flat rate)",
    )
    churn.add_argument(
        "--storm-factor", type=float, default=4.0, help="times the hourly baseline that storm"
    )
    churn.add_argument(
        "--min-tail",
        type=float,
        default=10.0,
        help="observations above a percentile that a recommendation needs (0: any sample)",
    )
    churn.add_argument(
        "--quiet", action="store_true", help="print only the result line (no progress, no bars)"
    )
    churn.add_argument("--verbose", action="store_true", help="Spark's own WARN and INFO lines too")

    watch = sub.add_parser(
        "watch",
        help="live churn per minute over the churn-log folder (Structured Streaming)",
        description="Read the churn-log folder as a stream of files and write, per minute of "
        "event time, handovers, disconnections, restore latency and reconnect-storm alerts "
        "to <output>/minutes and <output>/alerts (Parquet) and to the console.",
    )
    watch.add_argument("--input", required=True, help="the churn-log folder (or a URL)")
    watch.add_argument("--output", required=True, help="output folder (or a URL)")
    watch.add_argument("--master", default=None, help="Spark master URL (as for churn)")
    watch.add_argument(
        "--watermark", default="2 minutes", help="how late a line may come (default 2 minutes)"
    )
    watch.add_argument(
        "--storm-users", type=int, default=8, help="users reconnecting in a minute: a storm"
    )
    watch.add_argument("--trigger", type=float, default=5.0, help="seconds between batches")
    watch.add_argument("--checkpoint", default=None, help="default <output>/_checkpoint")
    watch.add_argument(
        "--available-now",
        action="store_true",
        help="process the files there now, then stop (a rerun carries on)",
    )
    watch.add_argument(
        "--for", dest="run_for", type=float, default=None, help="stop after this many seconds"
    )
    watch.add_argument("--quiet", action="store_true", help="no progress bars")
    watch.add_argument("--verbose", action="store_true", help="Spark's own WARN lines too")

    rep = sub.add_parser(
        "report",
        help="render the churn tables as one HTML page",
        description="Render the tables written by 'churn' as one self-contained HTML page.",
    )
    rep.add_argument("--input", type=Path, required=True, help="the output directory of churn")
    rep.add_argument("--output", type=Path, required=True, help="the HTML file to write")
    rep.add_argument("--title", default="mdeci session churn", help="page title")


def parse_time(text: str, option: str) -> int:
    """Epoch milliseconds of an RFC 3339 time or a date (UTC when no offset is given).

    Raises:
        OptionError: if ``text`` is not a time.
    """
    try:
        t = datetime.fromisoformat(text.strip().replace(" ", "T"))
    except ValueError:
        raise OptionError(f"{option} {text!r} is not an RFC 3339 time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1000)


def run(args: argparse.Namespace) -> int:
    """Run the chosen step; 0 on success, 2 with one line on stderr on a user error."""
    try:
        if args.analytics_command == "generate":
            return _generate(args)
        if args.analytics_command == "churn":
            return _churn(args)
        if args.analytics_command == "watch":
            return _watch(args)
        return _report(args)
    except AnalyticsError as exc:
        print(f"mdeci analytics {args.analytics_command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mdeci analytics {args.analytics_command}: error: {exc}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from analytics.generate import GeneratorConfig, generate
    from analytics.mobility import MobilityParams

    start_ms = parse_time(args.start, "--start")
    cfg = GeneratorConfig(
        users=args.users,
        days=args.days,
        seed=args.seed,
        model=args.model,
        notify_per_hour=args.notify_rate,
        mobility_ratio=args.mobility_ratio,
        mobility=MobilityParams(
            dwell_mean_min=args.dwell_mean,
            remote_share=args.remote_share,
            favourite_share=args.favourite_share,
        ),
        start=datetime.fromtimestamp(start_ms / 1000, UTC),
    )
    begun = time.perf_counter()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=args.quiet,
        transient=False,
    ) as bar:
        task = bar.add_task(f"{cfg.model} users", total=cfg.users)
        result = generate(
            cfg,
            args.out,
            jsonl=args.format in ("both", "jsonl"),
            parquet=args.format in ("both", "parquet"),
            progress=lambda n: bar.advance(task, n),
        )
    took = time.perf_counter() - begun
    print(
        f"{result.events} events ({result.lines} lines) for {cfg.users} users over "
        f"{cfg.days} days in {took:.1f} s ({result.events / max(took, 1e-9):,.0f} events/s) "
        f"-> {args.out}",
        file=sys.stderr,
    )
    return 0


def _churn(args: argparse.Namespace) -> int:
    from analytics.inputs import find_inputs
    from analytics.jobs import JobConfig, TimeWindow
    from analytics.local.run import choose_engine, run_local

    since = parse_time(args.since, "--since") if args.since else None
    until = parse_time(args.until, "--until") if args.until else None
    if since is not None and until is not None and until <= since:
        raise OptionError("--until must be after --since")
    if not args.min_tail >= 0:  # NaN too
        raise OptionError("--min-tail must be 0 or more")
    cfg = JobConfig(
        window=TimeWindow(since_ms=since, until_ms=until),
        flap_window_ms=int(args.flap_window * 1000),
        flap_min_changes=args.flap_changes,
        storm_window_ms=int(args.storm_window * 1000),
        storm_min_users=args.storm_users,
        storm_factor=args.storm_factor,
        ip_cost_per_mb=args.ip_cost_per_mb,
        min_tail_observations=args.min_tail,
    )
    inputs = find_inputs(args.input, args.format)  # fail fast, before the JVM starts
    engine = choose_engine(
        args.engine, args.master, inputs, args.output, keep_extra=args.keep_extra
    )
    begun = time.perf_counter()

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - begun:6.1f}s] {message}", file=sys.stderr)

    if inputs.skipped:
        say(skipping_line(inputs.skipped, args.input))

    if engine == "local":
        result = run_local(inputs, args.output, cfg, csv=not args.no_csv, step=say)
    else:
        result = _churn_spark(args, inputs, cfg, say)
    s = result.summary
    took = time.perf_counter() - begun
    print(
        f"{int(s['events'])} events ({int(s['invalid_lines'])} invalid lines quarantined, "
        f"{int(s['duplicates_dropped'])} duplicates dropped), {int(s['users'])} users, "
        f"{int(s['disconnections'])} disconnections, {int(s['storms'])} storms in {took:.1f} s "
        f"-> {result.output}",
        file=sys.stderr,
    )
    return 0


def _churn_spark(
    args: argparse.Namespace, inputs: Inputs, cfg: JobConfig, say: Callable[[str], None]
) -> ChurnResult:
    from analytics.churn import run_churn
    from analytics.spark import finish, session

    spark = session(
        args.master,
        shuffle_partitions=args.shuffle_partitions,
        verbose=args.verbose,
        progress=not args.quiet,
        small_input=inputs.small,
        class_cache=True,
        quick_jit=inputs.moderate,
    )
    say(f"Spark {spark.version} on {spark.sparkContext.master}")
    try:
        result = run_churn(
            spark,
            args.input,
            args.output,
            cfg,
            fmt=args.format,
            csv=not args.no_csv,
            keep_extra=args.keep_extra,
            step=say,
        )
    finally:
        finish(spark)
    return result


def _watch(args: argparse.Namespace) -> int:
    from analytics.spark import session
    from analytics.watch import WatchConfig, start

    if args.storm_users < 1 or args.trigger <= 0:
        raise OptionError("--storm-users must be at least 1 and --trigger positive")
    cfg = WatchConfig(
        watermark=args.watermark,
        storm_users=args.storm_users,
        trigger_s=args.trigger,
        checkpoint=args.checkpoint,
    )
    if "://" not in args.input and not Path(args.input).is_dir():  # before the JVM starts
        raise OptionError(f"--input {args.input} is not a directory (watch reads a log folder)")
    spark = session(args.master, verbose=args.verbose, progress=not args.quiet)
    try:
        query = start(spark, args.input, args.output, cfg, available_now=args.available_now)
    except Exception as exc:
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            raise JobError(
                f"cannot start the live query: {str(exc).strip().splitlines()[0]}"
            ) from exc
        raise
    print(
        f"watching {args.input} on {spark.sparkContext.master} -> {args.output}/minutes",
        file=sys.stderr,
    )
    # SIGINT and SIGTERM end the watch cleanly: the query stops between batches and its
    # checkpoint is consistent for the next start.
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    deadline = None if args.run_for is None else time.monotonic() + args.run_for
    try:
        while query.isActive and not stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            query.awaitTermination(1)
    finally:
        query.stop()
    if query.exception() is not None:
        raise JobError(f"the live query failed: {str(query.exception()).splitlines()[0]}")
    return 0


def skipping_line(skipped: list[str], root: str, shown: int = 5) -> str:
    """``skipping N file(s) ...: a, b, c and M more``: names relative to ``root`` (two
    ``README`` in two folders are two names), each once, and the count of the rest."""
    base = Path(root.removeprefix("file://"))
    names: list[str] = []
    for f in skipped:
        try:
            name = str(Path(f).resolve().relative_to(base.resolve()))
        except ValueError:
            name = str(f)
        if name not in names:
            names.append(name)
    listed = ", ".join(names[:shown])
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"skipping {len(names)} file(s) that are not churn logs: {listed}{more}"


def _report(args: argparse.Namespace) -> int:
    from analytics.report import write_report

    write_report(args.input, args.output, title=args.title)
    print(f"report -> {args.output}", file=sys.stderr)
    return 0
