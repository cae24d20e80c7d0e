"""The report's sections of the papers' figures: per move, per device, per network, per
broker, and the per-move figures beside Siena's published ones.

Each section opens with its definition (``p.def``), the same words as
analytics/figures.py and docs/analytics.md, so that a reader of the page knows what was
counted without the code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from analytics.charts import duration, esc, fmt, html_table

Rows = list[dict[str, Any]]
Section = Callable[[str, str, str], str]

DEFINITIONS: dict[str, str] = {
    "per-move": (
        "A move is an address change the device reported (its ip_changed). Each line that "
        "follows is charged to the user's latest move at or before it: the first restore "
        "(the device's media_connected latency) is the move's restore time; every gap the "
        "agent saw adds its missed count to the move's lost notifications; every duplicate "
        "its exactly-once gate refused adds one to the move's duplicates. Networks are the "
        "old and new /24. Siena's Table 3 reports the same per-move counts."
    ),
    "per-device": (
        "Per user and channel: the notifications the device received and their bytes, as "
        "the device counted them (its notify_delivered lines), and the money: for SMS what "
        "the broker paid (sms_sent cost), for IP the bytes at the configured price per MB."
    ),
    "saved": (
        "The network decisions (the broker's channel_decided lines) against always "
        "delivering at once: per delivered notification, its first line's cost (on the "
        "network the device was on when it was first decided) and its last deliver line's "
        "cost; bytes moved are those of the ones that waited and went on another network."
    ),
    "latency-by-network": (
        "End-to-end latency: from the publish instant to the delivery at the device (the "
        "agent's notify_delivered latency, published to ts), per network type: the SMS "
        "channel, or for IP the /24 the device's address was in at the moment."
    ),
    "per-broker": (
        "Per broker node (the node of the broker's lines): the users it served, sessions it "
        "started, handoffs (re-INVITEs after a move) and failovers: sessions started while "
        "the user's last session, at another broker, never ended. Empty for a log without "
        "broker lines."
    ),
    "siena": (
        "The per-move means of this log beside those Siena published for its mobility "
        "service (Caporuscio, Carzaniga and Wolf, IEEE TSE 29(12), 2003, Table 3), as a "
        "reference for readers: a generated log shows what the generator's loss and resend "
        "settings give, not a measurement."
    ),
}

# Siena's published per-move figures (Table 3): (setting, lost per move, duplicated per
# move). Empty: docs/analytics.md says why; the section then shows ours alone.
SIENA_TABLE_3: tuple[tuple[str, float, float], ...] = ()


def _definition(name: str) -> str:
    return f"<p class='def'>{esc(DEFINITIONS[name])}</p>"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _move_groups(moves: Rows) -> list[tuple[str, str, str, Rows]]:
    groups: dict[tuple[str, str, str], Rows] = defaultdict(list)
    for r in moves:
        key = (str(r["reason"] or "\u2013"), str(r["old_network"]), str(r["new_network"]))
        groups[key].append(r)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [(*key, rows) for key, rows in ranked]


def per_move(moves: Rows, section: Section) -> str:
    rows = []
    for reason, old, new, group in _move_groups(moves)[:15]:
        restores = [float(r["restore_ms"]) for r in group if r["restore_ms"] is not None]
        rows.append(
            [
                esc(reason),
                esc(old),
                esc(new),
                fmt(len(group)),
                fmt(sum(int(r["lost"]) for r in group)),
                fmt(sum(int(r["duplicated"]) for r in group)),
                duration(_pct(restores, 0.5)),
                duration(_pct(restores, 0.95)),
            ]
        )
    headers = ["kind", "old network", "new network", "moves", "lost", "duplicated"]
    body = html_table([*headers, "restore p50", "restore p95"], rows, "no move")
    return section("per-move", "Per move (Siena's Table 3)", _definition("per-move") + body)


def siena(moves: Rows, section: Section) -> str:
    by_kind: dict[str, Rows] = defaultdict(list)
    for r in moves:
        by_kind[str(r["reason"] or "all")].append(r)
    by_kind["all moves"] = moves
    rows = []
    for kind, group in sorted(by_kind.items()):
        n = len(group)
        lost = sum(int(r["lost"]) for r in group) / n if n else None
        dup = sum(int(r["duplicated"]) for r in group) / n if n else None
        rows.append([esc(kind), fmt(n), fmt(lost, 3), fmt(dup, 3), "this log"])
    for setting, lost_pm, dup_pm in SIENA_TABLE_3:
        rows.append([esc(setting), "\u2013", fmt(lost_pm, 3), fmt(dup_pm, 3), "Siena, Table 3"])
    note = (
        ""
        if SIENA_TABLE_3
        else "<p class='def'>Siena's own figures are not reproduced: docs/analytics.md "
        "says where to read them.</p>"
    )
    headers = ["moves of kind", "moves", "lost per move", "duplicated per move", "source"]
    body = _definition("siena") + html_table(headers, rows, "no move") + note
    return section("siena", "Per move, beside Siena's published figures", body)


def per_device(devices: Rows, section: Section, saved: Rows | None = None) -> str:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in devices:
        t = totals[str(r["channel"])]
        t[0] += float(r["deliveries"])
        t[1] += float(r["bytes"])
        t[2] += float(r["cost"] or 0.0)
    total_rows = [[esc(ch), fmt(t[0]), fmt(t[1]), fmt(t[2], 2)] for ch, t in sorted(totals.items())]
    top = sorted(devices, key=lambda r: (-int(r["bytes"]), str(r["uri"]), str(r["channel"])))
    rows = [
        [
            esc(r["uri"]),
            esc(r["channel"]),
            fmt(r["deliveries"]),
            fmt(r["bytes"]),
            fmt(r["cost"], 4),
        ]
        for r in top[:20]
    ]
    body = (
        _definition("per-device")
        + html_table(["channel", "deliveries", "bytes", "money"], total_rows, "no delivery")
        + "<h2 style='margin-top:14px'>Devices (top 20 by bytes)</h2>"
        + html_table(["user", "channel", "deliveries", "bytes", "money"], rows, "no delivery")
        + "<h2 style='margin-top:14px'>Network decisions against always deliver now</h2>"
        + _saved(saved or [])
    )
    return section("per-device", "Bytes and money per device and channel", body)


def _saved(saved: Rows) -> str:
    keys = ("decided", "waited", "bytes_moved", "cost_now", "cost_paid", "saved")
    total = {k: sum(float(r[k] or 0) for r in saved) for k in keys}
    rows = (
        [
            [
                fmt(len(saved)),
                *(fmt(total[k]) for k in keys[:3]),
                *(fmt(total[k], 6) for k in keys[3:]),
            ]
        ]
        if saved
        else []
    )
    headers = ["users", "decided", "waited", "bytes moved", "cost now", "paid", "saved"]
    return _definition("saved") + html_table(headers, rows, "no network decision in this log")


def latency_by_network(latency: Rows, section: Section) -> str:
    rows = [
        [
            esc(r["channel"]),
            esc(r["network"]),
            fmt(r["deliveries"]),
            duration(r["p50_ms"]),
            duration(r["p95_ms"]),
            duration(r["p99_ms"]),
            duration(r["mean_ms"]),
        ]
        for r in latency[:20]
    ]
    headers = ["channel", "network", "deliveries", "p50", "p95", "p99", "mean"]
    body = _definition("latency-by-network") + html_table(headers, rows, "no delivery")
    return section("latency-by-network", "End-to-end latency per network type", body)


def per_broker(brokers: Rows, section: Section) -> str:
    rows = [
        [
            esc(r["broker"]),
            fmt(r["users"]),
            fmt(r["sessions"]),
            fmt(r["handoffs"]),
            fmt(r["failovers"]),
        ]
        for r in brokers
    ]
    headers = ["broker", "users", "sessions", "handoffs", "failovers"]
    body = _definition("per-broker") + html_table(headers, rows, "no broker lines in this log")
    return section("per-broker", "Per broker", body)


def sections(tables: dict[str, Rows], section: Section) -> list[str]:
    """The five sections, in the page's order."""
    moves = tables.get("per_move", [])
    return [
        per_move(moves, section),
        siena(moves, section),
        per_device(tables.get("per_device", []), section, tables.get("saved", [])),
        latency_by_network(tables.get("latency_by_network", []), section),
        per_broker(tables.get("per_broker", []), section),
    ]
