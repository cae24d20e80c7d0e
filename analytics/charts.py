"""The report's charts: inline SVG drawn in Python, and the cell formatters they share.

No JavaScript library and no CDN: admins open reports on machines without internet, and
the page is one file to mail around. Every drawn element a reader should see has the
class ``mark``, which the page's own check counts.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

WIDTH = 560
HEIGHT = 280
BLUE = "#2563eb"
PALETTE = ("#f8fafc", "#dbeafe", "#93c5fd", "#3b82f6", "#1d4ed8", "#1e3a8a")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2013"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def duration(ms: float | None) -> str:
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


def svg(body: list[str], title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{esc(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect class="bg" width="{width}" height="{height}" fill="#fff"/>'
        + "".join(body)
        + "</svg>"
    )


def empty(title: str) -> str:
    return svg(
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
        return empty(title)
    top = max(values)
    body: list[str] = []
    if horizontal:
        left, row = 210, (HEIGHT - 20) / len(values)
        for i, (label, v) in enumerate(zip(labels, values, strict=True)):
            y = 10 + i * row
            w = (WIDTH - left - 70) * v / top
            body.append(
                f'<text x="{left - 6}" y="{y + row * 0.7:.1f}" text-anchor="end" '
                f'font-size="11">{esc(label)}</text>'
                f'<rect class="mark" x="{left}" y="{y + 2:.1f}" width="{max(w, 1):.1f}" '
                f'height="{row - 4:.1f}" fill="{BLUE}"><title>{esc(label)}: '
                f"{fmt(v, 2)} {esc(unit)}</title></rect>"
                f'<text x="{left + w + 4:.1f}" y="{y + row * 0.7:.1f}" font-size="11">'
                f"{fmt(v, 1)}</text>"
            )
        body.append(
            f'<text class="axis-label" x="{WIDTH - 10}" y="{HEIGHT - 2}" text-anchor="end" '
            f'font-size="10" fill="#475569">{esc(unit)}</text>'
        )
        if x_label:
            body.append(
                f'<text class="axis-label" x="4" y="10" font-size="10" fill="#475569">'
                f"{esc(x_label)}</text>"
            )
        return svg(body, title)
    left, bottom = 50, HEIGHT - 40
    col = (WIDTH - left - 10) / len(values)
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        h = (bottom - 20) * v / top
        x = left + i * col
        body.append(
            f'<rect class="mark" x="{x + 2:.1f}" y="{bottom - h:.1f}" '
            f'width="{max(col - 4, 1):.1f}" '
            f'height="{max(h, 0.5):.1f}" fill="{BLUE}"><title>{esc(label)}: {fmt(v, 2)} '
            f"{esc(unit)}</title></rect>"
        )
        if len(values) <= 16 or i % math.ceil(len(values) / 16) == 0:
            body.append(
                f'<text x="{x + col / 2:.1f}" y="{bottom + 14}" text-anchor="middle" '
                f'font-size="10">{esc(label)}</text>'
            )
    body.append(axis_y(left, bottom, top, unit))
    if x_label:
        body.append(
            f'<text class="axis-label" x="{(left + WIDTH) / 2:.0f}" y="{HEIGHT - 6}" '
            f'text-anchor="middle" font-size="10" fill="#475569">{esc(x_label)}</text>'
        )
    return svg(body, title)


def axis_y(left: float, bottom: float, top: float, unit: str) -> str:
    parts = [f'<line x1="{left}" y1="20" x2="{left}" y2="{bottom}" stroke="#94a3b8"/>']
    for frac in (0, 0.5, 1):
        y = bottom - (bottom - 20) * frac
        parts.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{fmt(top * frac, 2 if top < 10 else 0)}</text>"
        )
    parts.append(
        f'<text class="axis-label" x="4" y="12" font-size="10" fill="#475569">{esc(unit)}</text>'
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
        return empty(title)
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
            f'font-size="10">{esc(day)}</text>'
        )
        for h in range(24):
            v = cells.get((day, h), 0.0)
            shade = PALETTE[min(len(PALETTE) - 1, math.ceil(v / top * (len(PALETTE) - 1)))]
            body.append(
                f'<rect class="mark" x="{left + h * cw:.1f}" y="{y:.1f}" width="{cw - 1:.1f}" '
                f'height="{ch - 1:.1f}" fill="{shade}"><title>{esc(day)} {h:02d}:00 UTC: '
                f"{fmt(v)}</title></rect>"
            )
    height = int(18 + len(days) * ch + 26)
    body.append(
        f'<text class="axis-label" x="{left + 12 * cw:.0f}" y="{height - 4}" '
        f'text-anchor="middle" font-size="10" fill="#475569">hour of day (UTC) · colour: '
        f"{esc(key.replace('_', ' '))} per hour (max {fmt(top)})</text>"
        f'<text class="axis-label" x="4" y="12" font-size="10" fill="#475569">day</text>'
    )
    return svg(body, title, height=max(height, 60))


def log_ticks(lo_ms: float, hi_ms: float) -> list[float]:
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


def percentile_fraction(name: str) -> float | None:
    """0.95 for ``p95``; None for a name that is no percentile."""
    digits = name[1:]
    return int(digits) / 100 if name.startswith("p") and digits.isdigit() else None


def cdf_chart(
    buckets: list[dict[str, Any]], title: str, marks: Sequence[tuple[str, float | None]] = ()
) -> str:
    """The restore-latency CDF on a logarithmic time axis.

    The axis runs to the top bucket's upper edge *and* past every percentile in ``marks``
    (named ``pNN``: p50, p95, p99 of the summary), each drawn as a labelled vertical line,
    so that the tail an admin tunes for is on the chart. The histogram says only how many
    restores fall inside a bucket, so the curve rises across each bucket, from the share
    below its lower edge to the share below its upper edge, and passes through each
    exact percentile: it crosses every marker's line at the marker's own fraction."""
    rows = sorted(buckets, key=lambda r: r["bucket_lo_ms"])
    if not rows:
        return empty(title)
    left, bottom, right = 50, HEIGHT - 48, WIDTH - 20
    uppers = [r["bucket_hi_ms"] or r["bucket_lo_ms"] * 2 or 1.0 for r in rows]
    known = [v for _, v in marks if v is not None and not math.isnan(v) and v > 0]
    ticks = log_ticks(10.0, max([*uppers, *(v * 1.25 for v in known), 100.0]))
    lo_x, hi_x = math.log10(10.0), math.log10(ticks[-1])

    def x(ms: float) -> float:
        v = math.log10(max(ms, 10.0))
        return left + (right - left) * (v - lo_x) / (hi_x - lo_x)

    def y(f: float) -> float:
        return bottom - (bottom - 20) * f

    curve = [(10.0, 0.0)]
    prev = 0.0
    for r, upper in zip(rows, uppers, strict=True):
        curve.append((max(float(r["bucket_lo_ms"]), 10.0), prev))
        prev = float(r["cumulative_fraction"])
        curve.append((upper, prev))
    for name, value in marks:
        q = percentile_fraction(name)
        if q is not None and value is not None and not math.isnan(value):
            curve.append((value, q))
    curve.append((ticks[-1], prev))
    points = []
    top = 0.0
    for ms, fraction in sorted(curve):
        top = max(top, fraction)  # a CDF never falls
        points.append(f"{x(ms):.1f},{y(top):.1f}")
    body = [
        f'<polyline class="mark" fill="none" stroke="{BLUE}" stroke-width="2.5" '
        f'points="{" ".join(points)}"><title>share of restores at or below a latency</title>'
        "</polyline>",
        axis_y(left, bottom, 1.0, "fraction of restores"),
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#94a3b8"/>',
        f'<text class="axis-label" x="{(left + right) / 2:.0f}" y="{HEIGHT - 6}" '
        'text-anchor="middle" font-size="10" fill="#475569">restore latency '
        "(log scale; ms, s)</text>",
    ]
    for tick in ticks:
        body.append(
            f'<text x="{x(tick):.1f}" y="{bottom + 14}" text-anchor="middle" font-size="9">'
            f"{duration(tick)}</text>"
        )
    for i, (name, value) in enumerate(marks):
        if value is None or math.isnan(value):
            continue
        body.append(
            f'<line class="pct" x1="{x(value):.1f}" y1="20" x2="{x(value):.1f}" '
            f'y2="{bottom}" stroke="#f97316" stroke-dasharray="4 3"/>'
            f'<text x="{x(value) + 3:.1f}" y="{30 + 12 * i}" font-size="10" fill="#c2410c">'
            f"{esc(name)} {duration(value)}</text>"
        )
    return svg(body, title)


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
        return empty(title)
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
                f"<title>{esc(t['from_subnet'])} → {esc(t['to_subnet'])}: "
                f"{t['transitions']} moves by {t['users']} users</title></path>"
            )
            continue
        body.append(
            f'<line class="mark" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{BLUE}" stroke-opacity="0.45" stroke-width="{w:.2f}">'
            f"<title>{esc(t['from_subnet'])} → {esc(t['to_subnet'])}: "
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
            f"<title>{esc(n)}: {weight[n]} moves in or out</title></circle>"
            f'<text x="{x + dx:.1f}" y="{y + 4:.1f}" text-anchor="{anchor}" font-size="10">'
            f"{esc(n)}</text>"
        )
    return svg(body, title, width=size, height=size)


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
        return empty(title)
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
            f'transform="rotate(-60 {x:.1f} {head - 6})">{esc(net)}</text>'
        )
    for i, src in enumerate(nets):
        y = head + i * cw
        body.append(
            f'<text x="{left - 6}" y="{y + cw * 0.65:.1f}" text-anchor="end" font-size="9">'
            f"{esc(src)}</text>"
        )
        for j, dst in enumerate(nets):
            r = cells.get((src, dst))
            v = r["handovers"] if r else 0
            shade = PALETTE[min(len(PALETTE) - 1, math.ceil(v / top * (len(PALETTE) - 1)))]
            tip = f"{src} → {dst}: {v} handovers" + (
                f", restore p50 {duration(r['restore_p50_ms'])}, "
                f"p95 {duration(r['restore_p95_ms'])}"
                if r
                else ""
            )
            body.append(
                f'<rect class="mark" x="{left + j * cw:.1f}" y="{y:.1f}" width="{cw - 1:.1f}" '
                f'height="{cw - 1:.1f}" fill="{shade}" stroke="#e2e8f0"><title>{esc(tip)}'
                "</title></rect>"
            )
            if v:
                body.append(
                    f'<text x="{left + j * cw + cw / 2:.1f}" y="{y + cw * 0.62:.1f}" '
                    f'text-anchor="middle" font-size="9">{v}</text>'
                )
    return svg(body, title, height=height)


def html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], none: str = "none") -> str:
    """An HTML table; cells are already escaped text. Data rows are ``tr.row``."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr class='row'>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not rows:
        body = f"<tr><td colspan='{len(headers)}'>{esc(none)}</td></tr>"
    return f"<table><tr>{head}</tr>{body}</table>"
