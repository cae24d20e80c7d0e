"""Acceptance 3: the report renders in headless Chromium, with every chart drawn."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from analytics.errors import InputError
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
    assert page.count('<svg class="chart"') == 6
    assert "churn &lt;test&gt; &amp; co" in page  # titles are escaped


def test_report_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    chromium = require_binary("chromium", "apt-get install chromium")
    url = report.resolve().as_uri()
    dom = _chromium(chromium, tmp_path / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body is not None
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    # The page's own check ran: no script errors, six charts, each with marks and a size.
    assert attrs == {"charts": "6", "drawn": "6", "errors": "0"}, attrs
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
