"""Wall time of the churn jobs on ``local[2]``, Parquet in, and of a first run.

Run by ``make bench`` (``-m bench``), not by ``make test``. Sizes come from
``MDECI_BENCH_EVENTS`` (comma-separated, default ``1000,1000000``); the figures in
``docs/benchmarks.md`` were taken with ``MDECI_BENCH_EVENTS=1000,1000000,10000000``.

For each size: generate a commuters' log (broker and agent lines, as a deployment
writes them), run ``mdeci analytics churn --master local[2] --quiet`` in a fresh process
on the Parquet copy, every table written, Parquet and CSV (wall time includes the JVM
start, as an admin sees it). On the largest size, the per-user job alone, in Spark (a
fresh driver; the time from its first job to the table, JVM start excluded) and in
single-process pandas, in the same run, and the ratio. The budgets (1,000 lines 10 s,
1 M 20 s, 10 M 60 s; Spark per-user within 3x of pandas) are printed beside each
figure, not asserted: the machine is shared, and a benchmark measures.
The churn runs use the driver's class archive (``analytics.spark.class_archive``) as an
admin's second and later runs do; the first run of the session writes it if it is
missing, and that run is recorded on its own.
Each churn row also gives the CPU seconds of its driver JVM (``jvm_cpu_s``, from /proc)
and the load average at its end: the machine is shared, and CPU seconds vary less with
the load than wall time.
An admin's first run is measured apart: ``mdeci demo --quick``'s JSON logs churned in a
fresh process without the class archive, with the default engine (``auto``: the local
engine for so small a log; budget 10 s), and with ``--engine spark`` beside it.
Results are printed and appended to ``$MDECI_BENCH_OUT`` (JSON lines) when set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.generate import GeneratorConfig, generate

pytestmark = [pytest.mark.bench, pytest.mark.peer("spark"), pytest.mark.timeout(7200)]

ROOT = Path(__file__).resolve().parents[2]
SIZES = [int(x) for x in os.environ.get("MDECI_BENCH_EVENTS", "1000,1000000").split(",") if x]
BUDGET_S = {1_000: 10.0, 1_000_000: 20.0, 10_000_000: 60.0}
EVENTS_PER_USER_DAY = 299  # walkabout-commute, 4 notifications an hour (measured)
DAYS = 7


def _record(row: dict[str, Any]) -> None:
    print("BENCH " + json.dumps(row), flush=True)
    out = os.environ.get("MDECI_BENCH_OUT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MDECI_SPARK_CLASS_CACHE": "on"}


TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> tuple[str, float]:
    """The command name and the user + system CPU seconds of ``pid`` so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return text[text.index("(") + 1 : text.rindex(")")], (int(fields[11]) + int(fields[12])) / TICKS


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (Linux)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _churn(
    source: Path, out: Path, fmt: str, *, cold: bool = False, engine: str | None = None
) -> dict[str, Any]:
    """One ``churn`` process, timed from outside; with the CPU seconds of its driver JVM,
    read from /proc while it runs (every 0.2 s, so the last fraction of a second may be
    missing): on a shared machine they vary less with the load than the wall time. A
    ``cold`` run uses no class archive (an admin's very first run); ``engine`` is passed
    as ``--engine`` (else the default)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
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
            "--quiet",
            *(["--engine", engine] if engine else []),
        ],
        cwd=ROOT,
        env={**_env(), "MDECI_SPARK_CLASS_CACHE": "off"} if cold else _env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    jvm: dict[int, float] = {}
    while True:
        try:
            proc.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
        for pid in _tree(proc.pid):
            try:
                name, cpu = _cpu_s(pid)
            except (OSError, ValueError):
                continue
            if name == "java":
                jvm[pid] = cpu
    _stdout, stderr = proc.communicate()
    wall = time.perf_counter() - started
    assert proc.returncode == 0, stderr[-3000:]
    assert len(stderr.splitlines()) == 1, stderr[-3000:]  # --quiet: the result only
    return {"wall_s": round(wall, 1), "jvm_cpu_s": round(sum(jvm.values()), 1)}


def _pandas_per_user(parquet: Path) -> tuple[float, int]:
    """The per-user job in plain pandas (whole log, no window), for reference."""
    import pandas as pd
    import pyarrow.parquet as pq

    started = time.perf_counter()
    cols = ["ts", "role", "event", "uri", "latency_ms", "cost", "reason"]
    df = pq.read_table(parquet).to_pandas().drop_duplicates()[cols]
    df["ts_ms"] = pd.to_datetime(df["ts"], format="ISO8601").astype("int64") // 1_000_000
    owner = df["event"].eq("ip_changed").map({True: "agent", False: "broker"})
    fact = df["role"].isna() | df["role"].eq(owner)
    facts = df[fact]
    counts = facts.groupby(["uri", "event"]).size().unstack(fill_value=0)
    device = df["role"].isna() | df["role"].eq("agent")
    restores = df[device & df["event"].eq("media_connected")].groupby("uri")["latency_ms"]
    pct = restores.quantile([0.5, 0.95, 0.99]).unstack()
    sms = facts[facts["event"] == "sms_sent"].groupby("uri")["cost"].sum()
    kinds = {"session_ended": 0, "media_disconnected": 1, "media_connected": 2}
    teardown = facts["event"].eq("media_disconnected") & facts["reason"].eq("session ended")
    media = facts[facts["event"].isin(list(kinds)) & ~teardown].copy()
    media["rank"] = media["event"].map(kinds).astype("int8")
    media = media.sort_values(["uri", "ts_ms", "rank"])
    prev = media.groupby("uri")["event"].shift()
    opens = (media["event"] == "media_disconnected") & (prev.isna() | (prev == "media_connected"))
    closes = (media["event"] != "media_disconnected") & (prev == "media_disconnected")
    edges = media[opens | closes].copy()
    edges["next_ts"] = edges.groupby("uri")["ts_ms"].shift(-1)
    starts = edges[edges["event"] == "media_disconnected"].copy()
    horizon = df["ts_ms"].max()
    starts["end"] = starts["next_ts"].fillna(horizon)
    starts["duration"] = starts["end"] - starts["ts_ms"]
    eps = starts.groupby("uri")["duration"].agg(["count", "sum", "max"])
    table = counts.join(pct, how="outer").join(sms, how="outer").join(eps, how="outer")
    return time.perf_counter() - started, len(table)


SPARK_PER_USER = """
import sys, time
from analytics import jobs, parse
from analytics.inputs import find_inputs, read_parsed
from analytics.spark import session

spark = session("local[2]", progress=False)
started = time.perf_counter()
events = parse.valid_events(read_parsed(spark, find_inputs(sys.argv[1], "parquet")))
window = jobs.TimeWindow()
table = jobs.per_user(jobs.in_window(events, window), jobs.episodes(events, window))
table.write.mode("overwrite").format("noop").save()
print(time.perf_counter() - started)
"""


def _spark_per_user(parquet: Path) -> float:
    """The per-user job alone in Spark: a fresh driver as the CLI builds it (3 GB, 8
    shuffle partitions), timed from its first job to the table; the JVM start excluded."""
    run = subprocess.run(
        [sys.executable, "-c", SPARK_PER_USER, str(parquet)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return float(run.stdout.strip().splitlines()[-1])


def _users_days(events: int) -> tuple[int, int]:
    if events < EVENTS_PER_USER_DAY * DAYS:
        return max(1, round(events / EVENTS_PER_USER_DAY)), 1
    return max(1, round(events / (EVENTS_PER_USER_DAY * DAYS))), DAYS


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def class_archive(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> None:
    """One churn run on a tiny log first: it writes the class archive if there is none."""
    from analytics.spark import class_archive

    monkeypatch_module.setenv("MDECI_SPARK_CLASS_CACHE", "on")
    archive = class_archive()
    existed = archive is not None and archive.is_file()
    base = tmp_path_factory.mktemp("warm")
    generate(GeneratorConfig(users=1, days=1, seed=1, model="commute"), base / "log", jsonl=False)
    t = _churn(base / "log" / "parquet", base / "out", "parquet")
    _record({"what": "first churn run", "archive_existed": existed, **t})


@pytest.mark.parametrize("events", SIZES)
def test_churn_throughput(events: int, tmp_path: Path, class_archive: None) -> None:
    users, days = _users_days(events)
    cfg = GeneratorConfig(users=users, days=days, seed=42, model="commute")
    started = time.perf_counter()
    result = generate(cfg, tmp_path / "log", jsonl=False)
    gen_s = time.perf_counter() - started
    _record(
        {
            "what": "generate (Parquet)",
            "events": result.events,
            "wall_s": round(gen_s, 1),
            "events_per_s": round(result.events / gen_s),
        }
    )
    t = _churn(tmp_path / "log" / "parquet", tmp_path / "out", "parquet")
    budget = BUDGET_S.get(events)
    _record(
        {
            "what": "spark churn, Parquet input, all tables, local[2], JVM start included",
            "events": result.events,
            **t,
            "events_per_s": round(result.events / t["wall_s"]),
            "load": Path("/proc/loadavg").read_text().split()[:3],
            "budget_s": budget,
            "within_budget": None if budget is None else t["wall_s"] <= budget,
        }
    )
    if events != max(SIZES) or events < 100_000:
        return
    spark_s = _spark_per_user(tmp_path / "log" / "parquet")
    pandas_s, rows = _pandas_per_user(tmp_path / "log" / "parquet")
    assert rows == users
    _record(
        {
            "what": "per-user job: spark local[2] (JVM start excluded) vs pandas, 1 process",
            "events": result.events,
            "spark_s": round(spark_s, 1),
            "pandas_s": round(pandas_s, 1),
            "ratio": round(spark_s / pandas_s, 2),
            "within_3x": spark_s <= 3 * pandas_s,
        }
    )


FIRST_RUN_BUDGET_S = 10.0


def test_first_run_on_the_demo_logs_from_a_cold_start(tmp_path: Path) -> None:
    """An admin's first ``mdeci analytics churn`` on the demo's JSON logs: a fresh
    process, no class archive, JSON lines in, every table written, with the default
    engine and then with Spark (the 10 s budget is printed beside the figures, not
    asserted)."""
    demo = subprocess.run(
        [sys.executable, "-m", "mdeci", "demo", "--quick", "--plain", "--out", str(tmp_path)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    logs = tmp_path / "logs"
    lines = sum(len(f.read_text().splitlines()) for f in logs.iterdir())
    for engine in (None, "spark"):
        out = tmp_path / f"churn-{engine or 'auto'}"
        t = _churn(logs, out, "jsonl", cold=True, engine=engine)
        used = json.loads((out / "provenance.json").read_text())["engine"]
        _record(
            {
                "what": f"first run: demo's JSON logs, cold, --engine {engine or 'auto'} "
                f"({used}), local[2]",
                "lines": lines,
                **t,
                "load": Path("/proc/loadavg").read_text().split()[:3],
                "budget_s": FIRST_RUN_BUDGET_S,
                "within_budget": t["wall_s"] <= FIRST_RUN_BUDGET_S,
            }
        )
        if engine is None:
            assert used == "local"  # a log this small takes the local engine by default
