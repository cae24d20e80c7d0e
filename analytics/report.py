"""``mdeci analytics report``: the churn tables as one self-contained HTML page.

Charts are inline SVG drawn here in Python: no JavaScript library and no CDN (admins
open reports on machines without internet), and the page is one file to mail around.
A few lines of script only check the page once it is loaded (every chart has marks)
and record the result in ``<body data-charts=... data-errors=...>`` for the tests.
The tables are read with pyarrow; no Spark is needed to render a report.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analytics.errors import InputError

WIDTH = 560
HEIGHT = 280
BLUE = "#2563eb"
PALETTE = ("#f8fafc", "#dbeafe", "#93c5fd", "#3b82f6", "#1d4ed8", "#1e3a8a")
NEEDED = ("summary", "per_user", "per_hour", "episodes", "transitions", "restore_latency")


def _read(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    if not path.exists():
        return []
    return list(pq.read_table(path).to_pylist())


def load_tables(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """Every table ``churn`` wrote under ``directory``, as lists of row dicts.

    Raises:
        InputError: if ``directory`` is not the output of ``mdeci analytics churn``.
    """
    if not directory.is_dir():
        raise InputError(f"{directory} is not a directory (give the output of 'churn')")
    missing = [name for name in NEEDED if not (directory / name).exists()]
    if missing:
        raise InputError(
            f"{directory} is not the output of 'mdeci analytics churn' (no {', '.join(missing)})"
        )
    names = (*NEEDED, "storms", "flapping", "recommendations")
    return {name: _read(directory / name) for name in names}


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2013"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _duration(ms: float | None) -> str:
    # NaN is what a percentile of no restores gives: show "no data", not "nan h".
    if ms is None or math.isnan(ms):
        return "\u2013"
    s = ms / 1000
    if s < 1:
        return f"{ms:.0f} ms"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _svg(body: list[str], title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{_esc(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect class="bg" width="{width}" height="{height}" fill="#fff"/>'
        + "".join(body)
        + "</svg>"
    )


def _empty(title: str) -> str:
    return _svg(
        [
            f'<text class="mark" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
            'fill="#64748b">no data in this window</text>'
        ],
        title,
    )


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    title: str,
    unit: str = "",
    horizontal: bool = False,
) -> str:
    """A bar chart; ``horizontal`` puts the labels on the left (for long names)."""
    if not values or max(values) <= 0:
        return _empty(title)
    top = max(values)
    body: list[str] = []
    if horizontal:
        left, row = 210, (HEIGHT - 20) / len(values)
        for i, (label, v) in enumerate(zip(labels, values, strict=True)):
            y = 10 + i * row
            w = (WIDTH - left - 70) * v / top
            body.append(
                f'<text x="{left - 6}" y="{y + row * 0.7:.1f}" text-anchor="end" '
                f'font-size="11">{_esc(label)}</text>'
                f'<rect class="mark" x="{left}" y="{y + 2:.1f}" width="{max(w, 1):.1f}" '
                f'height="{row - 4:.1f}" fill="{BLUE}"><title>{_esc(label)}: '
                f"{_fmt(v, 2)} {_esc(unit)}</title></rect>"
                f'<text x="{left + w + 4:.1f}" y="{y + row * 0.7:.1f}" font-size="11">'
                f"{_fmt(v, 1)}</text>"
            )
        return _svg(body, title)
    left, bottom = 50, HEIGHT - 40
    col = (WIDTH - left - 10) / len(values)
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        h = (bottom - 20) * v / top
        x = left + i * col
        body.append(
            f'<rect class="mark" x="{x + 2:.1f}" y="{bottom - h:.1f}" '
            f'width="{max(col - 4, 1):.1f}" '
            f'height="{max(h, 0.5):.1f}" fill="{BLUE}"><title>{_esc(label)}: {_fmt(v, 2)} '
            f"{_esc(unit)}</title></rect>"
        )
        if len(values) <= 16 or i % math.ceil(len(values) / 16) == 0:
            body.append(
                f'<text x="{x + col / 2:.1f}" y="{bottom + 14}" text-anchor="middle" '
                f'font-size="10">{_esc(label)}</text>'
            )
    body.append(_axis_y(left, bottom, top, unit))
    return _svg(body, title)


def _axis_y(left: float, bottom: float, top: float, unit: str) -> str:
    parts = [f'<line x1="{left}" y1="20" x2="{left}" y2="{bottom}" stroke="#94a3b8"/>']
    for frac in (0, 0.5, 1):
        y = bottom - (bottom - 20) * frac
        parts.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{_fmt(top * frac, 2 if top < 10 else 0)}</text>"
        )
    parts.append(f'<text x="4" y="12" font-size="10" fill="#475569">{_esc(unit)}</text>')
    return "".join(parts)


def heatmap(per_hour: list[dict[str, Any]], key: str, title: str) -> str:
    """Days down, hours of the day (UTC) across, colour by ``key``."""
    cells: dict[tuple[str, int], float] = defaultdict(float)
    for r in per_hour:
        hour: datetime = r["hour"]
        if hour.tzinfo is None:
            hour = hour.replace(tzinfo=UTC)
        cells[(hour.strftime("%a %d %b"), hour.hour)] += float(r[key] or 0)
    if not cells:
        return _empty(title)
    days = sorted({d for d, _ in cells}, key=lambda d: datetime.strptime(d, "%a %d %b"))
    # Sort by the real date, not the label: labels carry no year, so order by first sight.
    order = {
        d: i
        for i, d in enumerate(
            dict.fromkeys(
                r["hour"].strftime("%a %d %b") for r in sorted(per_hour, key=lambda r: r["hour"])
            )
        )
    }
    days = sorted(days, key=lambda d: order[d])
    top = max(cells.values()) or 1.0
    left, cw = 90, (WIDTH - 100) / 24
    ch = min(22.0, (HEIGHT - 40) / max(len(days), 1))
    body = [
        f'<text x="{left + h * cw + cw / 2:.1f}" y="12" text-anchor="middle" '
        f'font-size="9">{h}</text>'
        for h in range(0, 24, 2)
    ]
    for i, day in enumerate(days):
        y = 18 + i * ch
        body.append(
            f'<text x="{left - 6}" y="{y + ch * 0.7:.1f}" text-anchor="end" '
            f'font-size="10">{_esc(day)}</text>'
        )
        for h in range(24):
            v = cells.get((day, h), 0.0)
            shade = PALETTE[min(len(PALETTE) - 1, math.ceil(v / top * (len(PALETTE) - 1)))]
            body.append(
                f'<rect class="mark" x="{left + h * cw:.1f}" y="{y:.1f}" width="{cw - 1:.1f}" '
                f'height="{ch - 1:.1f}" fill="{shade}"><title>{_esc(day)} {h:02d}:00 UTC: '
                f"{_fmt(v)}</title></rect>"
            )
    height = int(18 + len(days) * ch + 10)
    return _svg(body, title, height=max(height, 60))


def cdf_chart(buckets: list[dict[str, Any]], title: str) -> str:
    """The restore-latency CDF as steps on a logarithmic time axis."""
    rows = sorted(buckets, key=lambda r: r["bucket_lo_ms"])
    if not rows:
        return _empty(title)
    left, bottom, right = 50, HEIGHT - 40, WIDTH - 20
    uppers = [r["bucket_hi_ms"] or r["bucket_lo_ms"] * 2 or 1.0 for r in rows]
    lo_x, hi_x = math.log10(10.0), math.log10(max(max(uppers), 100.0))

    def x(ms: float) -> float:
        v = math.log10(max(ms, 10.0))
        return left + (right - left) * (v - lo_x) / (hi_x - lo_x)

    def y(f: float) -> float:
        return bottom - (bottom - 20) * f

    points = [f"{x(10.0):.1f},{y(0):.1f}"]
    prev = 0.0
    for r, upper in zip(rows, uppers, strict=True):
        points.append(f"{x(upper):.1f},{y(prev):.1f}")
        prev = float(r["cumulative_fraction"])
        points.append(f"{x(upper):.1f},{y(prev):.1f}")
    body = [
        f'<polyline class="mark" fill="none" stroke="{BLUE}" stroke-width="2.5" '
        f'points="{" ".join(points)}"><title>share of restores at or below a latency</title>'
        "</polyline>",
        _axis_y(left, bottom, 1.0, "fraction of restores"),
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#94a3b8"/>',
    ]
    tick = 10.0
    while tick <= 10**hi_x * 1.01:
        body.append(
            f'<text x="{x(tick):.1f}" y="{bottom + 14}" text-anchor="middle" font-size="10">'
            f"{_duration(tick)}</text>"
        )
        tick *= 10
    for q in (0.5, 0.95):
        body.append(
            f'<line x1="{left}" y1="{y(q):.1f}" x2="{right}" y2="{y(q):.1f}" '
            'stroke="#cbd5e1" stroke-dasharray="4 3"/>'
        )
    return _svg(body, title)


DURATION_BINS: tuple[tuple[float, str], ...] = (
    (1_000, "<1 s"),
    (10_000, "1\u201310 s"),
    (30_000, "10\u201330 s"),
    (60_000, "30 s\u20131 min"),
    (300_000, "1\u20135 min"),
    (900_000, "5\u201315 min"),
    (3_600_000, "15\u201360 min"),
    (14_400_000, "1\u20134 h"),
    (math.inf, ">4 h"),
)


def duration_histogram(episodes: list[dict[str, Any]], title: str) -> str:
    """How long disconnections lasted, in bins a human reads."""
    counts = [0] * len(DURATION_BINS)
    for e in episodes:
        d = float(e["duration_ms"] or 0)
        i = next(i for i, (hi, _) in enumerate(DURATION_BINS) if d < hi)
        counts[i] += 1
    return bar_chart([label for _, label in DURATION_BINS], counts, title, "episodes")


def transition_graph(transitions: list[dict[str, Any]], title: str, limit: int = 24) -> str:
    """Subnets on a circle, edges as thick as the moves between them (log scale)."""
    edges = [t for t in transitions if t["from_subnet"] != t["to_subnet"]]
    if not edges:
        return _empty(title)
    weight: dict[str, int] = defaultdict(int)
    for t in edges:
        weight[t["from_subnet"]] += t["transitions"]
        weight[t["to_subnet"]] += t["transitions"]
    nodes = sorted(sorted(weight, key=lambda n: -weight[n])[:limit])
    size = 520
    cx = cy = size / 2
    radius = size / 2 - 90
    pos = {
        n: (
            cx + radius * math.cos(2 * math.pi * i / len(nodes)),
            cy + radius * math.sin(2 * math.pi * i / len(nodes)),
        )
        for i, n in enumerate(nodes)
    }
    shown = sorted(
        (t for t in edges if t["from_subnet"] in pos and t["to_subnet"] in pos),
        key=lambda t: -t["transitions"],
    )[:80]
    top = max(t["transitions"] for t in shown) if shown else 1
    body: list[str] = []
    for t in reversed(shown):
        (x1, y1), (x2, y2) = pos[t["from_subnet"]], pos[t["to_subnet"]]
        w = 0.5 + 5 * math.log1p(t["transitions"]) / math.log1p(top)
        body.append(
            f'<line class="mark" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{BLUE}" stroke-opacity="0.45" stroke-width="{w:.2f}">'
            f"<title>{_esc(t['from_subnet'])} → {_esc(t['to_subnet'])}: "
            f"{t['transitions']} moves by {t['users']} users</title></line>"
        )
    top_w = max(weight[n] for n in nodes)
    for n in nodes:
        x, y = pos[n]
        r = 4 + 8 * math.sqrt(weight[n] / top_w)
        anchor = "start" if x >= cx else "end"
        dx = 12 if x >= cx else -12
        body.append(
            f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="#f97316">'
            f"<title>{_esc(n)}: {weight[n]} moves in or out</title></circle>"
            f'<text x="{x + dx:.1f}" y="{y + 4:.1f}" text-anchor="{anchor}" font-size="10">'
            f"{_esc(n)}</text>"
        )
    return _svg(body, title, width=size, height=size)


def sms_spend(per_hour: list[dict[str, Any]], title: str) -> str:
    """SMS money spent per day."""
    by_day: dict[str, float] = defaultdict(float)
    for r in sorted(per_hour, key=lambda r: r["hour"]):
        by_day[r["hour"].strftime("%d %b")] += float(r["sms_cost"] or 0)
    return bar_chart(list(by_day), list(by_day.values()), title, "cost per day")


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#0f172a;
background:#f1f5f9}h1{margin:0 0 4px}h2{font-size:17px;margin:0 0 8px}
.sub{color:#475569;margin-bottom:18px}.cards{display:flex;flex-wrap:wrap;gap:10px;margin-bottom:18px}
.card{background:#fff;border-radius:8px;padding:10px 14px;min-width:120px;
box-shadow:0 1px 2px #0002}
.card b{display:block;font-size:22px}.card span{color:#475569;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(580px,1fr));gap:16px}
section{background:#fff;border-radius:8px;padding:14px;box-shadow:0 1px 2px #0002}
table{border-collapse:collapse;font-size:13px;width:100%}td,th{text-align:left;padding:3px 8px;
border-bottom:1px solid #e2e8f0}th{color:#475569}svg text{fill:#0f172a}
"""

# Checks the page once loaded, and records what it found for the headless-browser test.
_SCRIPT = """
(function () {
  var errors = 0;
  window.addEventListener('error', function () {
    errors += 1; document.body.dataset.errors = String(errors);
  });
  window.addEventListener('load', function () {
    var charts = document.querySelectorAll('svg.chart');
    var drawn = 0;
    charts.forEach(function (svg) {
      var box = svg.getBoundingClientRect();
      if (box.width > 0 && box.height > 0 && svg.querySelectorAll('.mark').length > 0) drawn += 1;
    });
    document.body.dataset.charts = String(charts.length);
    document.body.dataset.drawn = String(drawn);
    document.body.dataset.errors = String(errors);
  });
})();
"""


def render(tables: dict[str, list[dict[str, Any]]], title: str = "mdeci session churn") -> str:
    """The HTML page for ``tables`` (as :func:`load_tables` returns them)."""
    summary = {r["metric"]: r["value"] for r in tables["summary"]}
    users = tables["per_user"]
    top = sorted(users, key=lambda r: (-(r["churn_score"] or 0), r["uri"]))[:15]
    s = summary.get

    def ts(key: str) -> str:
        v = s(key)
        if v is None or math.isnan(v):
            return "\u2013"
        return datetime.fromtimestamp(v / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")

    cards = [
        ("users", _fmt(s("users"))),
        ("events", _fmt(s("events_in_window"))),
        ("address changes", _fmt(s("address_changes"))),
        ("handovers", _fmt(s("handovers"))),
        ("disconnections", _fmt(s("disconnections"))),
        ("hours disconnected", _fmt(s("disconnected_hours"), 1)),
        ("restore p50", _duration(s("restore_p50_ms"))),
        ("restore p95", _duration(s("restore_p95_ms"))),
        ("restore p99", _duration(s("restore_p99_ms"))),
        ("notifications dropped", _fmt(s("notify_dropped"))),
        ("SMS sent", _fmt(s("sms_count"))),
        ("SMS spend", _fmt(s("sms_cost"), 2)),
        ("reconnect storms", _fmt(s("storms"))),
        ("flapping bursts", _fmt(s("flaps"))),
        ("invalid lines", _fmt(s("invalid_lines"))),
    ]
    charts = [
        (
            "Handovers per hour (UTC)",
            heatmap(tables["per_hour"], "handovers", "handovers per hour"),
        ),
        ("Restore latency (CDF)", cdf_chart(tables["restore_latency"], "restore latency CDF")),
        (
            "Disconnection durations",
            duration_histogram(tables["episodes"], "disconnection durations"),
        ),
        (
            "Top churners (churn score)",
            bar_chart(
                [r["uri"].removeprefix("sip:") for r in top],
                [float(r["churn_score"] or 0) for r in top],
                "top churners",
                "score",
                horizontal=True,
            ),
        ),
        (
            "Mobility graph (subnet to subnet)",
            transition_graph(tables["transitions"], "mobility graph"),
        ),
        ("SMS spend per day", sms_spend(tables["per_hour"], "SMS spend")),
    ]
    recs = "".join(
        f"<tr><td>{_esc(r['setting'])}</td><td><b>{_fmt(r['value'])}</b> {_esc(r['unit'])}</td>"
        f"<td>{_esc(r['basis'])}</td></tr>"
        for r in tables["recommendations"]
    )
    storms = "".join(
        f"<tr><td>{ts_ms(r['start_ms'])}</td><td>{_duration(r['end_ms'] - r['start_ms'])}</td>"
        f"<td>{r['users']}</td><td>{r['reconnects']}</td></tr>"
        for r in sorted(tables["storms"], key=lambda r: -r["users"])[:10]
    )
    flaps = "".join(
        f"<tr><td>{_esc(r['uri'])}</td><td>{ts_ms(r['start_ms'])}</td>"
        f"<td>{_duration(r['end_ms'] - r['start_ms'])}</td><td>{r['changes']}</td></tr>"
        for r in sorted(tables["flapping"], key=lambda r: -r["changes"])[:10]
    )
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f"<div class='sub'>{ts('first_ts_ms')} to {ts('last_ts_ms')} · "
        f"{_fmt(s('lines'))} lines read, {_fmt(s('duplicates_dropped'))} duplicates dropped</div>",
        "<div class='cards'>",
        *[f"<div class='card'><b>{v}</b><span>{_esc(k)}</span></div>" for k, v in cards],
        "</div><div class='grid'>",
        *[f"<section><h2>{_esc(h)}</h2>{svg}</section>" for h, svg in charts],
        "<section><h2>Recommendations</h2><table><tr><th>setting</th><th>value</th>"
        f"<th>why</th></tr>{recs}</table></section>",
        "<section><h2>Reconnect storms</h2><table><tr><th>start</th><th>length</th>"
        f"<th>users</th><th>reconnects</th></tr>{storms or '<tr><td>none</td></tr>'}</table>"
        "<h2 style='margin-top:14px'>Flapping</h2><table><tr><th>user</th><th>start</th>"
        f"<th>length</th><th>changes</th></tr>{flaps or '<tr><td>none</td></tr>'}</table>"
        "</section></div>",
        f"<script>{_SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts)


def ts_ms(value: int) -> str:
    """Epoch milliseconds as a short UTC time."""
    return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def write_report(directory: Path, output: Path, *, title: str = "mdeci session churn") -> Path:
    """Render the tables under ``directory`` into the HTML file ``output``.

    Raises:
        InputError: if ``directory`` is not the output of ``churn``.
        OSError: if ``output`` cannot be written.
    """
    page = render(load_tables(directory), title)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")
    return output
