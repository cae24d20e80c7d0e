"""Acceptance 4: wall time and events/s of the churn jobs on ``local[2]``.

Run by ``make bench`` (``-m bench``), not by ``make test``. Sizes come from
``MDECI_BENCH_EVENTS`` (comma-separated, default ``1000000``); the figures in
``docs/benchmarks.md`` were taken with ``MDECI_BENCH_EVENTS=1000000,10000000``.

For each size: generate a commuters' log, run ``mdeci analytics churn --master local[2]``
in a fresh process on the JSON lines and on the Parquet copy (wall time includes the JVM
start, as an admin sees it); then the per-user job alone, in Spark with a warm JVM and,
on the smallest size, in plain single-process pandas for reference. Results are printed
and appended to ``$MDECI_BENCH_OUT`` (JSON lines) when set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from analytics.generate import GeneratorConfig, generate

pytestmark = [pytest.mark.bench, pytest.mark.peer("spark"), pytest.mark.timeout(7200)]

ROOT = Path(__file__).resolve().parents[2]
SIZES = [int(x) for x in os.environ.get("MDECI_BENCH_EVENTS", "1000000").split(",") if x]
EVENTS_PER_USER_DAY = 241  # commute model, 4 notifications an hour (measured)
DAYS = 7


def _record(row: dict[str, Any]) -> None:
    print("BENCH " + json.dumps(row), flush=True)
    out = os.environ.get("MDECI_BENCH_OUT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def _churn(source: Path, out: Path, fmt: str) -> dict[str, Any]:
    started = time.perf_counter()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mdeci",
            "analytics",
            "churn",
            "--input",
            str(source),
            "--output",
            str(out),
            "--master",
            "local[2]",
            "--format",
            fmt,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    assert run.returncode == 0, run.stderr[-3000:]
    # "[  12.3s] parsing ..." marks when the JVM was up and the jobs began.
    marks = re.findall(r"\[\s*([\d.]+)s\] (.*)", run.stderr)
    jobs_began = next(float(t) for t, m in marks if m.startswith("parsing"))
    return {"wall_s": round(wall, 1), "jobs_s": round(wall - jobs_began, 1)}


def _pandas_per_user(parquet: Path) -> tuple[float, int]:
    """The per-user job in plain pandas (whole log, no window), for reference."""
    import pandas as pd
    import pyarrow.parquet as pq

    started = time.perf_counter()
    cols = ["ts", "event", "uri", "latency_ms", "cost"]
    df = pq.read_table(parquet, columns=cols).to_pandas().drop_duplicates()
    df["ts_ms"] = pd.to_datetime(df["ts"], format="ISO8601").astype("int64") // 1_000_000
    counts = df.groupby(["uri", "event"]).size().unstack(fill_value=0)
    restores = df[df["event"] == "media_connected"].groupby("uri")["latency_ms"]
    pct = restores.quantile([0.5, 0.95, 0.99]).unstack()
    sms = df[df["event"] == "sms_sent"].groupby("uri")["cost"].sum()
    media = df[df["event"].isin(["media_disconnected", "media_connected"])].copy()
    media["rank"] = (media["event"] == "media_connected").astype("int8")
    media = media.sort_values(["uri", "ts_ms", "rank"])
    prev = media.groupby("uri")["event"].shift()
    edge = ((media["event"] == "media_disconnected") & (prev != "media_disconnected")) | (
        (media["event"] == "media_connected") & (prev == "media_disconnected")
    )
    edges = media[edge].copy()
    edges["next_event"] = edges.groupby("uri")["event"].shift(-1)
    edges["next_ts"] = edges.groupby("uri")["ts_ms"].shift(-1)
    starts = edges[edges["event"] == "media_disconnected"].copy()
    horizon = df["ts_ms"].max()
    starts["end"] = starts["next_ts"].where(starts["next_event"] == "media_connected", horizon)
    starts["duration"] = starts["end"] - starts["ts_ms"]
    eps = starts.groupby("uri")["duration"].agg(["count", "sum", "max"])
    table = counts.join(pct, how="outer").join(sms, how="outer").join(eps, how="outer")
    return time.perf_counter() - started, len(table)


def _spark_per_user(spark: Any, parquet: Path) -> float:
    """The per-user job alone in Spark (warm JVM, whole log), to set beside pandas."""
    from analytics import jobs
    from analytics.churn import find_inputs, read_parsed

    started = time.perf_counter()
    events = jobs.valid_events(read_parsed(spark, find_inputs(str(parquet), "parquet")))
    window = jobs.TimeWindow()
    table = jobs.per_user(jobs.in_window(events, window), jobs.episodes(events, window))
    table.write.mode("overwrite").format("noop").save()
    return time.perf_counter() - started


@pytest.mark.parametrize("events", SIZES)
def test_churn_throughput(events: int, tmp_path: Path, spark: Any) -> None:
    users = max(1, round(events / (EVENTS_PER_USER_DAY * DAYS)))
    cfg = GeneratorConfig(users=users, days=DAYS, seed=42, model="commute")
    started = time.perf_counter()
    result = generate(cfg, tmp_path / "log")
    gen_s = time.perf_counter() - started
    _record(
        {
            "what": "generate (JSON lines + Parquet)",
            "events": result.events,
            "wall_s": round(gen_s, 1),
            "events_per_s": round(result.events / gen_s),
        }
    )
    for fmt in ("jsonl", "parquet"):
        t = _churn(tmp_path / "log" / fmt, tmp_path / f"out-{fmt}", fmt)
        _record(
            {
                "what": f"spark churn, {fmt} input, local[2]",
                "events": result.events,
                **t,
                "events_per_s": round(result.events / t["wall_s"]),
            }
        )
    took = _spark_per_user(spark, tmp_path / "log" / "parquet")
    _record(
        {
            "what": "spark per-user job only, Parquet input, local[2], warm JVM",
            "events": result.events,
            "wall_s": round(took, 1),
            "events_per_s": round(result.events / took),
        }
    )
    if events == min(SIZES):
        took, rows = _pandas_per_user(tmp_path / "log" / "parquet")
        assert rows == users
        _record(
            {
                "what": "pandas per-user job, Parquet input, 1 process",
                "events": result.events,
                "wall_s": round(took, 1),
                "events_per_s": round(result.events / took),
            }
        )
