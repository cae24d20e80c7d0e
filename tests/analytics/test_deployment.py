"""The churn job on a real deployment's logs: ``mdeci demo --quick``
runs a broker and two agents (alice moves twice and loses her radio once); the churn
job then reads *all* their logs, the broker's and the agents', in a fresh process.

- the totals equal the demo's own summary exactly: every fact both sides log
  (deliveries, re-INVITEs, session starts) is counted once, from its authoritative role;
- a default run prints no Spark WARN line on stderr, and ``--quiet`` only the result line;
- the HTML report of those tables, rendered in headless Chromium, has every section, and
  each one that the demo has data for is non-empty.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.analytics import png
from tests.peers import require_binary

pytestmark = pytest.mark.peer("spark")

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _mdeci(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mdeci", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass(frozen=True)
class Run:
    demo: dict[str, Any]
    logs: Path
    out: Path
    stderr: str
    summary: dict[str, float]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    require_binary("java", "apt-get install openjdk-17-jre-headless")
    base = tmp_path_factory.mktemp("deployment")
    demo = _mdeci("demo", "--quick", "--plain", "--out", str(base / "demo"), timeout=300)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    facts = json.loads((base / "demo" / "summary.json").read_text())
    assert facts["ok"] and facts["handovers"] >= 2 and facts["outage"] is not None, facts
    logs = base / "demo" / "logs"
    roles = {json.loads(x)["role"] for f in logs.iterdir() for x in f.read_text().splitlines()}
    assert roles == {"broker", "agent"}  # each line says who wrote it
    out = base / "churn"
    churn = _mdeci(
        "analytics", "churn", "--input", str(logs), "--output", str(out), "--master", "local[2]"
    )
    assert churn.returncode == 0, churn.stderr[-3000:]
    rows = (out / "csv" / "summary" / "part-00000.csv").read_text().splitlines()[1:]
    summary = {k: float(v) for k, v in (r.split(",") for r in rows)}
    return Run(facts, logs, out, churn.stderr, summary)


def test_totals_equal_the_demos_own_summary(run: Run) -> None:
    s, demo = run.summary, run.demo
    # Both the broker and alice's agent log each delivery: counted once (the broker's ack).
    assert s["notify_delivered"] == demo["delivered"]
    assert s["notify_queued"] == demo["broker_matched"]
    # Each move: the agent's ip_changed and the broker's re-INVITE, once each.
    assert s["handovers"] == demo["handovers"]
    assert s["address_changes"] == demo["handovers"]
    assert s["restores"] == len(demo["restore_ms"]["all"])
    # The radio outage is one episode; the sessions' tear-down at the end is none.
    assert s["disconnections"] == 1
    assert s["users"] == 2
    assert s["other_role_copies"] > demo["delivered"]  # the agents' copies were there
    episodes = (run.out / "csv" / "episodes" / "part-00000.csv").read_text().splitlines()
    assert len(episodes) == 2
    _, start, end, *_rest = episodes[1].split(",")
    outage_ms = int(end) - int(start)
    # The broker saw the outage from its detection to alice's return.
    detected = demo["outage"]["duration_s"] - demo["outage"]["detected_after_s"]
    assert abs(outage_ms / 1000 - detected) < 1.0, (outage_ms, demo["outage"])


def test_csv_writes_integers_as_integers(run: Run) -> None:
    text = (run.out / "csv" / "summary" / "part-00000.csv").read_text()
    assert re.search(r"^lines,\d+$", text, re.M), text
    assert re.search(r"^first_ts_ms,\d{13}$", text, re.M), text
    per_user = (run.out / "csv" / "per_user" / "part-00000.csv").read_text()
    assert ".0," not in per_user.split("\n", 1)[1]


def test_a_default_run_prints_no_spark_warn_line(run: Run) -> None:
    noisy = [x for x in run.stderr.splitlines() if re.search(r"\bWARN", x)]
    assert noisy == [], noisy
    assert "parsing" in run.stderr  # progress is shown by default


def test_quiet_prints_only_the_result_line(run: Run, tmp_path: Path) -> None:
    churn = _mdeci(
        "analytics",
        "churn",
        "--quiet",
        "--input",
        str(run.logs),
        "--output",
        str(tmp_path / "q"),
        "--master",
        "local[2]",
    )
    assert churn.returncode == 0, churn.stderr[-3000:]
    assert churn.stdout == ""
    lines = churn.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{int(run.summary['events'])} events"), lines


SECTIONS_WITH_DATA = {
    "provenance",
    "headline",
    "delivery",
    "handovers-per-hour",
    "restore-cdf",
    "durations",
    "churners",
    "mobility",
    "handover-matrix",
    "networks",
    "per-user",
    "episodes",
    "recommendations",
    # The papers' figures: alice's moves, both devices' deliveries, the one broker.
    "per-move",
    "siena",
    "per-device",
    "latency-by-network",
    "per-broker",
}
# The quick demo has no SMS gateway and two users: no SMS spend and no reconnect storm
# (tests/analytics/test_report.py draws both from a generated log).
SECTIONS_WITHOUT_DATA = {"sms-spend", "storms"}


def test_report_renders_every_section_in_headless_chromium(run: Run, tmp_path: Path) -> None:
    chromium = require_binary("chromium", "apt-get install chromium")
    page = tmp_path / "report.html"
    report = _mdeci("analytics", "report", "--input", str(run.out), "--output", str(page))
    assert report.returncode == 0, report.stderr
    html = page.read_text()
    assert str(run.logs / "broker-churn.log").split("/")[-1] in html  # provenance: inputs
    assert "generated at" in html and "127.0.0.0/24" in html

    def chrome(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--window-size=1280,3600",
                *args,
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    dom = chrome("--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body is not None
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    assert attrs["errors"] == "0"
    assert set(attrs["sections"].split(",")) == SECTIONS_WITH_DATA | SECTIONS_WITHOUT_DATA
    empty = set(filter(None, attrs["empty"].split(",")))
    assert empty <= SECTIONS_WITHOUT_DATA, empty
    assert attrs["charts"] == attrs["drawn"] or int(attrs["drawn"]) >= 8, attrs

    shot = tmp_path / "report.png"
    run_shot = chrome(f"--screenshot={shot}")
    assert run_shot.returncode == 0 and shot.exists(), run_shot.stderr[-2000:]
    width, height, bpp, rows = png.decode(shot.read_bytes())
    assert (width, height) == (1280, 3600)
    counts = png.colours(rows, bpp, 0, 3000)
    blue = sum(n for c, n in counts.items() if c[2] > 150 and c[0] < 120)
    assert blue > 20_000  # charts drawn, not a blank page
