"""The three ways ``churn`` runs (one job for a small log; a job per table for a larger
one, with what the tables share held as rows up to a few million lines and in Spark's
columnar cache above) write the same tables from the same Parquet log, bad and
duplicate rows included."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from analytics import churn, jobs, parse
from analytics import inputs as inputs_mod
from analytics.churn import TABLES, run_churn
from analytics.generate import GeneratorConfig, generate
from analytics.jobs import JobConfig, TimeWindow

pytestmark = pytest.mark.timeout(900)


def _sorted_tables(out: Path) -> dict[str, list[list[str]]]:
    tables = {}
    for name in TABLES:
        with (out / "csv" / name / "part-00000.csv").open(encoding="utf-8") as f:
            header, *rows = list(csv.reader(f))
        tables[name] = [header, *sorted(rows)]
    return tables


def _quarantine(out: Path) -> list[tuple[str, str]]:
    rows = [
        json.loads(raw)
        for part in sorted((out / "quarantine").glob("*.json"))
        for raw in part.read_text(encoding="utf-8").splitlines()
    ]
    return sorted((r["line"], r["reason"]) for r in rows)


def _log(folder: Path, *, bad: bool) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    generate(GeneratorConfig(users=6, days=1, seed=7, model="commute"), folder, jsonl=False)
    parquet = folder / "parquet"
    if bad:
        first = sorted(parquet.glob("*.parquet"))[0]
        table = pq.read_table(first)
        rows = table.slice(0, 3).to_pylist()
        rows[0]["ts"] = "yesterday"
        rows[1]["event"] = None
        # rows[2] stays as it is: an exact duplicate of a valid line, dropped once.
        extra = pa.Table.from_pylist(rows, schema=table.schema)
        pq.write_table(extra, parquet / "extra.parquet")
    return parquet


def _all_paths(
    spark: Any,
    log: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: JobConfig | None = None,
) -> Any:
    config = config or JobConfig()
    small = run_churn(spark, str(log), str(tmp_path / "small"), config, fmt="parquet")
    monkeypatch.setattr(inputs_mod, "SMALL_INPUT_ROWS", 0)  # the large path, job per table
    large = run_churn(spark, str(log), str(tmp_path / "large"), config, fmt="parquet")
    monkeypatch.setattr(inputs_mod, "QUICK_JIT_ROWS", 0)  # ... with the columnar cache
    cached = run_churn(spark, str(log), str(tmp_path / "cached"), config, fmt="parquet")
    return small, large, cached


def test_the_three_paths_agree_within_a_window(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary's first and last fact, its other-role copies and its restore
    percentiles are found by the events job and the sparse events on the large paths,
    by one aggregate on the small one: the same tables and summary in a window that cuts
    the log's day in the middle (episodes clipped at both ends). The log is clean: no
    path quarantines a valid line."""
    import pyarrow.parquet as pq

    log = _log(tmp_path / "log", bad=False)
    stamps = sorted(
        datetime.fromisoformat(ts)
        for ts in pq.read_table(log).column("ts").to_pylist()
        if ts and ts[0].isdigit()
    )
    first, last = stamps[0].timestamp() * 1000, stamps[-1].timestamp() * 1000
    window = TimeWindow(
        since_ms=int(first + (last - first) / 4), until_ms=int(first + 3 * (last - first) / 4)
    )
    small, large, cached = _all_paths(spark, log, tmp_path, monkeypatch, JobConfig(window=window))
    assert 0 < small.summary["events_in_window"] < small.summary["events"] == len(stamps)
    assert large.summary == small.summary
    assert cached.summary == small.summary
    assert _sorted_tables(tmp_path / "large") == _sorted_tables(tmp_path / "small")
    assert _sorted_tables(tmp_path / "cached") == _sorted_tables(tmp_path / "small")
    for path in ("small", "large", "cached"):
        assert _quarantine(tmp_path / path) == [], path
    assert large.summary["invalid_lines"] == large.summary["duplicates_dropped"] == 0


def test_small_and_large_paths_write_the_same_tables(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path / "log", bad=True)
    small, large, cached = _all_paths(spark, log, tmp_path, monkeypatch)
    assert _sorted_tables(tmp_path / "large") == _sorted_tables(tmp_path / "small")
    assert _sorted_tables(tmp_path / "cached") == _sorted_tables(tmp_path / "small")
    quarantined = _quarantine(tmp_path / "large")
    assert quarantined == _quarantine(tmp_path / "small")
    assert _quarantine(tmp_path / "cached") == quarantined
    assert [reason for _line, reason in quarantined] == [
        "missing event",
        "ts is not an RFC 3339 time",
    ]
    assert large.summary["invalid_lines"] == 2
    assert large.summary["duplicates_dropped"] == 1
    assert large.summary == small.summary
    assert cached.summary == small.summary
    assert spark.conf.get(churn.ADAPTIVE) == "true"  # held rows turned it off for their run
    assert large.summary["lines"] == large.summary["events"] + 3  # 2 invalid, 1 duplicate


def test_events_held_as_rows_keep_their_partitioning(spark: Any, tmp_path: Path) -> None:
    """The per-user jobs over the events held as rows need no shuffle of their own (the
    reason the events are partitioned by user), and releasing them drops their blocks."""
    inputs = inputs_mod.find_inputs(str(_log(tmp_path / "log", bad=False)), "parquet")
    held = churn._Held(spark)
    parsed = inputs_mod.read_parsed(spark, inputs, source=False)
    events, known = churn._cached(spark, churn._for_jobs(parse.valid_events(parsed), False), held)
    ids = set(held._rdds)
    try:
        assert known["events"] == inputs.rows
        plan = events.groupBy("uri").count()._jdf.queryExecution().executedPlan().toString()
        assert "Exchange" not in plan, plan
        assert ids
    finally:
        held.release()
    assert not ids & set(spark.sparkContext._jsc.getPersistentRDDs().keySet())


def test_frames_cached_for_several_tables_keep_their_partitioning(
    spark: Any, tmp_path: Path
) -> None:
    """A frame derived from the cached events and cached in turn (the sparse events, the
    episode starts) still says it is partitioned by user, so the per-user windows over it
    need no shuffle: planned adaptively, the cache reported no partitioning at all."""
    inputs = inputs_mod.find_inputs(str(_log(tmp_path / "log", bad=False)), "parquet")
    parsed = inputs_mod.read_parsed(spark, inputs, source=False)
    events, _known = churn._cached(spark, churn._for_jobs(parse.valid_events(parsed), False))
    sparse = churn._persist(jobs.sparse(events), "sparse events")
    try:
        plan = jobs.flapping(sparse, JobConfig())._jdf.queryExecution().executedPlan().toString()
        shuffles = [r for r in plan.splitlines() if "hashpartitioning(uri" in r]
        assert all("REPARTITION_BY_COL" in r for r in shuffles), plan  # the events' own
    finally:
        sparse.unpersist()
        events.unpersist()


def _known(events: Any, window: jobs.TimeWindow) -> dict[str, Any]:
    """What churn._event_metrics should find, computed here without it."""
    now = jobs.in_window(events, window)
    facts = [r["ts_ms"] for r in jobs.facts(now).select("ts_ms").collect()]
    return {
        "events": events.count(),
        "last_ms": events.agg(F.max("ts_ms")).first()[0],
        "a": min(facts),
        "b": max(facts),
        "copies": now.count() - len(facts),
    }


@pytest.mark.parametrize("rows", [True, False], ids=["held-rows", "columnar-cache"])
def test_the_events_job_also_finds_what_the_summary_and_episodes_need(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: bool
) -> None:
    """The number of events, the last instant of the log (the end of an open episode)
    and the summary's first and last fact and other-role copies in the window come from
    the job that holds or caches the events, not from scans of their own; the cache's
    de-duplication stays one hash pass although its setting is restored before the
    aggregate that builds the cache runs."""
    inputs = inputs_mod.find_inputs(str(_log(tmp_path / "log", bad=True)), "parquet")
    window = jobs.TimeWindow(since_ms=1_709_510_400_000 + 3_600_000)  # an hour in
    held = churn._Held(spark) if rows else None
    ran: list[Any] = []
    first = churn._first

    def spy(df: Any) -> Any:
        ran.append(df)
        return first(df)

    monkeypatch.setattr(churn, "_first", spy)
    parsed = inputs_mod.read_parsed(spark, inputs, source=False)
    valid = churn._for_jobs(parse.valid_events(parsed), False)
    events, known = churn._cached(spark, valid, held, window)
    try:
        assert known == _known(events, window)
        assert known["copies"] > 0 and known["a"] >= window.since_ms
        if not rows:
            assert len(ran) == 1  # one job: the cache's build and the metrics
            # The cache's plan as it ran (an adaptive plan also prints its initial one).
            cache = events._jdf.queryExecution().executedPlan().toString()
            assert cache.split("== Initial Plan ==")[0].count("HashAggregate") == 1, cache
        assert spark.conf.get(churn.BYPASS_PARTIAL, "false") != "true"
    finally:
        if held is not None:
            held.release()
        events.unpersist()


def test_tables_start_as_soon_as_what_they_read_is_held(spark: Any, tmp_path: Path) -> None:
    """With held frames computed as they are held, the six tables of the sparse events
    and the summary's percentiles are handed to the writers before the episode starts
    are held, the networks before the episodes, and no table before what it reads."""
    inputs = inputs_mod.find_inputs(str(_log(tmp_path / "log", bad=False)), "parquet")
    events = churn._for_jobs(parse.valid_events(inputs_mod.read_parsed(spark, inputs)), False)
    log: list[tuple[str, str]] = []

    def hold(df: Any, name: str) -> Any:
        log.append(("hold", name))
        return df

    def ready(name: str, _df: Any) -> None:
        log.append(("ready", name))

    tables, _cached = churn._tables(events, JobConfig(), hold, ready=ready)
    at = {entry: n for n, entry in enumerate(log)}
    assert {name for kind, name in log if kind == "ready"} == {*tables, "_stats"}
    assert set(tables) == set(TABLES) - {"summary"}
    sparse_only = ["_stats", "transitions", "restore_latency", "flapping", "storms"]
    sparse_only += ["handover_matrix", "sms_spend"]
    for name in sparse_only:
        assert at[("hold", "sparse events")] < at[("ready", name)] < at[("hold", "episode starts")]
    assert at[("ready", "networks")] < at[("hold", "episodes")]
    for name in ("episodes", "per_hour", "recommendations"):
        assert at[("hold", "episodes")] < at[("ready", name)] < at[("hold", "per_user")]
    assert at[("hold", "per_user")] < at[("ready", "per_user")]
