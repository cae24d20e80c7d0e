"""``mdeci analytics ...`` end to end: one-line errors, and a run on another master."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mdeci.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mdeci analytics {argv[1]}: error:"), err
    assert needle in err
    assert "\n" not in err and "Traceback" not in err


def test_missing_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _one_line_error(
        capsys,
        ["analytics", "churn", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")],
        "does not exist",
    )


def test_empty_input_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    _one_line_error(
        capsys,
        ["analytics", "churn", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o")],
        "no churn-log files",
    )


def test_bad_time_window(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["analytics", "churn", "--input", str(tmp_path), "--output", str(tmp_path / "o")]
    _one_line_error(capsys, [*argv, "--since", "next week"], "--since")
    _one_line_error(
        capsys, [*argv, "--since", "2024-03-05", "--until", "2024-03-04"], "--until must be after"
    )


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_negative_minimum_sample_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    argv = ["analytics", "churn", "--input", str(tmp_path), "--output", str(tmp_path / "o")]
    _one_line_error(capsys, [*argv, "--min-tail", value], "--min-tail must be 0 or more")


def test_report_of_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _one_line_error(
        capsys,
        ["analytics", "report", "--input", str(tmp_path), "--output", str(tmp_path / "r.html")],
        "not the output of",
    )


def test_generate_refuses_bad_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["analytics", "generate", "--users", "0", "--days", "1", "--out", str(tmp_path)]
    _one_line_error(capsys, argv, "--users")


def test_generate_writes_and_reports_its_rate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["analytics", "generate", "--users", "3", "--days", "1", "--model", "salesman"]
    assert main([*argv, "--seed", "4", "--out", str(tmp_path), "--quiet"]) == 0
    assert "events/s" in capsys.readouterr().err
    assert list((tmp_path / "jsonl").glob("*.jsonl")) and list((tmp_path / "parquet").glob("*"))


@pytest.mark.peer("spark")
@pytest.mark.slow
def test_generate_churn_report_in_a_fresh_process_on_the_given_master(tmp_path: Path) -> None:
    """Acceptance 5: ``--master`` is passed through to Spark as given; Parquet input works."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def mdeci(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mdeci", "analytics", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    gen = mdeci(
        "generate",
        "--users",
        "8",
        "--days",
        "1",
        "--seed",
        "9",
        "--out",
        str(tmp_path / "log"),
        "--quiet",
    )
    assert gen.returncode == 0, gen.stderr
    churn = mdeci(
        "churn",
        "--input",
        str(tmp_path / "log" / "parquet"),
        "--output",
        str(tmp_path / "out"),
        "--master",
        "local[1]",
        "--shuffle-partitions",
        "2",
        "--since",
        "2024-03-04T06:00:00Z",
    )
    assert churn.returncode == 0, churn.stderr[-3000:]
    assert "on local[1]" in churn.stderr
    for table in ("per_user", "per_hour", "episodes", "transitions", "storms", "summary"):
        assert list((tmp_path / "out" / table).glob("*.parquet")), table
        assert list((tmp_path / "out" / "csv" / table).glob("*.csv")), table
    report = mdeci("report", "--input", str(tmp_path / "out"), "--output", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "r.html").read_text().count('<svg class="chart"') == 9


def test_spark_submit_driver_file_parses_like_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from analytics import submit

    argv = ["churn", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")]
    assert submit.main(argv) == 2
    assert "does not exist" in capsys.readouterr().err


def test_skipping_line_names_each_skipped_file_once_and_counts_the_rest(tmp_path: Path) -> None:
    from analytics.cli import skipping_line
    from analytics.inputs import find_inputs

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "churn.log").write_text('{"ts":"2024-05-06T10:00:00Z","event":"x"}\n')
    for d in ("a", "b"):  # the same name in two folders: two files, two names
        (tmp_path / d / "README").write_text("not a log\n")
    for i in range(6):
        (tmp_path / "b" / f"img{i}.png").write_bytes(b"\x89PNG")
    inputs = find_inputs(str(tmp_path))
    text = skipping_line(inputs.skipped, str(tmp_path))
    assert text.startswith("skipping 8 file(s) that are not churn logs: a/README, b/README, ")
    shown = text.split(": ", 1)[1].split(" and ")[0].split(", ")
    assert len(shown) == len(set(shown)) == 5
    assert text.endswith(" and 3 more")  # 5 named + 3 more = 8


def test_the_analytics_authority_table_is_the_writers() -> None:
    from analytics import schema as S
    from mdeci.churnlog import AUTHORITY

    assert {str(e): str(r) for e, r in AUTHORITY.items()} == S.AUTHORITY


def test_watch_refuses_a_missing_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _one_line_error(
        capsys,
        ["analytics", "watch", "--input", str(tmp_path / "nope"), "--output", str(tmp_path)],
        "is not a directory",
    )
