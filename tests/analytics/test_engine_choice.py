"""``churn --engine auto|spark|local``: which engine runs, and a local run end to end
(no JVM: these tests run without Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analytics.errors import OptionError
from analytics.inputs import SMALL_INPUT_BYTES, Inputs
from analytics.local.run import choose_engine
from mdeci.cli import main
from tests.analytics.logs import line

SMALL = Inputs("jsonl", ["/logs/churn.log"], [], 1000, None)


def test_auto_is_local_for_a_small_local_log_on_a_local_master(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    for master in (None, "local[2]", "local[*]"):
        assert choose_engine("auto", master, SMALL, "/out", keep_extra=False) == "local"


@pytest.mark.parametrize(
    ("master", "inputs", "output", "keep_extra", "why"),
    [
        ("spark://h:7077", SMALL, "/out", False, "a cluster master"),
        ("yarn", SMALL, "/out", False, "a cluster master"),
        (
            "local[2]",
            Inputs("jsonl", ["/l"], [], SMALL_INPUT_BYTES + 1, None),
            "/out",
            False,
            "big",
        ),
        ("local[2]", Inputs("parquet", ["/l.parquet"], [], 10, 5), "/out", False, "Parquet"),
        ("local[2]", Inputs("jsonl", ["hdfs://n/logs"]), "/out", False, "a URL in"),
        ("local[2]", SMALL, "s3a://bucket/out", False, "a URL out"),
        ("local[2]", SMALL, "/out", True, "--keep-extra"),
        ("local[2]", Inputs("jsonl", ["/l.zst"], [], 10, None), "/out", False, "zstd"),
    ],
)
def test_auto_is_spark_when_something_needs_it(
    master: str, inputs: Inputs, output: str, keep_extra: bool, why: str
) -> None:
    assert choose_engine("auto", master, inputs, output, keep_extra=keep_extra) == "spark", why


def test_a_master_set_by_spark_submit_is_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert choose_engine("auto", None, SMALL, "/out", keep_extra=False) == "spark"


def test_either_engine_can_be_asked_for() -> None:
    assert choose_engine("spark", "local[2]", SMALL, "/out", keep_extra=False) == "spark"
    big = Inputs("jsonl", ["/l"], [], SMALL_INPUT_BYTES * 4, None)
    assert choose_engine("local", "spark://h:7077", big, "/out", keep_extra=False) == "local"
    parquet = Inputs("parquet", ["/l.parquet"], [], 10, 5)
    with pytest.raises(OptionError, match="not Parquet"):
        choose_engine("local", None, parquet, "/out", keep_extra=False)
    with pytest.raises(OptionError, match="keep-extra"):
        choose_engine("local", None, SMALL, "/out", keep_extra=True)


def _log(folder: Path) -> Path:
    folder.mkdir()
    (folder / "churn.log").write_text(
        "\n".join(
            [
                line(0, "session_started", addr="10.0.0.5:5060", role="broker"),
                line(1, "media_connected", addr="10.0.0.5:5060", role="broker"),
                line(60, "ip_changed", addr="10.0.1.7:5060", prev_addr="10.0.0.5:5060"),
                line(61, "media_disconnected", addr="10.0.1.7:5060", role="broker"),
                line(65, "media_connected", addr="10.0.1.7:5060", role="agent", latency_ms=4200.0),
                line(66, "media_connected", addr="10.0.1.7:5060", role="broker"),
                '{"ts": "not a time", "event": "registered", "uri": "sip:bob@example.net"}',
            ]
        )
        + "\n"
    )
    return folder


def test_a_local_run_writes_what_report_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    logs, out = _log(tmp_path / "logs"), tmp_path / "out"
    argv = [
        "analytics",
        "churn",
        "--input",
        str(logs),
        "--output",
        str(out),
        "--master",
        "local[2]",
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "local engine" in err and "Spark" not in err
    assert "6 events (1 invalid lines quarantined" in err
    assert json.loads((out / "provenance.json").read_text())["engine"] == "local"
    [bad] = [json.loads(x) for x in (out / "quarantine" / "part-00000.json").open()]
    assert bad["reason"] == "ts is not an RFC 3339 time"
    assert bad["source"] == "file:" + str((logs / "churn.log").resolve())
    rows = (out / "csv" / "per_move" / "part-00000.csv").read_text().splitlines()
    assert rows[1].endswith(",10.0.0.0/24,10.0.1.0/24,,4200,0,0")
    html = tmp_path / "r.html"
    assert main(["analytics", "report", "--input", str(out), "--output", str(html)]) == 0
    assert "local (in the driver process, no Spark)" in html.read_text()


def test_local_on_parquet_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(
        pa.table({"ts": ["2024-03-04T10:00:00Z"], "event": ["registered"]}), logs / "a.parquet"
    )
    argv = ["analytics", "churn", "--input", str(logs), "--output", str(tmp_path / "o")]
    assert main([*argv, "--engine", "local"]) == 2
    err = capsys.readouterr().err.strip()
    why = "--engine local cannot run this: it reads JSON lines, not Parquet"
    assert err == f"mdeci analytics churn: error: {why}"
