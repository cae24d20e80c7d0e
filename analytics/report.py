"""``mdeci analytics report``: the churn tables as one self-contained HTML page.

Charts are inline SVG drawn here in Python: no JavaScript library and no CDN (admins
open reports on machines without internet), and the page is one file to mail around.
A few lines of script only check the page once it is loaded (every chart has marks)
and record the result in ``<body data-charts=... data-errors=...>`` for the tests.
The tables are read with pyarrow; no Spark is needed to render a report.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analytics import paper_sections
from analytics.charts import (
    bar_chart,
    cdf_chart,
    duration,
    duration_histogram,
    esc,
    fmt,
    handover_matrix,
    heatmap,
    html_table,
    sms_spend,
    transition_graph,
)
from analytics.errors import InputError

# The papers' tables: an output of an older churn has none; their sections say so.
PAPER_TABLES = ("per_move", "per_device", "latency_by_network", "per_broker", "saved")
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
        *PAPER_TABLES,
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
p.def{color:#334155;font-size:13px;margin:0 0 8px;max-width:70em}
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
    "per-move",
    "siena",
    "per-device",
    "latency-by-network",
    "per-broker",
    "per-user",
    "episodes",
    "recommendations",
    "storms",
)


# What each headline figure counts, shown beside it (docs/analytics.md has the summary's).
HEADLINE_DEFINITIONS = {
    "users": "users with events or disconnection episodes in the window",
    "events read": "valid lines of the whole log after de-duplication, both roles: the "
    "count `mdeci analytics churn` prints",
    "events counted": "events in the window from the role that is the fact's authority "
    "(an agent's copy of a broker fact is read, not counted)",
    "address changes": "ip_changed events",
    "handovers": "session_reinvited events: the dialog survived a move",
    "disconnections": "disconnection episodes overlapping the window: from a "
    "media_disconnected or an agent's broker_lost to the next media_connected",
    "time disconnected": "sum of the episodes' durations, clipped to the window",
    "restore p50": "median of the agent's media_connected latency: from the move or "
    "outage start to media up (not to the first notification)",
    "restore p95": "95th percentile of the same restore latency",
    "restore p99": "99th percentile of the same restore latency",
    "notifications dropped": "notify_dropped events: a full queue dropped one",
    "SMS sent": "sms_sent events",
    "SMS spend": "sum of the sms_sent costs",
    "reconnect storms": "rows of the storms table",
    "flapping bursts": "rows of the flapping table",
    "invalid lines": "lines quarantined with a reason",
}


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
        ("users", fmt(s("users"))),
        ("events read", fmt(s("events"))),
        ("events counted", fmt(s("events_in_window"))),
        ("address changes", fmt(s("address_changes"))),
        ("handovers", fmt(s("handovers"))),
        ("disconnections", fmt(s("disconnections"))),
        ("time disconnected", duration(disconnected_ms) if users else "\u2013"),
        ("restore p50", duration(p50)),
        ("restore p95", duration(p95)),
        ("restore p99", duration(p99)),
        ("notifications dropped", fmt(s("notify_dropped"))),
        ("SMS sent", fmt(s("sms_count"))),
        ("SMS spend", fmt(s("sms_cost"), 2)),
        ("reconnect storms", fmt(s("storms"))),
        ("flapping bursts", fmt(s("flaps"))),
        ("invalid lines", fmt(s("invalid_lines"))),
    ]
    queued, delivered, dropped = s("notify_queued"), s("notify_delivered"), s("notify_dropped")
    delivery_rows = [
        ["queued", fmt(queued), "notifications the broker accepted for a subscriber"],
        [
            "delivered",
            fmt(delivered),
            "acknowledged by the device (the broker's ack; IP or SMS)"
            + (f" · {100 * (delivered or 0) / queued:.1f} % of queued" if queued else ""),
        ],
        ["dropped", fmt(dropped), "lost: queue full, TTL ended, unsendable"],
        [
            "SMS sent",
            fmt(s("sms_count")),
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
            esc(r["subnet"]),
            fmt(r["disconnections"]),
            fmt(r["users_disconnected"]),
            fmt(r["restores"]),
            duration(r["restore_p50_ms"]),
            duration(r["restore_p95_ms"]),
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
            esc(r["uri"]),
            fmt(r["events"]),
            fmt(r["address_changes"]),
            fmt(r["handovers"]),
            fmt(r["disconnections"]),
            duration(r["disconnected_ms"]) if r["disconnected_ms"] else "0",
            duration(r["restore_p50_ms"]),
            duration(r["restore_p95_ms"]),
            fmt(r["notify_queued"]),
            fmt(r["notify_delivered"]),
            fmt(r["notify_dropped"]),
            fmt(r["sms_count"]),
            fmt(r["sms_cost"], 2),
            fmt(r["churn_score"], 1),
        ]
        for r in sorted(users, key=lambda r: (-(r["churn_score"] or 0), r["uri"]))[:50]
    ]
    eps = sorted(tables["episodes"], key=lambda r: (-(r["duration_ms"] or 0), r["uri"]))[:50]
    episode_rows = [
        [
            esc(r["uri"]),
            _when(r["start_ms"]),
            _when(r["end_ms"]) if r["end_ms"] is not None else "still open",
            duration(r["duration_ms"]),
        ]
        for r in eps
    ]
    recs = [
        [
            esc(r["setting"]),
            "\u2013" if r["value"] is None else f"<b>{fmt(r['value'])}</b> {esc(r['unit'])}",
            esc(r["basis"]),
        ]
        for r in tables["recommendations"]
    ]
    storms = [
        [
            ts_ms(r["start_ms"]),
            duration(r["end_ms"] - r["start_ms"]),
            fmt(r["users"]),
            fmt(r["reconnects"]),
        ]
        for r in sorted(tables["storms"], key=lambda r: -r["users"])[:10]
    ]
    flaps = [
        [
            esc(r["uri"]),
            ts_ms(r["start_ms"]),
            duration(r["end_ms"] - r["start_ms"]),
            fmt(r["changes"]),
        ]
        for r in sorted(tables["flapping"], key=lambda r: -r["changes"])[:10]
    ]
    inputs = prov.get("inputs") or []
    shown_inputs = ", ".join(esc(Path(str(i)).name) for i in inputs[:8])
    if len(inputs) > 8:
        shown_inputs += f" and {len(inputs) - 8} more"
    prov_rows = [
        ["generated at", esc(prov.get("generated_at", "\u2013"))],
        ["time range", f"{_when(s('first_ts_ms'))} to {_when(s('last_ts_ms'))}"],
        [
            "window",
            f"{_when(s('since_ms'))} to {_when(s('until_ms'))}"
            if s("since_ms") is not None or s("until_ms") is not None
            else "the whole log",
        ],
        [
            "inputs",
            f"{len(inputs)} {esc(prov.get('input_format', ''))} file(s): {shown_inputs}"
            if inputs
            else "\u2013",
        ],
        [
            "lines",
            f"{fmt(s('lines'))} read, {fmt(s('invalid_lines'))} invalid, "
            f"{fmt(s('duplicates_dropped'))} duplicates, {fmt(s('other_role_copies'))} "
            "copies of the other role not counted",
        ],
        [
            "engine",
            "local (in the driver process, no Spark)"
            if prov.get("engine") == "local"
            else esc(f"Spark {prov.get('spark', '?')} on {prov.get('master', '?')}"),
        ],
    ]

    def section(name: str, heading: str, body: str, wide: bool = False) -> str:
        cls = " class='wide'" if wide else ""
        head = f"<section id='{name}' data-section='{name}'{cls}><h2>{esc(heading)}</h2>"
        return f"{head}{body}</section>"

    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<div class='sub'>{_when(s('first_ts_ms'))} to {_when(s('last_ts_ms'))} · "
        f"generated {esc(prov.get('generated_at', '?'))}</div>",
        "<div class='grid'>",
        section("provenance", "Provenance", html_table(["", ""], prov_rows)),
        section(
            "headline",
            "Headline",
            "<div class='cards'>"
            + "".join(
                f"<div class='card mark-card'><b>{v}</b><span>{esc(k)}</span></div>"
                for k, v in cards
            )
            + "</div>"
            # Folded, so the charts stay in the first screen.
            + "<details><summary>How each figure is counted</summary>"
            + html_table(
                ["figure", "value", "definition"],
                [[esc(k), v, esc(HEADLINE_DEFINITIONS[k])] for k, v in cards],
            )
            + "</details>",
        ),
        section(
            "delivery",
            "Delivery health",
            delivery_chart + html_table(["outcome", "count", "meaning"], delivery_rows),
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
            + html_table(
                ["subnet", "disconnections", "users", "restores", "restore p50", "restore p95"],
                net_rows,
            ),
        ),
        section(
            "sms-spend",
            "SMS spend per user per day",
            sms_spend(tables.get("sms_spend", []), "SMS spend"),
        ),
        *paper_sections.sections(tables, section),
        section(
            "per-user",
            "Per user (top 50 by churn score)",
            html_table(
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
            html_table(["user", "start", "end", "length (in the window)"], episode_rows),
            wide=True,
        ),
        section(
            "recommendations",
            "Recommendations",
            html_table(["setting", "value", "why"], recs),
        ),
        section(
            "storms",
            "Reconnect storms and flapping",
            html_table(["start", "length", "users", "reconnects"], storms, "no reconnect storm")
            + "<h2 style='margin-top:14px'>Flapping</h2>"
            + html_table(["user", "start", "length", "changes"], flaps, "no flapping"),
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
