"""The two ways ``churn`` runs (one job for a small log, a job per table for a large
one) write the same tables from the same Parquet log, bad and duplicate rows included."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from analytics import churn
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


def _both_paths(spark: Any, log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    small = run_churn(spark, str(log), str(tmp_path / "small"), JobConfig(), fmt="parquet")
    monkeypatch.setattr(churn, "SMALL_INPUT_ROWS", 0)  # the large path, job per table
    large = run_churn(spark, str(log), str(tmp_path / "large"), JobConfig(), fmt="parquet")
    return small, large


@pytest.mark.parametrize("bad", [True, False], ids=["bad-rows", "clean"])
def test_small_and_large_paths_write_the_same_tables(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: bool
) -> None:
    log = _log(tmp_path / "log", bad=bad)
    small, large = _both_paths(spark, log, tmp_path, monkeypatch)
    assert _sorted_tables(tmp_path / "large") == _sorted_tables(tmp_path / "small")
    quarantined = _quarantine(tmp_path / "large")
    assert quarantined == _quarantine(tmp_path / "small")
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
    assert large.summary["lines"] == large.summary["events"] + 3 * bad
