"""``mdeci analytics churn`` on the local engine, and the choice between the two engines.

The run reads the JSON lines once (:mod:`analytics.local.parse`), computes every table
(:mod:`analytics.local.tables`, :mod:`analytics.local.figures`) and writes them, the
quarantine, the summary and the provenance record with :mod:`analytics.output`'s
writers, as the Spark path writes a small input: one Parquet file and one CSV file per
table, the same names, columns and types, so ``report`` reads either.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import types as T

from analytics import jobs, output
from analytics import schema as S
from analytics.churn import SUM_COLUMNS, TABLES, ChurnResult, Counts, no_events, summarise
from analytics.errors import OptionError
from analytics.inputs import Inputs, is_remote
from analytics.local import figures, tables
from analytics.local.common import Row, in_window
from analytics.local.parse import Event, read_log, readable

ENGINES = ("auto", "spark", "local")

SCHEMAS: dict[str, T.StructType] = {
    "per_user": S.PER_USER_SCHEMA,
    "per_hour": S.PER_HOUR_SCHEMA,
    "episodes": S.EPISODE_SCHEMA,
    "transitions": S.TRANSITION_SCHEMA,
    "restore_latency": S.LATENCY_SCHEMA,
    "flapping": S.FLAPPING_SCHEMA,
    "storms": S.STORM_SCHEMA,
    "recommendations": S.RECOMMENDATION_SCHEMA,
    "handover_matrix": S.HANDOVER_MATRIX_SCHEMA,
    "networks": S.NETWORK_SCHEMA,
    "sms_spend": S.SMS_SPEND_SCHEMA,
    "per_move": S.PER_MOVE_SCHEMA,
    "per_device": S.PER_DEVICE_SCHEMA,
    "latency_by_network": S.LATENCY_BY_NETWORK_SCHEMA,
    "per_broker": S.PER_BROKER_SCHEMA,
    "saved": S.SAVED_SCHEMA,
}
_SPARSE = frozenset(jobs.SPARSE_EVENTS)


def _why_not_local(inputs: Inputs, output_path: str, keep_extra: bool) -> str | None:
    """Why the local engine cannot run this, or None."""
    if inputs.fmt != "jsonl":
        return "it reads JSON lines, not Parquet"
    if inputs.size is None:
        return "it reads local files, not a URL"
    if is_remote(output_path):
        return "it writes local folders, not a URL"
    if keep_extra:
        return "--keep-extra writes the events with Spark"
    if not readable(inputs.paths):
        return "a file is compressed with a codec only Spark reads"
    return None


def choose_engine(
    requested: str, master: str | None, inputs: Inputs, output_path: str, *, keep_extra: bool
) -> str:
    """``spark`` or ``local`` for ``--engine requested``.

    ``auto`` is local when the master is a local one (or none is given and no
    ``spark-submit`` set one), the input is small (``Inputs.small``) and the local engine
    can read and write it; Spark otherwise.

    Raises:
        OptionError: for an unknown engine, or ``local`` where it cannot run.
    """
    if requested not in ENGINES:
        raise OptionError(f"--engine must be one of {', '.join(ENGINES)}, not {requested!r}")
    why = _why_not_local(inputs, output_path, keep_extra)
    if requested == "local":
        if why is not None:
            raise OptionError(f"--engine local cannot run this: {why}")
        return "local"
    if requested == "spark":
        return "spark"
    # spark-submit starts the Python driver with a gateway to its JVM and sets the master.
    submitted = master is None and "PYSPARK_GATEWAY_PORT" in os.environ
    local_master = master is None or master.startswith("local")
    if why is None and local_master and not submitted and inputs.small:
        return "local"
    return "spark"


def compute(
    events: list[Event], cfg: jobs.JobConfig
) -> tuple[dict[str, list[Row]], dict[str, Any]]:
    """Every table of ``events`` (the de-duplicated events of the whole log), and the
    summary's figures of :func:`analytics.local.figures.stats`."""
    window = cfg.window
    current = in_window(events, window)
    sparse = [e for e in events if e["event"] in _SPARSE]
    sparse_now = in_window(sparse, window)
    starts = tables.episode_starts(sparse)
    eps = tables.episodes(starts, window, max(e["ts_ms"] for e in events))
    out = {
        "per_user": tables.per_user(current, eps),
        "per_hour": tables.per_hour(current, eps, window),
        "episodes": eps,
        "transitions": tables.transitions(sparse_now),
        "restore_latency": tables.restore_latency(sparse_now, cfg),
        "flapping": tables.flapping(sparse_now, cfg),
        "storms": tables.storms(sparse_now, cfg),
        "recommendations": figures.recommendations(current, eps, cfg),
        "handover_matrix": tables.handover_matrix(sparse_now),
        "networks": tables.networks(sparse, window, starts),
        "sms_spend": tables.sms_spend(sparse_now),
        "per_move": figures.per_move(sparse_now),
        "per_device": figures.per_device(current, cfg),
        "latency_by_network": figures.latency_by_network(current),
        "per_broker": figures.per_broker(sparse_now),
        "saved": figures.saved(current),
    }
    assert list(out) == [name for name in TABLES if name != "summary"]
    return out, figures.stats(current)


def run_local(
    inputs: Inputs,
    output_path: str,
    cfg: jobs.JobConfig,
    *,
    csv: bool = True,
    step: Callable[[str], None] | None = None,
) -> ChurnResult:
    """Every table of ``inputs`` under ``output_path``, as ``run_churn`` writes them.

    Raises:
        OptionError: if the local engine cannot read or write these (see
            :func:`choose_engine`).
        InputError: if no line is valid.
    """
    say = step or (lambda _msg: None)
    out = output_path.rstrip("/").removeprefix("file://")
    why = _why_not_local(inputs, out, False)
    if why is not None:
        raise OptionError(f"the local engine cannot run this: {why}")
    say(f"parsing {len(inputs.paths)} jsonl input(s) in this process (local engine)")
    log = read_log(inputs.paths)
    output.write_json_lines(Path(f"{out}/quarantine"), log.quarantine)
    if not log.events:
        raise no_events(log.lines, log.invalid, out)
    say(f"{log.lines} lines, {log.invalid} invalid, {len(log.events)} events after de-duplication")
    computed, stats = compute(log.events, cfg)
    for name, rows in computed.items():
        csv_dir = Path(f"{out}/csv/{name}") if csv else None
        output.write_rows(Path(f"{out}/{name}"), SCHEMAS[name], rows, csv_dir=csv_dir)
    say(f"wrote {len(computed)} tables")
    users = computed["per_user"]
    counts = Counts(
        lines=log.lines,
        invalid=log.invalid,
        events=len(log.events),
        rows={name: len(rows) for name, rows in computed.items()},
        totals={c: sum(float(r[c] or 0) for r in users) for c in SUM_COLUMNS},
        stats=stats,
    )
    summary = summarise(counts, cfg.window)
    output.write_summary(None, summary, out, csv=csv, local=True)
    output.write_provenance(None, inputs, out, local=True)
    return ChurnResult(summary=summary, output=out)
