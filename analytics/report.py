"""``mdeci analytics report``: the churn tables as one self-contained HTML page.

Charts are inline SVG drawn here in Python: no JavaScript library and no CDN (admins
open reports on machines without internet), and the page is one file to mail around.
A few lines of script only check the page once it is loaded (every chart has marks)
and record the result in ``<body data-charts=... data-errors=...>`` for the tests.
The tables are read with pyarrow; no Spark is needed to render a report.
"""

from __future__ import annotations

import html
import json
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
    names = (
        *NEEDED,
        "storms",
        "flapping",
        "recommendations",
        "handover_matrix",
        "networks",
        "sms_spend",
    )
    return {name: _read(directory / name) for name in names}


def load_provenance(directory: Path) -> dict[str, Any]:
    """What ``churn`` read and when it ran (``provenance.json``); empty for older output."""
    path = directory / "provenance.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
    x_label: str = "",
) -> str:
    """A bar chart; ``horizontal`` puts the labels on the left (for long names).

    ``unit`` names the value axis, ``x_label`` the category axis."""
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
        body.append(
            f'<text class="axis-label" x="{WIDTH - 10}" y="{HEIGHT - 2}" text-anchor="end" '
            f'font-size="10" fill="#475569">{_esc(unit)}</text>'
        )
        if x_label:
            body.append(
                f'<text class="axis-label" x="4" y="10" font-size="10" fill="#475569">'
                f"{_esc(x_label)}</text>"
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
    if x_label:
        body.append(
            f'<text class="axis-label" x="{(left + WIDTH) / 2:.0f}" y="{HEIGHT - 6}" '
            f'text-anchor="middle" font-size="10" fill="#475569">{_esc(x_label)}</text>'
        )
    return _svg(body, title)


def _axis_y(left: float, bottom: float, top: float, unit: str) -> str:
    parts = [f'<line x1="{left}" y1="20" x2="{left}" y2="{bottom}" stroke="#94a3b8"/>']
    for frac in (0, 0.5, 1):
        y = bottom - (bottom - 20) * frac
        parts.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{_fmt(top * frac, 2 if top < 10 else 0)}</text>"
        )
    parts.append(
        f'<text class="axis-label" x="4" y="12" font-size="10" fill="#475569">{_esc(unit)}</text>'
    )
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
    height = int(18 + len(days) * ch + 26)
    body.append(
        f'<text class="axis-label" x="{left + 12 * cw:.0f}" y="{height - 4}" '
        f'text-anchor="middle" font-size="10" fill="#475569">hour of day (UTC) · colour: '
        f"{_esc(key.replace('_', ' '))} per hour (max {_fmt(top)})</text>"
        f'<text class="axis-label" x="4" y="12" font-size="10" fill="#475569">day</text>'
    )
    return _svg(body, title, height=max(height, 60))


def _ticks(lo_ms: float, hi_ms: float) -> list[float]:
    """1-2-5 ticks from ``lo_ms`` to ``hi_ms`` (a log axis), the last one at or past it."""
    out: list[float] = []
    decade = 10 ** math.floor(math.log10(lo_ms))
    while True:
        for step in (1, 2, 5):
            t = step * decade
            if t >= lo_ms * 0.999:
                out.append(t)
            if t >= hi_ms:
                return out
        decade *= 10


def cdf_chart(
    buckets: list[dict[str, Any]], title: str, marks: Sequence[tuple[str, float | None]] = ()
) -> str:
    """The restore-latency CDF as steps on a logarithmic time axis.

    The axis runs to the top bucket's upper edge *and* past every percentile in ``marks``
    (p50, p95, p99 of the summary), each drawn as a labelled vertical line, so that the
    tail an admin tunes for is on the chart."""
    rows = sorted(buckets, key=lambda r: r["bucket_lo_ms"])
    if not rows:
        return _empty(title)
    left, bottom, right = 50, HEIGHT - 48, WIDTH - 20
    uppers = [r["bucket_hi_ms"] or r["bucket_lo_ms"] * 2 or 1.0 for r in rows]
    known = [v for _, v in marks if v is not None and not math.isnan(v) and v > 0]
    ticks = _ticks(10.0, max([*uppers, *(v * 1.25 for v in known), 100.0]))
    lo_x, hi_x = math.log10(10.0), math.log10(ticks[-1])

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
    points.append(f"{x(ticks[-1]):.1f},{y(prev):.1f}")
    body = [
        f'<polyline class="mark" fill="none" stroke="{BLUE}" stroke-width="2.5" '
        f'points="{" ".join(points)}"><title>share of restores at or below a latency</title>'
        "</polyline>",
        _axis_y(left, bottom, 1.0, "fraction of restores"),
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#94a3b8"/>',
        f'<text class="axis-label" x="{(left + right) / 2:.0f}" y="{HEIGHT - 6}" '
        'text-anchor="middle" font-size="10" fill="#475569">restore latency '
        "(log scale; ms, s)</text>",
    ]
    for tick in ticks:
        body.append(
            f'<text x="{x(tick):.1f}" y="{bottom + 14}" text-anchor="middle" font-size="9">'
            f"{_duration(tick)}</text>"
        )
    for i, (name, value) in enumerate(marks):
        if value is None or math.isnan(value):
            continue
        body.append(
            f'<line class="pct" x1="{x(value):.1f}" y1="20" x2="{x(value):.1f}" '
            f'y2="{bottom}" stroke="#f97316" stroke-dasharray="4 3"/>'
            f'<text x="{x(value) + 3:.1f}" y="{30 + 12 * i}" font-size="10" fill="#c2410c">'
            f"{_esc(name)} {_duration(value)}</text>"
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
    return bar_chart(
        [label for _, label in DURATION_BINS],
        counts,
        title,
        "episodes",
        x_label="disconnection length",
    )


def transition_graph(transitions: list[dict[str, Any]], title: str, limit: int = 24) -> str:
    """Subnets on a circle, edges as thick as the moves between them (log scale)."""
    # Moves inside one subnet (a new address on the same /24) are edges too: drawn as a
    # loop on the node, not dropped (a one-subnet deployment would show nothing).
    edges = [t for t in transitions if t["transitions"]]
    if not edges:
        return _empty(title)
    weight: dict[str, int] = defaultdict(int)
    for t in edges:
        weight[t["from_subnet"]] += t["transitions"]
        weight[t["to_subnet"]] += t["transitions"]
    nodes = sorted(sorted(weight, key=lambda n: -weight[n])[:limit])
    size = 520
    cx = cy = size / 2
    radius = size / 2 - 90 if len(nodes) > 1 else 0.0
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
        if t["from_subnet"] == t["to_subnet"]:
            ox, oy = (x1 - cx) * 0.25, (y1 - cy) * 0.25
            if abs(ox) + abs(oy) < 1:  # a lone node sits at the centre: loop above it
                oy = -40.0
            body.append(
                f'<path class="mark" d="M {x1:.1f} {y1:.1f} C {x1 + ox - oy:.1f} '
                f'{y1 + oy + ox:.1f} {x1 + ox + oy:.1f} {y1 + oy - ox:.1f} {x1:.1f} {y1:.1f}" '
                f'fill="none" stroke="{BLUE}" stroke-opacity="0.6" stroke-width="{w:.2f}">'
                f"<title>{_esc(t['from_subnet'])} → {_esc(t['to_subnet'])}: "
                f"{t['transitions']} moves by {t['users']} users</title></path>"
            )
            continue
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


def sms_spend(spend: list[dict[str, Any]], title: str, limit: int = 12) -> str:
    """SMS money spent per user and UTC day: the top spenders, one bar per user-day."""
    rows = sorted(spend, key=lambda r: (-(r["sms_cost"] or 0), str(r["day"]), r["uri"]))[:limit]
    return bar_chart(
        [f"{r['uri'].removeprefix('sip:')} {r['day']}" for r in rows],
        [float(r["sms_cost"] or 0) for r in rows],
        title,
        "SMS cost per user per day (operator currency)",
        horizontal=True,
        x_label="user, UTC day",
    )


def handover_matrix(matrix: list[dict[str, Any]], title: str, limit: int = 12) -> str:
    """From-subnet rows, to-subnet columns, colour by handovers; each cell's tooltip has
    the restore p50/p95 after such moves."""
    if not matrix:
        return _empty(title)
    weight: dict[str, int] = defaultdict(int)
    for row in matrix:
        weight[row["from_subnet"]] += row["handovers"]
        weight[row["to_subnet"]] += row["handovers"]
    nets = sorted(sorted(weight, key=lambda n: -weight[n])[:limit])
    cells = {(row["from_subnet"], row["to_subnet"]): row for row in matrix}
    top = max(row["handovers"] for row in matrix) or 1
    left, head = 120, 110
    cw = min(36.0, (WIDTH - left - 10) / len(nets))
    height = int(head + cw * len(nets) + 30)
    body = [
        '<text class="axis-label" x="4" y="12" font-size="10" fill="#475569">'
        "from subnet (rows) → to subnet (columns); colour: handovers</text>"
    ]
    for j, net in enumerate(nets):
        x = left + j * cw + cw / 2
        body.append(
            f'<text x="{x:.1f}" y="{head - 6}" font-size="9" '
            f'transform="rotate(-60 {x:.1f} {head - 6})">{_esc(net)}</text>'
        )
    for i, src in enumerate(nets):
        y = head + i * cw
        body.append(
            f'<text x="{left - 6}" y="{y + cw * 0.65:.1f}" text-anchor="end" font-size="9">'
            f"{_esc(src)}</text>"
        )
        for j, dst in enumerate(nets):
            r = cells.get((src, dst))
            v = r["handovers"] if r else 0
            shade = PALETTE[min(len(PALETTE) - 1, math.ceil(v / top * (len(PALETTE) - 1)))]
            tip = f"{src} → {dst}: {v} handovers" + (
                f", restore p50 {_duration(r['restore_p50_ms'])}, "
                f"p95 {_duration(r['restore_p95_ms'])}"
                if r
                else ""
            )
            body.append(
                f'<rect class="mark" x="{left + j * cw:.1f}" y="{y:.1f}" width="{cw - 1:.1f}" '
                f'height="{cw - 1:.1f}" fill="{shade}" stroke="#e2e8f0"><title>{_esc(tip)}'
                "</title></rect>"
            )
            if v:
                body.append(
                    f'<text x="{left + j * cw + cw / 2:.1f}" y="{y + cw * 0.62:.1f}" '
                    f'text-anchor="middle" font-size="9">{v}</text>'
                )
    return _svg(body, title, height=height)


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#0f172a;
background:#f1f5f9}h1{margin:0 0 4px}h2{font-size:17px;margin:0 0 8px}
.sub{color:#475569;margin-bottom:18px}.cards{display:flex;flex-wrap:wrap;gap:10px;margin-bottom:18px}
.card{background:#fff;border-radius:8px;padding:10px 14px;min-width:120px;
box-shadow:0 1px 2px #0002}
.card b{display:block;font-size:22px}.card span{color:#475569;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(580px,1fr));gap:16px}
section{background:#fff;border-radius:8px;padding:14px;box-shadow:0 1px 2px #0002;
overflow-x:auto}section.wide{grid-column:1/-1}
table{border-collapse:collapse;font-size:13px;width:100%}td,th{text-align:left;padding:3px 8px;
border-bottom:1px solid #e2e8f0}th{color:#475569}svg text{fill:#0f172a}
"""

# Checks the page once loaded, and records what it found for the headless-browser test:
# charts drawn (a size and marks), and every section with content (a mark or a data row).
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
    var names = [], empty = [];
    document.querySelectorAll('section[data-section]').forEach(function (sec) {
      var box = sec.getBoundingClientRect();
      var content = sec.querySelectorAll('svg .mark, tr.row').length;
      names.push(sec.dataset.section);
      if (!(box.height > 0 && content > 0)) empty.push(sec.dataset.section);
    });
    document.body.dataset.charts = String(charts.length);
    document.body.dataset.drawn = String(drawn);
    document.body.dataset.sections = names.join(',');
    document.body.dataset.empty = empty.join(',');
    document.body.dataset.errors = String(errors);
  });
})();
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], none: str = "none") -> str:
    """An HTML table; cells are already escaped text. Data rows are ``tr.row``."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr class='row'>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not rows:
        body = f"<tr><td colspan='{len(headers)}'>{_esc(none)}</td></tr>"
    return f"<table><tr>{head}</tr>{body}</table>"


def _when(ms: float | None) -> str:
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "\u2013"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


SECTIONS = (
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
    "sms-spend",
    "per-user",
    "episodes",
    "recommendations",
    "storms",
)


def render(
    tables: dict[str, list[dict[str, Any]]],
    title: str = "mdeci session churn",
    provenance: dict[str, Any] | None = None,
) -> str:
    """The HTML page for ``tables`` (as :func:`load_tables` returns them)."""
    summary = {r["metric"]: r["value"] for r in tables["summary"]}
    users = tables["per_user"]
    top = sorted(users, key=lambda r: (-(r["churn_score"] or 0), r["uri"]))[:15]
    s = summary.get
    prov = provenance or {}
    disconnected_ms = sum(float(r["disconnected_ms"] or 0) for r in users)
    p50, p95, p99 = s("restore_p50_ms"), s("restore_p95_ms"), s("restore_p99_ms")

    cards = [
        ("users", _fmt(s("users"))),
        ("events", _fmt(s("events_in_window"))),
        ("address changes", _fmt(s("address_changes"))),
        ("handovers", _fmt(s("handovers"))),
        ("disconnections", _fmt(s("disconnections"))),
        ("time disconnected", _duration(disconnected_ms) if users else "\u2013"),
        ("restore p50", _duration(p50)),
        ("restore p95", _duration(p95)),
        ("restore p99", _duration(p99)),
        ("notifications dropped", _fmt(s("notify_dropped"))),
        ("SMS sent", _fmt(s("sms_count"))),
        ("SMS spend", _fmt(s("sms_cost"), 2)),
        ("reconnect storms", _fmt(s("storms"))),
        ("flapping bursts", _fmt(s("flaps"))),
        ("invalid lines", _fmt(s("invalid_lines"))),
    ]
    queued, delivered, dropped = s("notify_queued"), s("notify_delivered"), s("notify_dropped")
    delivery_rows = [
        ["queued", _fmt(queued), "notifications the broker accepted for a subscriber"],
        [
            "delivered",
            _fmt(delivered),
            "acknowledged by the device (the broker's ack; IP or SMS)"
            + (f" · {100 * (delivered or 0) / queued:.1f} % of queued" if queued else ""),
        ],
        ["dropped", _fmt(dropped), "lost: queue full, TTL ended, unsendable"],
        [
            "SMS sent",
            _fmt(s("sms_count")),
            "urgent ones sent by SMS while IP was down",
        ],
    ]
    delivery_chart = bar_chart(
        ["queued", "delivered", "dropped", "SMS sent"],
        [
            float(queued or 0),
            float(delivered or 0),
            float(dropped or 0),
            float(s("sms_count") or 0),
        ],
        "delivery health",
        "notifications",
        x_label="outcome",
    )
    nets = tables.get("networks", [])
    net_rows = [
        [
            _esc(r["subnet"]),
            _fmt(r["disconnections"]),
            _fmt(r["users_disconnected"]),
            _fmt(r["restores"]),
            _duration(r["restore_p50_ms"]),
            _duration(r["restore_p95_ms"]),
        ]
        for r in nets[:20]
    ]
    net_chart = bar_chart(
        [r["subnet"] for r in nets[:12]],
        [float(r["disconnections"]) for r in nets[:12]],
        "disconnections per network",
        "disconnections that began on the network",
        horizontal=True,
        x_label="subnet",
    )
    user_rows = [
        [
            _esc(r["uri"]),
            _fmt(r["events"]),
            _fmt(r["address_changes"]),
            _fmt(r["handovers"]),
            _fmt(r["disconnections"]),
            _duration(r["disconnected_ms"]) if r["disconnected_ms"] else "0",
            _duration(r["restore_p50_ms"]),
            _duration(r["restore_p95_ms"]),
            _fmt(r["notify_queued"]),
            _fmt(r["notify_delivered"]),
            _fmt(r["notify_dropped"]),
            _fmt(r["sms_count"]),
            _fmt(r["sms_cost"], 2),
            _fmt(r["churn_score"], 1),
        ]
        for r in sorted(users, key=lambda r: (-(r["churn_score"] or 0), r["uri"]))[:50]
    ]
    eps = sorted(tables["episodes"], key=lambda r: (-(r["duration_ms"] or 0), r["uri"]))[:50]
    episode_rows = [
        [
            _esc(r["uri"]),
            _when(r["start_ms"]),
            _when(r["end_ms"]) if r["end_ms"] is not None else "still open",
            _duration(r["duration_ms"]),
        ]
        for r in eps
    ]
    recs = [
        [_esc(r["setting"]), f"<b>{_fmt(r['value'])}</b> {_esc(r['unit'])}", _esc(r["basis"])]
        for r in tables["recommendations"]
    ]
    storms = [
        [
            ts_ms(r["start_ms"]),
            _duration(r["end_ms"] - r["start_ms"]),
            _fmt(r["users"]),
            _fmt(r["reconnects"]),
        ]
        for r in sorted(tables["storms"], key=lambda r: -r["users"])[:10]
    ]
    flaps = [
        [
            _esc(r["uri"]),
            ts_ms(r["start_ms"]),
            _duration(r["end_ms"] - r["start_ms"]),
            _fmt(r["changes"]),
        ]
        for r in sorted(tables["flapping"], key=lambda r: -r["changes"])[:10]
    ]
    inputs = prov.get("inputs") or []
    shown_inputs = ", ".join(_esc(Path(str(i)).name) for i in inputs[:8])
    if len(inputs) > 8:
        shown_inputs += f" and {len(inputs) - 8} more"
    prov_rows = [
        ["generated at", _esc(prov.get("generated_at", "\u2013"))],
        ["time range", f"{_when(s('first_ts_ms'))} to {_when(s('last_ts_ms'))}"],
        [
            "window",
            f"{_when(s('since_ms'))} to {_when(s('until_ms'))}"
            if s("since_ms") is not None or s("until_ms") is not None
            else "the whole log",
        ],
        [
            "inputs",
            f"{len(inputs)} {_esc(prov.get('input_format', ''))} file(s): {shown_inputs}"
            if inputs
            else "\u2013",
        ],
        [
            "lines",
            f"{_fmt(s('lines'))} read, {_fmt(s('invalid_lines'))} invalid, "
            f"{_fmt(s('duplicates_dropped'))} duplicates, {_fmt(s('other_role_copies'))} "
            "copies of the other role not counted",
        ],
        ["engine", _esc(f"Spark {prov.get('spark', '?')} on {prov.get('master', '?')}")],
    ]

    def section(name: str, heading: str, body: str, wide: bool = False) -> str:
        cls = " class='wide'" if wide else ""
        return f"<section data-section='{name}'{cls}><h2>{_esc(heading)}</h2>{body}</section>"

    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f"<div class='sub'>{_when(s('first_ts_ms'))} to {_when(s('last_ts_ms'))} · "
        f"generated {_esc(prov.get('generated_at', '?'))}</div>",
        "<div class='grid'>",
        section("provenance", "Provenance", _table(["", ""], prov_rows)),
        section(
            "headline",
            "Headline",
            "<div class='cards'>"
            + "".join(
                f"<div class='card mark-card'><b>{v}</b><span>{_esc(k)}</span></div>"
                for k, v in cards
            )
            + "</div>"
            + _table(["metric", "value"], [[_esc(k), v] for k, v in cards[:4]]),
        ),
        section(
            "delivery",
            "Delivery health",
            delivery_chart + _table(["outcome", "count", "meaning"], delivery_rows),
        ),
        section(
            "handovers-per-hour",
            "Handovers per hour (UTC)",
            heatmap(tables["per_hour"], "handovers", "handovers per hour"),
        ),
        section(
            "restore-cdf",
            "Restore latency (CDF)",
            cdf_chart(
                tables["restore_latency"],
                "restore latency CDF",
                (("p50", p50), ("p95", p95), ("p99", p99)),
            ),
        ),
        section(
            "durations",
            "Disconnection durations",
            duration_histogram(tables["episodes"], "disconnection durations"),
        ),
        section(
            "churners",
            "Top churners (churn score)",
            bar_chart(
                [r["uri"].removeprefix("sip:") for r in top],
                [float(r["churn_score"] or 0) for r in top],
                "top churners",
                "churn score (points)",
                horizontal=True,
                x_label="user",
            ),
        ),
        section(
            "mobility",
            "Mobility graph (subnet to subnet)",
            transition_graph(tables["transitions"], "mobility graph"),
        ),
        section(
            "handover-matrix",
            "Handover matrix by subnet",
            handover_matrix(tables.get("handover_matrix", []), "handover matrix"),
        ),
        section(
            "networks",
            "Disconnections and restore latency per network",
            net_chart
            + _table(
                ["subnet", "disconnections", "users", "restores", "restore p50", "restore p95"],
                net_rows,
            ),
        ),
        section(
            "sms-spend",
            "SMS spend per user per day",
            sms_spend(tables.get("sms_spend", []), "SMS spend"),
        ),
        section(
            "per-user",
            "Per user (top 50 by churn score)",
            _table(
                [
                    "user",
                    "events",
                    "address changes",
                    "handovers",
                    "disconnections",
                    "time disconnected",
                    "restore p50",
                    "restore p95",
                    "queued",
                    "delivered",
                    "dropped",
                    "SMS",
                    "SMS cost",
                    "churn score",
                ],
                user_rows,
            ),
            wide=True,
        ),
        section(
            "episodes",
            "Disconnection episodes (longest 50)",
            _table(["user", "start", "end", "length (in the window)"], episode_rows),
            wide=True,
        ),
        section(
            "recommendations",
            "Recommendations",
            _table(["setting", "value", "why"], recs),
        ),
        section(
            "storms",
            "Reconnect storms and flapping",
            _table(["start", "length", "users", "reconnects"], storms, "no reconnect storm")
            + "<h2 style='margin-top:14px'>Flapping</h2>"
            + _table(["user", "start", "length", "changes"], flaps, "no flapping"),
        ),
        "</div>",
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
    page = render(load_tables(directory), title, load_provenance(directory))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")
    return output
