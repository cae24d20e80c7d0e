"""Acceptance 3: the report renders in headless Chromium, with every chart drawn."""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import pytest

from analytics.errors import InputError
from analytics.paper_sections import DEFINITIONS
from analytics.report import write_report
from tests.analytics import png
from tests.peers import require_binary

pytestmark = [pytest.mark.peer("spark")]


def _chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,2000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def report(churn_output: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    write_report(churn_output, out, title="churn <test> & co")
    return out


def test_report_is_self_contained(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    # No external fetches: nothing to load from a network the admin may not have.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script src" not in page
    assert page.count('<svg class="chart"') == 9
    assert "churn &lt;test&gt; &amp; co" in page  # titles are escaped


def test_report_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    chromium = require_binary("chromium", "apt-get install chromium")
    url = report.resolve().as_uri()
    dom = _chromium(chromium, tmp_path / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body is not None
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    # The page's own check ran: no script errors, nine charts, each with marks and a size.
    assert (attrs["charts"], attrs["drawn"], attrs["errors"]) == ("9", "9", "0"), attrs
    assert attrs["empty"] == "", attrs  # every section has content on the generated log
    # The papers' figures are there, each table under its definition.
    papers = {"per-move", "siena", "per-device", "latency-by-network", "per-broker"}
    assert papers <= set(attrs["sections"].split(",")), attrs
    for name in papers:
        shown = re.search(rf"data-section=\"{name}\"[^>]*>(.*?)</section>", dom.stdout, re.S)
        assert shown is not None, name
        text = html.unescape(re.sub(r"<[^>]+>", " ", shown.group(1)))
        assert " ".join(DEFINITIONS[name].split()[:8]) in " ".join(text.split()), name
        assert '<tr class="row">' in shown.group(1), name
    assert "Uncaught" not in dom.stderr and "SyntaxError" not in dom.stderr

    shot = tmp_path / "report.png"
    run = _chromium(chromium, tmp_path / "profile-shot", f"--screenshot={shot}", url)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    width, height, bpp, rows = png.decode(shot.read_bytes())
    assert (width, height) == (1280, 2000)
    # Not blank: the charts' blues and oranges are there, in quantity, in the chart area.
    counts = png.colours(rows, bpp, 300, 1700)
    assert len(counts) > 50
    background = max(counts.values())
    assert background < 0.9 * sum(counts.values())
    blue = sum(n for c, n in counts.items() if c[2] > 150 and c[0] < 120)
    orange = sum(n for c, n in counts.items() if c[0] > 200 and 80 < c[1] < 160 and c[2] < 80)
    assert blue > 20_000
    assert orange > 200


def test_report_of_a_folder_that_is_not_churn_output(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not the output of"):
        write_report(tmp_path, tmp_path / "r.html")


def test_cdf_axis_runs_past_p99_and_marks_the_percentiles() -> None:
    import re as _re

    from analytics.charts import cdf_chart

    buckets = [
        {"bucket_lo_ms": 500.0, "bucket_hi_ms": 750.0, "cumulative_fraction": 0.5},
        {"bucket_lo_ms": 750.0, "bucket_hi_ms": 1000.0, "cumulative_fraction": 0.9},
        {"bucket_lo_ms": 3000.0, "bucket_hi_ms": 5000.0, "cumulative_fraction": 1.0},
    ]
    svg = cdf_chart(buckets, "cdf", (("p50", 740.0), ("p95", 3100.0), ("p99", 4800.0)))
    ticks = _re.findall(r'font-size="9">([^<]+)</text>', svg)
    assert ticks[-1] in ("5 s", "10 s"), ticks  # the axis no longer stops at 1 s
    assert "p99 5 s" in svg and "p95 3 s" in svg  # labelled percentile lines
    assert "restore latency (log scale" in svg and "fraction of restores" in svg  # units


def test_the_cdf_crosses_each_percentile_line_at_its_fraction() -> None:
    import re as _re

    from analytics.charts import cdf_chart

    # Every restore took 38 ms: the histogram's bucket is 20-50 ms, the percentiles 38 ms.
    buckets = [{"bucket_lo_ms": 20.0, "bucket_hi_ms": 50.0, "cumulative_fraction": 1.0}]
    marks = (("p50", 38.0), ("p95", 38.0), ("p99", 38.0))
    svg = cdf_chart(buckets, "cdf", marks)
    (line,) = _re.findall(r'<polyline[^>]* points="([^"]+)"', svg)
    curve = [tuple(float(v) for v in p.split(",")) for p in line.split()]
    marker_x = {float(v) for v in _re.findall(r'<line class="pct" x1="([0-9.]+)"', svg)}
    assert len(marker_x) == 1
    (mx,) = marker_x
    top, bottom = 20.0, float(_re.findall(r'y2="([0-9.]+)"', svg)[0])
    crossing = sorted(round((bottom - y) / (bottom - top), 2) for x, y in curve if x == mx)
    assert crossing == [0.5, 0.95, 0.99]
    assert [y for _, y in curve] == sorted((y for _, y in curve), reverse=True)  # rises


def _empty_tables() -> dict[str, list[dict[str, object]]]:
    """The tables :func:`analytics.report.render` reads, all empty."""
    names = ("per_user", "per_hour", "episodes", "transitions", "restore_latency")
    return {name: [] for name in (*names, "storms", "flapping", "recommendations")}


def test_time_disconnected_is_a_duration_not_zero_hours() -> None:
    from analytics.report import render

    tables = _empty_tables()
    tables["summary"] = [{"metric": "disconnected_hours", "value": 0.0}]
    tables["per_user"] = [
        {
            "uri": "sip:a@x",
            "events": 1,
            "address_changes": 0,
            "handovers": 0,
            "disconnections": 1,
            "disconnected_ms": 1520,
            "restore_p50_ms": None,
            "restore_p95_ms": None,
            "notify_queued": 0,
            "notify_delivered": 0,
            "notify_dropped": 0,
            "sms_count": 0,
            "sms_cost": 0.0,
            "churn_score": 2.0,
        }
    ]
    page = render(tables)
    assert "<b>2 s</b><span>time disconnected</span>" in page
    assert "hours disconnected" not in page


def test_every_headline_figure_stands_beside_its_definition() -> None:
    import re as _re

    from analytics.charts import esc
    from analytics.report import HEADLINE_DEFINITIONS, render

    tables = _empty_tables()
    tables["summary"] = [
        {"metric": "events", "value": 454.0},
        {"metric": "events_in_window", "value": 300.0},
    ]
    page = render(tables)
    cards = _re.findall(r"<div class='card mark-card'><b>[^<]*</b><span>([^<]+)</span>", page)
    assert cards and set(cards) == set(HEADLINE_DEFINITIONS)
    for label in cards:
        assert f"<td>{label}</td>" in page and esc(HEADLINE_DEFINITIONS[label]) in page, label
    assert "<b>454</b><span>events read</span>" in page  # what the churn CLI printed
    assert "<b>300</b><span>events counted</span>" in page


def test_the_papers_tables_show_in_a_screenshot_with_their_definitions(
    report: Path, tmp_path: Path
) -> None:
    chromium = require_binary("chromium", "apt-get install chromium")
    papers = ("per-move", "siena", "per-device", "latency-by-network", "per-broker")
    # The same page with the other sections hidden, so that the papers' tables are on
    # the screen (a headless screenshot shows the top of the page).
    hide = "section:not(" + "):not(".join(f"#{name}" for name in papers) + "){display:none}"
    page = report.read_text(encoding="utf-8").replace("</style>", hide + "</style>", 1)
    only = tmp_path / "papers.html"
    only.write_text(page, encoding="utf-8")
    shots = {}
    for name, path in (("full", report), ("papers", only)):
        shot = tmp_path / f"{name}.png"
        run = _chromium(
            chromium, tmp_path / f"profile-{name}", f"--screenshot={shot}", path.resolve().as_uri()
        )
        assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
        shots[name] = png.decode(shot.read_bytes())
    width, height, bpp, rows = shots["papers"]
    assert (width, height) == (1280, 2000)
    assert rows != shots["full"][3]  # another picture: the charts are gone
    counts = png.colours(rows, bpp, 0, 1200)
    # White section cards on the page's grey, and their text: the tables and definitions.
    white = counts.get(b"\xff\xff\xff", 0)
    text = sum(n for c, n in counts.items() if sum(c) < 3 * 140)
    assert white > 200_000, white
    assert text > 3_000, text


def test_the_money_saved_shows_beside_the_per_device_money() -> None:
    from analytics.report import render

    tables = _empty_tables()
    tables["summary"] = [{"metric": "events", "value": 10.0}]
    assert "no network decision in this log" in render(tables)
    row = {"decided": 3, "waited": 2, "bytes_moved": 1000, "cost_now": 1.0, "cost_paid": 0.5}
    tables["saved"] = [
        {"uri": "sip:a@x", **row, "saved": 0.5},
        {"uri": "sip:b@x", **row, "cost_now": 0.25, "cost_paid": 0.25, "saved": 0.0},
    ]
    page = render(tables)
    assert "Network decisions against always deliver now" in page
    totals = ["2", "6", "4", "2,000", "1.250000", "0.750000", "0.500000"]
    assert "<td>" + "</td><td>".join(totals) + "</td>" in page
