"""On a generated ~200,000-event log, Spark's per-user and per-hour tables
equal those of the independent plain-Python implementation in ``reference.py``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from analytics.cli import parse_time
from tests.analytics import reference
from tests.analytics.conftest import CROSS_SINCE, CROSS_UNTIL

pytestmark = [pytest.mark.peer("spark"), pytest.mark.slow]


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(path).to_pylist())


def _close(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=tol)
    return bool(a == b)


# Rounded sums may differ in the last kept digit when the two sums differ in the 15th.
TOLERANCE = {"sms_cost": 1.01e-4, "churn_score": 1.01e-3}


@pytest.fixture(scope="module")
def expected(generated_log: Path) -> reference.Parsed:
    return reference.read(generated_log)


def test_the_log_is_big_and_dirty_enough(expected: reference.Parsed) -> None:
    assert 190_000 <= len(expected.events) <= 260_000
    assert expected.invalid > 50
    assert expected.duplicates > 500


def test_summary_counts_match(churn_output: Path, expected: reference.Parsed) -> None:
    summary = {r["metric"]: r["value"] for r in _rows(churn_output / "summary")}
    assert summary["events"] == len(expected.events)
    assert summary["invalid_lines"] == expected.invalid
    assert summary["duplicates_dropped"] == expected.duplicates
    quarantined = sum(1 for p in (churn_output / "quarantine").glob("*.json") for _ in p.open())
    assert quarantined == expected.invalid


def test_per_user_matches_the_reference(churn_output: Path, expected: reference.Parsed) -> None:
    since = parse_time(CROSS_SINCE, "--since")
    until = parse_time(CROSS_UNTIL, "--until")
    want = reference.per_user(expected, since, until)
    got = {r.pop("uri"): r for r in _rows(churn_output / "per_user")}
    assert set(got) == set(want)
    assert sum(r["notify_dropped"] for r in got.values()) > 0  # the drops are exercised
    assert sum(r["disconnections"] for r in got.values()) > 1000
    mismatches = [
        (uri, key, got[uri][key], value)
        for uri, row in want.items()
        for key, value in row.items()
        if not _close(got[uri][key], value, TOLERANCE.get(key, 0.0))
    ]
    assert mismatches == []
    assert set(next(iter(got.values()))) == set(next(iter(want.values())))


def test_per_hour_matches_the_reference(churn_output: Path, expected: reference.Parsed) -> None:
    since = parse_time(CROSS_SINCE, "--since")
    until = parse_time(CROSS_UNTIL, "--until")
    want = reference.per_hour(expected, since, until)
    got = {int(r.pop("hour").timestamp() * 1000): r for r in _rows(churn_output / "per_hour")}
    assert set(got) == set(want)
    mismatches = [
        (hour, key, got[hour][key], value)
        for hour, row in want.items()
        for key, value in row.items()
        if not _close(got[hour][key], value, TOLERANCE.get(key, 0.0))
    ]
    assert mismatches == []
