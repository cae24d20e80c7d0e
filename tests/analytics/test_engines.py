"""The two engines of ``churn`` write the same output for the same log.

Each case generates a log (several models and seeds, invalid lines, duplicates, swapped
lines, SMS, one or several brokers, with and without a ``--since/--until`` window), runs
the Spark path (``run_churn`` on the shared session) and the local engine
(``run_local``) on it, and compares every table: the Parquet schema, the rows (floats
within a rounding step), the row order where the table has one, the summary in its
order, the quarantine and the provenance. One case adds lines that probe the parser's
edges (field types, time formats, damaged JSON). The wider set of cases runs under
``-m bench`` (``-k engines``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from analytics.churn import TABLES, run_churn
from analytics.cli import parse_time
from analytics.generate import MODELS, GeneratorConfig, generate
from analytics.inputs import find_inputs
from analytics.jobs import JobConfig, TimeWindow
from analytics.local.run import run_local

pytestmark = [pytest.mark.peer("spark"), pytest.mark.slow]

# The columns each ordered table is sorted by (jobs.ordered); per_user and episodes
# have no order.
ORDER: dict[str, tuple[str, ...]] = {
    "per_hour": ("hour",),
    "transitions": ("transitions", "from_subnet", "to_subnet"),
    "restore_latency": ("bucket_lo_ms",),
    "flapping": ("uri", "start_ms"),
    "storms": ("start_ms",),
    "recommendations": ("setting",),
    "handover_matrix": ("handovers", "from_subnet", "to_subnet"),
    "networks": ("disconnections", "subnet"),
    "sms_spend": ("day", "uri"),
    "per_move": ("uri", "ts_ms"),
    "per_device": ("uri", "channel"),
    "latency_by_network": ("deliveries", "network"),
    "per_broker": ("broker",),
    "saved": ("uri",),
    "summary": ("metric",),
}
# Values rounded after a sum may differ in their last kept digit when the two sums
# (added in another order) differ in the 15th.
TOLERANCE = {"sms_cost": 1.01e-4, "cost": 1.01e-4, "churn_score": 1.01e-3, "value": 1.01e-4}

T = '"ts":"2024-03-04T10:00:00Z"'
E = '"event":"registered","uri":"sip:edge@example.net"'


def _obj(*parts: str) -> str:
    return "{" + ",".join(parts) + "}"


# Lines at the parser's edges, each read the same way by both engines.
EDGE_LINES = [
    _obj(T, E, '"node":"broker-1","role":"broker"'),
    *(
        _obj(T, E, field)
        for field in (
            '"node":5',
            '"node":{"x":[1, 2]}',
            '"node":true',
            '"queue_depth":"5"',
            '"queue_depth":5.0',
            '"queue_depth":9223372036854775808',
            '"queue_depth":-0',
            '"latency_ms":"12"',
            '"latency_ms":"-INF"',
            '"latency_ms":1e400',
            '"cost":1',
            '"node":"caf\\u00e9 \\ud83d"',
            '"node":"a\tb"',
        )
    ),
    _obj(T, E) + " trailing text",
    _obj(T, E)[:-1] + ",",
    "[" + _obj(T, E) + "]",
    '"just a string"',
    "\t",
    "{}",
    *(
        _obj(f'"ts":"{ts}"', E)
        for ts in (
            "2024-03-04",
            "2024-03-04 10:00:00",
            "2024-03-04T10:00:00+01:00",
            "2024-03-04T10:00:00.1234567Z",
            "2024-03-04T10:00Z",
            "2024-03-04T10:00:00 UTC",
            "2024-3-4T1:2:3Z",
            " 2024-03-04T10:00:00Z ",
            "2024-03-04T10:00:00+0100",
            "2024-03-04T10:00:00.5+05:30",
            "2024-03-04T10:00:00Europe/Paris",
            "2024-03",
            "2024-03-04T10:00:00GMT+1",
            "2024-02-30T10:00:00Z",
            "2024-03-04T24:00:00Z",
            "2024-03-04t10:00:00z",
            "",
        )
    ),
    _obj('"ts":1700000000', E),
    _obj(T, '"event":"registered","uri":"  "'),
    _obj(T, '"event":"","uri":"x"'),
    _obj(T, '"uri":"x"'),
]


def _generated(out: Path, cfg: GeneratorConfig, edges: bool) -> Path:
    generate(cfg, out, parquet=False)
    logs = out / "jsonl"
    if edges:
        bad_utf8 = ("{" + T + ',"event":"registered","uri":"sip:').encode() + b'\xff"}'
        text = "\n".join(EDGE_LINES) + "\r\n\n   \n"
        (logs / "edges.log").write_bytes(text.encode() + bad_utf8 + b"\r")
    return logs


def _rows(path: Path) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return [(f.name, str(f.type)) for f in table.schema], table.to_pylist()


def _same(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=max(tol, 1e-9))
    return bool(a == b) and type(a) is type(b)


def _sort_key(row: dict[str, Any]) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, f"{v:.6g}" if isinstance(v, float) else repr(v)) for v in row.values())


def _compare(spark_out: Path, local_out: Path) -> list[str]:
    """What differs between the two outputs (empty when they are equal)."""
    problems: list[str] = []
    for name in TABLES:
        s_schema, s_rows = _rows(spark_out / name)
        l_schema, l_rows = _rows(local_out / name)
        if s_schema != l_schema:
            problems.append(f"{name}: schema {l_schema} != {s_schema}")
            continue
        if len(s_rows) != len(l_rows):
            problems.append(f"{name}: {len(l_rows)} rows, Spark {len(s_rows)}")
            continue
        keys = ORDER.get(name)
        if keys is not None:
            s_order = [tuple(r[k] for k in keys) for r in s_rows]
            l_order = [tuple(r[k] for k in keys) for r in l_rows]
            if s_order != l_order:
                problems.append(f"{name}: row order differs")
        pairs = zip(sorted(s_rows, key=_sort_key), sorted(l_rows, key=_sort_key), strict=True)
        for s, loc in pairs:
            bad = [(c, loc[c], s[c]) for c in s if not _same(loc[c], s[c], TOLERANCE.get(c, 0.0))]
            if bad:
                problems.append(f"{name}: row {s} differs: {bad}")
                break
    return problems


def _quarantine(out: Path) -> list[tuple[str, str, str]]:
    rows = [json.loads(x) for p in sorted((out / "quarantine").glob("*.json")) for x in p.open()]
    return sorted((r["source"], r["line"], r["reason"]) for r in rows)


def _both(spark: Any, logs: Path, tmp: Path, window: TimeWindow) -> tuple[Path, Path]:
    # A small input, as the local engine's by default: Spark then takes its small-input
    # path, whose Parquet files pyarrow writes (Spark's own writer types a timestamp
    # column otherwise, so a large log's tables differ in type, not in values).
    assert find_inputs(str(logs)).small
    cfg = JobConfig(window=window)
    run_churn(spark, str(logs), str(tmp / "spark"), cfg)
    run_local(find_inputs(str(logs)), str(tmp / "local"), cfg)
    return tmp / "spark", tmp / "local"


def _check(spark_out: Path, local_out: Path) -> None:
    assert _compare(spark_out, local_out) == []
    assert _quarantine(local_out) == _quarantine(spark_out)
    s_prov = json.loads((spark_out / "provenance.json").read_text())
    l_prov = json.loads((local_out / "provenance.json").read_text())
    assert (l_prov["engine"], s_prov["engine"]) == ("local", "spark")
    for key in ("inputs", "input_format", "skipped"):
        assert l_prov[key] == s_prov[key]


SINCE = parse_time("2024-03-04T07:13:20.500Z", "--since")
UNTIL = parse_time("2024-03-05T19:00:00Z", "--until")

# (generator settings, window, with the parser's edge lines)
SUITE_CASES: dict[str, tuple[dict[str, Any], TimeWindow, bool]] = {
    "commute, window, dirty, edges": (
        {"model": "walkabout-commute", "seed": 7, "queue_limit": 4, "urgent_fraction": 0.5},
        TimeWindow(since_ms=SINCE, until_ms=UNTIL),
        True,
    ),
    "popup, three brokers, no window": (
        {"model": "jecho-popup", "seed": 11, "brokers": 3, "failover_fraction": 0.4},
        TimeWindow(),
        False,
    ),
}


def _config(settings: dict[str, Any], users: int = 12, days: int = 2) -> GeneratorConfig:
    dirty = {
        "duplicate_fraction": 0.01,
        "reorder_fraction": 0.01,
        "malformed_fraction": 0.004,
        "users_per_shard": 5,
    }
    return GeneratorConfig(users=users, days=days, **{**dirty, **settings})


@pytest.mark.parametrize("case", list(SUITE_CASES))
def test_both_engines_write_the_same_tables(spark: Any, tmp_path: Path, case: str) -> None:
    settings, window, edges = SUITE_CASES[case]
    logs = _generated(tmp_path / "log", _config(settings), edges)
    spark_out, local_out = _both(spark, logs, tmp_path, window)
    _check(spark_out, local_out)
    summary = {r["metric"]: r["value"] for r in _rows(local_out / "summary")[1]}
    # The case exercises what it says: invalid lines, duplicates, drops, episodes.
    assert summary["invalid_lines"] > 0 and summary["duplicates_dropped"] > 0
    assert summary["disconnections"] > 0 and summary["address_changes"] > 0


WIDE_CASES = [
    (model, seed, brokers, windowed)
    for i, model in enumerate(MODELS)
    for seed, brokers, windowed in ((100 + i, 1, i % 2 == 0), (200 + i, 2 + i % 3, i % 2 == 1))
]


@pytest.mark.bench
@pytest.mark.parametrize(("model", "seed", "brokers", "windowed"), WIDE_CASES)
def test_both_engines_agree_on_every_model(
    spark: Any, tmp_path: Path, model: str, seed: int, brokers: int, windowed: bool
) -> None:
    settings = {"model": model, "seed": seed, "brokers": brokers, "urgent_fraction": 0.3}
    cfg = _config(settings, users=20, days=2)
    logs = _generated(tmp_path / "log", cfg, edges=seed % 2 == 0)
    window = TimeWindow(since_ms=SINCE, until_ms=UNTIL) if windowed else TimeWindow()
    _check(*_both(spark, logs, tmp_path, window))
