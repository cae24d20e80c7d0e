"""The three ways ``churn`` runs (one job for a small log; a job per table for a larger
one, with what the tables share held as rows up to a few million lines and in Spark's
columnar cache above) write the same tables from the same Parquet log, bad and
duplicate rows included."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from analytics import churn, jobs
from analytics.churn import TABLES, run_churn
from analytics.generate import GeneratorConfig, generate
from analytics.jobs import JobConfig

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


def _all_paths(spark: Any, log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    small = run_churn(spark, str(log), str(tmp_path / "small"), JobConfig(), fmt="parquet")
    monkeypatch.setattr(churn, "SMALL_INPUT_ROWS", 0)  # the large path, job per table
    large = run_churn(spark, str(log), str(tmp_path / "large"), JobConfig(), fmt="parquet")
    monkeypatch.setattr(churn, "QUICK_JIT_ROWS", 0)  # ... with the columnar cache
    cached = run_churn(spark, str(log), str(tmp_path / "cached"), JobConfig(), fmt="parquet")
    return small, large, cached


@pytest.mark.parametrize("bad", [True, False], ids=["bad-rows", "clean"])
def test_small_and_large_paths_write_the_same_tables(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: bool
) -> None:
    log = _log(tmp_path / "log", bad=bad)
    small, large, cached = _all_paths(spark, log, tmp_path, monkeypatch)
    assert _sorted_tables(tmp_path / "large") == _sorted_tables(tmp_path / "small")
    assert _sorted_tables(tmp_path / "cached") == _sorted_tables(tmp_path / "small")
    quarantined = _quarantine(tmp_path / "large")
    assert quarantined == _quarantine(tmp_path / "small")
    assert _quarantine(tmp_path / "cached") == quarantined
    if bad:
        assert [reason for _line, reason in quarantined] == [
            "missing event",
            "ts is not an RFC 3339 time",
        ]
        assert large.summary["invalid_lines"] == 2
        assert large.summary["duplicates_dropped"] == 1
    else:
        assert quarantined == []
        assert large.summary["invalid_lines"] == 0
    assert large.summary == small.summary
    assert cached.summary == small.summary
    assert large.summary["lines"] == large.summary["events"] + 3 * bad


def test_events_held_as_rows_keep_their_partitioning(spark: Any, tmp_path: Path) -> None:
    """The per-user jobs over the events held as rows need no shuffle of their own (the
    reason the events are partitioned by user), and releasing them drops their blocks."""
    inputs = churn.find_inputs(str(_log(tmp_path / "log", bad=False)), "parquet")
    held = churn._Held(spark)
    parsed = churn.read_parsed(spark, inputs, source=False)
    events, n = churn._cached(spark, churn._for_jobs(jobs.valid_events(parsed), False), held)
    ids = set(held._rdds)
    try:
        assert n == inputs.rows
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
    inputs = churn.find_inputs(str(_log(tmp_path / "log", bad=False)), "parquet")
    parsed = churn.read_parsed(spark, inputs, source=False)
    events, _n = churn._cached(spark, churn._for_jobs(jobs.valid_events(parsed), False))
    sparse = churn._persist(jobs.sparse(events), "sparse events")
    try:
        plan = jobs.flapping(sparse, JobConfig())._jdf.queryExecution().executedPlan().toString()
        shuffles = [r for r in plan.splitlines() if "hashpartitioning(uri" in r]
        assert all("REPARTITION_BY_COL" in r for r in shuffles), plan  # the events' own
    finally:
        sparse.unpersist()
        events.unpersist()
