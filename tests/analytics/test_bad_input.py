"""Acceptance 6: bad input is one error line and a non-zero exit, never a Java trace.

Each case runs ``python -m mdeci analytics ...`` as its own process, as an admin would,
so that anything the JVM printed would show up on stderr; the checks refuse before the
JVM starts, so none of these runs should start one.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mdeci(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mdeci", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _assert_one_error_line(run: subprocess.CompletedProcess[str], step: str, needle: str) -> None:
    err = run.stderr
    assert run.returncode == 2, (run.returncode, err)
    assert err.endswith("\n") and err.count("\n") == 1, err  # exactly one line
    assert err.startswith(f"mdeci analytics {step}: error:"), err
    assert needle in err, err
    for trace in ("Exception", "at org.apache", "Traceback", "py4j"):
        assert trace not in err, err
    assert run.stdout == ""


def _churn(tmp_path: Path, source: Path) -> subprocess.CompletedProcess[str]:
    return _mdeci("analytics", "churn", "--input", str(source), "--output", str(tmp_path / "o"))


def test_churn_of_a_missing_folder(tmp_path: Path) -> None:
    _assert_one_error_line(_churn(tmp_path, tmp_path / "nope"), "churn", "does not exist")
    assert not (tmp_path / "o").exists()


def test_churn_of_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "in" / "sub").mkdir(parents=True)  # nested, still nothing in it
    _assert_one_error_line(_churn(tmp_path, tmp_path / "in"), "churn", "it is empty")


def _non_logs(folder: Path) -> None:
    folder.mkdir()
    (folder / "README.md").write_text("# Logs\n\nThe broker writes churn.log here.\n")
    # A pretty-printed JSON object: its first line is "{", not a record.
    (folder / "config.json").write_text(json.dumps({"ts": "x", "event": "y"}, indent=2))
    (folder / "list.jsonl").write_text('["ts", "event"]\n42\n')  # JSON, but no objects
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    (folder / "old.log.gz").write_bytes(gzip.compress(b"kernel: eth0 link up\n" * 50))
    (folder / "broken.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")  # a cut archive
    (folder / "data.parquet").write_bytes(b"not parquet at all")
    (folder / "empty.log").write_bytes(b"")


def test_churn_of_a_folder_of_non_log_files(tmp_path: Path) -> None:
    _non_logs(tmp_path / "in")
    run = _churn(tmp_path, tmp_path / "in")
    _assert_one_error_line(run, "churn", "8 file(s) that are not churn logs")
    for fmt in ("jsonl", "parquet"):
        run = _mdeci(
            "analytics",
            "churn",
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(tmp_path / "o"),
            "--format",
            fmt,
        )
        _assert_one_error_line(run, "churn", "not churn logs")


def test_churn_of_one_non_log_file(tmp_path: Path) -> None:
    _non_logs(tmp_path / "in")
    run = _churn(tmp_path, tmp_path / "in" / "README.md")
    _assert_one_error_line(run, "churn", "(README.md)")


def test_non_log_files_next_to_a_log_are_skipped(tmp_path: Path) -> None:
    """The sniffing keeps logs, compressed or damaged at the top, and nothing else."""
    from analytics.inputs import find_inputs

    folder = tmp_path / "in"
    _non_logs(folder)
    record = json.dumps({"ts": "2024-05-06T10:00:00.000Z", "event": "registered", "uri": "u"})
    (folder / "churn.log").write_text(f'{{"ts": "2024-05-06T10:\n{record}\n')  # truncated first
    (folder / "churn.log.1.gz").write_bytes(gzip.compress(f"\n{record}\n".encode()))
    inputs = find_inputs(str(folder))
    assert inputs.fmt == "jsonl"
    assert [Path(p).name for p in inputs.paths] == ["churn.log", "churn.log.1.gz"]
    assert len(inputs.skipped) == 8


@pytest.mark.parametrize("case", ["missing", "empty", "file", "not-churn-output"])
def test_report_of_a_bad_input(tmp_path: Path, case: str) -> None:
    source = tmp_path / "in"
    needle = "is not a directory"
    if case == "empty":
        source.mkdir()
        needle = "is not the output of 'mdeci analytics churn'"
    elif case == "file":
        source.write_text("hello\n")
    elif case == "not-churn-output":
        _non_logs(source)
        needle = "(no summary, per_user"
    run = _mdeci(
        "analytics", "report", "--input", str(source), "--output", str(tmp_path / "r.html")
    )
    _assert_one_error_line(run, "report", needle)
    assert not (tmp_path / "r.html").exists()


# What a fresh ``mdeci`` process has imported once its parser is built and the command
# has run (``-X importtime`` misses modules loaded through importlib.import_module).
_PROBE = """
import json, sys
from mdeci.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize(
    "argv", [["--help"], ["pub", "--help"], ["analytics", "--help"], ["analytics", "churn", "-h"]]
)
def test_the_cli_does_not_import_spark_until_a_job_runs(argv: list[str]) -> None:
    """``mdeci`` imports the named command's module to build its parser; none may pull in
    pyspark (about a second, and a JVM's worth of jars on the path) for other commands."""
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    imported = set(json.loads(run.stdout.splitlines()[-1]))
    # Only the named command's module is imported (mdeci.cli.REGISTRY); analytics' CLI is
    # when it is the command, yet never its engine.
    assert ("analytics.cli" in imported) == (argv[0] == "analytics")
    heavy = sorted(m for m in imported if m.split(".")[0] in {"pyspark", "py4j", "pyarrow"})
    assert heavy == [], heavy
