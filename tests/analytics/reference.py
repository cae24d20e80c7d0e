"""An independent, plain-Python implementation of the per-user and per-hour metrics.

Written from the definitions in ``analytics/jobs.py``'s docstring, not from its code:
loops over sorted lists instead of window functions, so that an error in one is
unlikely to be repeated in the other.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

EVENTS = {
    "registered",
    "unregistered",
    "registration_expired",
    "session_started",
    "session_reinvited",
    "session_ended",
    "ip_changed",
    "media_connected",
    "media_disconnected",
    "broker_lost",
    "notify_queued",
    "notify_delivered",
    "notify_dropped",
    "sms_sent",
    "sms_received",
    "subscription_added",
    "subscription_removed",
    "subscription_expired",
    "notify_duplicate",
    "notify_gap",
    "handoff",
    "channel_decided",
    "publish_decided",
}
# The events whose agent line is the fact (docs/analytics.md, "One source of truth").
AGENT_EVENTS = {"ip_changed", "broker_lost", "notify_duplicate", "notify_gap", "publish_decided"}
STRINGS = (
    "ts",
    "node",
    "role",
    "event",
    "uri",
    "call_id",
    "addr",
    "prev_addr",
    "channel",
    "reason",
    "published",
)
INTS = ("queue_depth", "nseq", "bytes", "missed")
FLOATS = ("latency_ms", "cost")
ORDER = ("ts", "node", "event", "uri", "call_id", "addr", "prev_addr", "channel")


@dataclass
class Event:
    ts_ms: int
    event: str
    uri: str
    latency_ms: float | None
    cost: float | None
    fact: bool = True  # the line of the event's authoritative role (or of no role)
    restore: float | None = None  # latency_ms of an agent's (or role-less) media_connected
    reason: str | None = None
    nseq: int | None = None
    bytes: int | None = None


@dataclass
class Parsed:
    events: list[Event] = field(default_factory=list)
    invalid: int = 0
    duplicates: int = 0


def _record(raw: str) -> dict[str, Any] | None:
    try:
        r = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(r, dict):
        return None
    for k in STRINGS:
        if r.get(k) is not None and not isinstance(r[k], str):
            return None
    for k in INTS:
        if r.get(k) is not None and (not isinstance(r[k], int) or isinstance(r[k], bool)):
            return None
    for k in FLOATS:
        if r.get(k) is not None and (not isinstance(r[k], int | float) or isinstance(r[k], bool)):
            return None
    if not r.get("ts") or not r.get("event") or r["event"] not in EVENTS:
        return None
    if not isinstance(r.get("uri"), str) or not r["uri"].strip():
        return None
    try:
        t = datetime.fromisoformat(r["ts"])
    except ValueError:
        return None
    r["_ms"] = round(t.timestamp() * 1000)
    return r


def read(directory: Path) -> Parsed:
    """Every line of every file under ``directory``: valid events, de-duplicated."""
    out = Parsed()
    seen: set[tuple[Any, ...]] = set()
    names = (*STRINGS, *INTS, *FLOATS)
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        for raw in path.read_text(encoding="utf-8").splitlines():
            if not raw.strip():
                continue
            r = _record(raw)
            if r is None:
                out.invalid += 1
                continue
            key = tuple(
                float(r[k]) if k in FLOATS and r.get(k) is not None else r.get(k) for k in names
            )
            if key in seen:
                out.duplicates += 1
                continue
            seen.add(key)
            lat = r.get("latency_ms")
            cost = r.get("cost")
            role = r.get("role")
            owner = "agent" if r["event"] in AGENT_EVENTS else "broker"
            device = role in (None, "agent") and r["event"] == "media_connected"
            out.events.append(
                Event(
                    r["_ms"],
                    r["event"],
                    r["uri"],
                    None if lat is None else float(lat),
                    None if cost is None else float(cost),
                    fact=role is None or role == owner,
                    restore=float(lat) if device and lat is not None else None,
                    reason=r.get("reason"),
                    nseq=r.get("nseq"),
                    bytes=r.get("bytes"),
                )
            )
    return out


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def episodes(events: list[Event], since: int, until: int) -> list[tuple[str, int, int, int]]:
    """(uri, true start, clipped start, clipped duration) of the episodes in the window."""
    # (time, order at the same instant, kind): a session end, a disconnect, a connect.
    media: dict[str, list[tuple[int, int]]] = defaultdict(list)
    kinds = {"session_ended": 0, "media_disconnected": 1, "broker_lost": 1, "media_connected": 2}
    for e in events:
        if e.event == "media_disconnected" and e.reason == "session ended":
            continue  # the broker's tear-down of an ended session: no outage
        if e.fact and e.event in kinds:
            media[e.uri].append((e.ts_ms, kinds[e.event]))
    out = []
    for uri, items in media.items():
        items.sort()
        start: int | None = None
        state = "none"  # none | up | down | ended
        spans: list[tuple[int, int]] = []
        for t, kind in items:
            if kind == 1:
                if state in ("none", "up"):
                    start, state = t, "down"
                continue
            if start is not None:
                spans.append((start, t))
                start = None
            state = "ended" if kind == 0 else "up"
        if start is not None:
            spans.append((start, until))  # open: ends at the window's end
        for s, end in spans:
            if s >= until:
                continue
            if s < since and end <= since:
                continue
            lo, hi = max(s, since), min(end, until)
            out.append((uri, s, lo, hi - lo))
    return out


def per_user(parsed: Parsed, since: int, until: int) -> dict[str, dict[str, Any]]:
    """The per-user table, keyed by uri."""
    rows: dict[str, dict[str, Any]] = {}

    def row(uri: str) -> dict[str, Any]:
        if uri not in rows:
            rows[uri] = {
                "events": 0,
                "address_changes": 0,
                "handovers": 0,
                "disconnections": 0,
                "disconnected_ms": 0,
                "longest_disconnection_ms": 0,
                "sessions": 0,
                "notify_queued": 0,
                "notify_delivered": 0,
                "notify_dropped": 0,
                "sms_count": 0,
                "sms_cost": 0.0,
                "_lat": [],
            }
        return rows[uri]

    names = {
        "ip_changed": "address_changes",
        "session_reinvited": "handovers",
        "session_started": "sessions",
        "notify_queued": "notify_queued",
        "notify_delivered": "notify_delivered",
        "notify_dropped": "notify_dropped",
        "sms_sent": "sms_count",
    }
    for e in parsed.events:
        if not since <= e.ts_ms < until or not (e.fact or e.restore is not None):
            continue
        r = row(e.uri)
        if e.restore is not None:
            r["_lat"].append(e.restore)
        if not e.fact:
            continue
        r["events"] += 1
        if e.event in names:
            r[names[e.event]] += 1
        if e.event == "sms_sent" and e.cost is not None:
            r["sms_cost"] += e.cost
    for uri, _start, _lo, dur in episodes(parsed.events, since, until):
        r = row(uri)
        r["disconnections"] += 1
        r["disconnected_ms"] += dur
        r["longest_disconnection_ms"] = max(r["longest_disconnection_ms"], dur)
    for r in rows.values():
        lat = r.pop("_lat")
        r["restores"] = len(lat)
        r["restore_p50_ms"] = percentile(lat, 0.5)
        r["restore_p95_ms"] = percentile(lat, 0.95)
        r["restore_p99_ms"] = percentile(lat, 0.99)
        r["sms_cost"] = round(r["sms_cost"], 4)
        r["churn_score"] = round(
            r["address_changes"]
            + 2 * r["disconnections"]
            + r["disconnected_ms"] / 600_000
            + 5 * r["notify_dropped"],
            3,
        )
    return rows


def per_hour(parsed: Parsed, since: int, until: int) -> dict[int, dict[str, Any]]:
    """The per-hour table, keyed by the hour's start in epoch milliseconds."""
    hours: dict[int, dict[str, Any]] = defaultdict(
        lambda: {
            "_users": set(),
            "events": 0,
            "address_changes": 0,
            "handovers": 0,
            "disconnections": 0,
            "notify_dropped": 0,
            "sms_count": 0,
            "sms_cost": 0.0,
        }
    )
    hour = 3_600_000
    for e in parsed.events:
        if not since <= e.ts_ms < until or not e.fact:
            continue
        h = hours[e.ts_ms // hour * hour]
        h["_users"].add(e.uri)
        h["events"] += 1
        if e.event == "ip_changed":
            h["address_changes"] += 1
        elif e.event == "session_reinvited":
            h["handovers"] += 1
        elif e.event == "notify_dropped":
            h["notify_dropped"] += 1
        elif e.event == "sms_sent":
            h["sms_count"] += 1
            h["sms_cost"] += e.cost or 0.0
    for _uri, start, _lo, _dur in episodes(parsed.events, since, until):
        if start >= since:
            hours[start // hour * hour]["disconnections"] += 1
    out = {}
    for k, h in hours.items():
        h["active_users"] = len(h.pop("_users"))
        h["sms_cost"] = round(h["sms_cost"], 4)
        out[k] = h
    return out


def saved(parsed: Parsed) -> dict[str, dict[str, Any]]:
    """Per user, the network decisions against "always deliver now" (the definition in
    ``analytics/figures.py``'s docstring): a loop over each notification's lines."""
    lines: dict[tuple[str, int], list[tuple[int, int, float, str, int]]] = defaultdict(list)
    for e in parsed.events:
        if e.event != "channel_decided" or not e.fact or e.nseq is None:
            continue
        text = e.reason or ""
        rank = 0 if "decision=wait" in text else 1 if "decision=deliver" in text else None
        if rank is None:
            continue
        network = next((w[len("network=") :] for w in text.split() if w.startswith("network=")), "")
        lines[(e.uri, e.nseq)].append((e.ts_ms, rank, e.cost or 0.0, network, e.bytes or 0))
    out: dict[str, dict[str, Any]] = {}
    for (uri, _), got in lines.items():
        delivered = [x for x in got if x[1] == 1]
        if not delivered:
            continue
        # Ties (same millisecond and kind) go by cost, then network, as Spark's struct order.
        first, last = min(x[:4] for x in got), max(x[:4] for x in delivered)
        waited = any(x[1] == 0 for x in got)
        row = out.setdefault(
            uri,
            {"decided": 0, "waited": 0, "bytes_moved": 0, "cost_now": 0.0, "cost_paid": 0.0},
        )
        row["decided"] += 1
        row["waited"] += int(waited)
        if waited and first[3] != last[3]:
            row["bytes_moved"] += max(x[4] for x in got)
        row["cost_now"] += first[2]
        row["cost_paid"] += last[2]
    for row in out.values():
        row["saved"] = row["cost_now"] - row["cost_paid"]
    return out
