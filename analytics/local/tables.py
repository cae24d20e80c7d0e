"""The tables of :mod:`analytics.jobs`, computed locally: episodes, per user, per hour,
the mobility graph, the restore histogram, flapping, storms, the handover matrix, the
networks and the SMS spend. Each function follows the docstring of its namesake there
and returns its rows in that table's schema order and row order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from analytics import jobs
from analytics.local.common import (
    Event,
    Row,
    by_user,
    hour_of,
    in_window,
    is_fact,
    ordered,
    percentile,
    restore_ms,
    spark_round,
    subnet_of,
    within,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DAY_MS = 86_400_000
_DISCONNECTS = frozenset(jobs.DISCONNECTS)
_MEDIA = frozenset((*jobs.DISCONNECTS, "media_connected", "session_ended"))


def tie_rank(event: str) -> int:
    """At the same millisecond: a session end, then a disconnect, then a connect."""
    if event == "session_ended":
        return 0
    if event in _DISCONNECTS:
        return 1
    return 2 if event == "media_connected" else 3


# ------------------------------------------------------------------------- episodes


def episode_starts(events: list[Event]) -> list[tuple[Event, int | None]]:
    """Each disconnect that opens an episode, with the instant of the edge closing it."""
    media = [
        e
        for e in events
        if e["event"] in _MEDIA
        and is_fact(e)
        and not (e["event"] == "media_disconnected" and (e["reason"] or "") == "session ended")
    ]
    out: list[tuple[Event, int | None]] = []
    for lines in by_user(media, lambda e: (e["ts_ms"], tie_rank(e["event"]))).values():
        edges: list[Event] = []
        prev: str | None = None
        for e in lines:
            kind = "media_disconnected" if e["event"] in _DISCONNECTS else e["event"]
            down = kind == "media_disconnected"
            if (down and prev in (None, "media_connected")) or (
                not down and prev == "media_disconnected"
            ):
                edges.append(e)
            prev = kind
        # Edges alternate start, end, start, end ...: an end is the next edge.
        for i in range(0, len(edges), 2):
            end = edges[i + 1]["ts_ms"] if i + 1 < len(edges) else None
            out.append((edges[i], end))
    return out


def episodes(
    starts: list[tuple[Event, int | None]], window: jobs.TimeWindow, last_ms: int
) -> list[Row]:
    """Disconnection episodes clipped to ``window``; ``last_ms`` ends an open one when
    the window has no end."""
    since, until = window.since_ms, window.until_ms
    rows: list[Row] = []
    for e, end_ms in starts:
        start = e["ts_ms"]
        end = end_ms if end_ms is not None else (until if until is not None else last_ms)
        lo, hi = start, end
        if until is not None:
            if start >= until:
                continue
            hi = min(end, until)
        if since is not None:
            if not (end > since or start >= since):
                continue
            lo = max(start, since)
        rows.append(
            {
                "uri": e["uri"],
                "start_ms": start,
                "end_ms": end_ms,
                "window_start_ms": lo,
                "window_end_ms": hi,
                "duration_ms": hi - lo,
                "open": end_ms is None,
            }
        )
    return ordered(rows, ("uri", False), ("start_ms", False))


# ------------------------------------------------------------------------- per user

_USER_COUNTS = {
    "ip_changed": "address_changes",
    "session_reinvited": "handovers",
    "session_started": "sessions",
    "notify_queued": "notify_queued",
    "notify_delivered": "notify_delivered",
    "notify_dropped": "notify_dropped",
    "sms_sent": "sms_count",
}


def per_user(current: list[Event], eps: list[Row]) -> list[Row]:
    """One row per user with facts, restores or episodes in the window."""
    acc: dict[str, dict[str, Any]] = {}
    for e in current:
        a = acc.get(e["uri"])
        if a is None:
            a = acc[e["uri"]] = {"events": 0, "lat": [], "sms": None}
            a.update(dict.fromkeys(_USER_COUNTS.values(), 0))
        lat = restore_ms(e)
        if lat is not None:
            a["lat"].append(lat)
        if not is_fact(e):
            continue
        a["events"] += 1
        name = _USER_COUNTS.get(e["event"])
        if name is not None:
            a[name] += 1
        if e["event"] == "sms_sent" and e["cost"] is not None:
            a["sms"] = (a["sms"] or 0.0) + e["cost"]
    counts = {uri: a for uri, a in acc.items() if a["events"] > 0 or a["lat"]}
    per_ep: dict[str, list[int]] = defaultdict(list)
    for ep in eps:
        per_ep[ep["uri"]].append(ep["duration_ms"])
    rows: list[Row] = []
    for uri in sorted(set(counts) | set(per_ep)):
        a = counts.get(uri) or {"events": 0, "lat": [], "sms": None}
        durations = per_ep.get(uri, [])
        lat = a["lat"]
        disconnections = len(durations)
        disconnected = sum(durations)
        row: Row = {
            "uri": uri,
            "events": a["events"],
            "address_changes": a.get("address_changes", 0),
            "handovers": a.get("handovers", 0),
            "disconnections": disconnections,
            "disconnected_ms": disconnected,
            "longest_disconnection_ms": max(durations) if durations else 0,
            "restores": len(lat),
            "restore_p50_ms": percentile(lat, 0.5),
            "restore_p95_ms": percentile(lat, 0.95),
            "restore_p99_ms": percentile(lat, 0.99),
            "sessions": a.get("sessions", 0),
            "notify_queued": a.get("notify_queued", 0),
            "notify_delivered": a.get("notify_delivered", 0),
            "notify_dropped": a.get("notify_dropped", 0),
            "sms_count": a.get("sms_count", 0),
            "sms_cost": spark_round(a["sms"] or 0.0, 4),
        }
        row["churn_score"] = spark_round(
            row["address_changes"]
            + 2 * disconnections
            + disconnected / 600_000.0
            + 5 * row["notify_dropped"],
            3,
        )
        rows.append(row)
    return rows


# ------------------------------------------------------------------------- per hour


def timestamp(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def per_hour(current: list[Event], eps: list[Row], window: jobs.TimeWindow) -> list[Row]:
    """One row per UTC hour with facts in the window."""
    user_hours: dict[tuple[int, str], dict[str, Any]] = {}
    for e in current:
        if not is_fact(e):
            continue
        key = (hour_of(e["ts_ms"]), e["uri"])
        u = user_hours.get(key)
        if u is None:
            u = user_hours[key] = dict.fromkeys(
                ("events", "address_changes", "handovers", "notify_dropped", "sms_count"), 0
            )
            u["sms_cost"] = None
        u["events"] += 1
        name = e["event"]
        if name == "ip_changed":
            u["address_changes"] += 1
        elif name == "session_reinvited":
            u["handovers"] += 1
        elif name == "notify_dropped":
            u["notify_dropped"] += 1
        elif name == "sms_sent":
            u["sms_count"] += 1
            if e["cost"] is not None:
                u["sms_cost"] = (u["sms_cost"] or 0.0) + e["cost"]
    hourly: dict[int, dict[str, Any]] = {}
    for (hour, _uri), u in user_hours.items():
        h = hourly.get(hour)
        if h is None:
            h = hourly[hour] = {"active_users": 0, "sms": None}
            h.update(dict.fromkeys(("events", "address_changes", "handovers"), 0))
            h.update(dict.fromkeys(("notify_dropped", "sms_count"), 0))
        h["active_users"] += 1
        for c in ("events", "address_changes", "handovers", "notify_dropped", "sms_count"):
            h[c] += u[c]
        if u["sms_cost"] is not None:
            h["sms"] = (h["sms"] or 0.0) + u["sms_cost"]
    began: dict[int, int] = defaultdict(int)
    for ep in eps:
        if window.since_ms is None or ep["start_ms"] >= window.since_ms:
            began[hour_of(ep["start_ms"])] += 1
    rows = [
        {
            "hour": timestamp(hour),
            "active_users": h["active_users"],
            "events": h["events"],
            "address_changes": h["address_changes"],
            "handovers": h["handovers"],
            "disconnections": began.get(hour, 0),
            "notify_dropped": h["notify_dropped"],
            "sms_count": h["sms_count"],
            "sms_cost": spark_round(h["sms"] or 0.0, 4),
        }
        for hour, h in sorted(hourly.items())
    ]
    return rows


# ----------------------------------------------------------------- mobility graph etc.


def _moves(events: list[Event]) -> list[Event]:
    return [
        e
        for e in events
        if e["event"] == "ip_changed"
        and is_fact(e)
        and e["addr"] is not None
        and e["prev_addr"] is not None
    ]


def transitions(events: list[Event]) -> list[Row]:
    """Subnet-to-subnet moves: how many, by how many users."""
    groups: dict[tuple[str | None, str | None], list[str]] = defaultdict(list)
    for e in _moves(events):
        groups[(subnet_of(e["prev_addr"]), subnet_of(e["addr"]))].append(e["uri"])
    rows = [
        {"from_subnet": f, "to_subnet": t, "transitions": len(uris), "users": len(set(uris))}
        for (f, t), uris in groups.items()
    ]
    return ordered(rows, ("transitions", True), ("from_subnet", False), ("to_subnet", False))


def restore_latency(events: list[Event], cfg: jobs.JobConfig) -> list[Row]:
    """Histogram and CDF of restore latencies (non-empty buckets only)."""
    edges = sorted(cfg.latency_edges_ms)
    counts: dict[tuple[float, float | None], int] = defaultdict(int)
    total = 0
    for e in events:
        lat = restore_ms(e)
        if lat is None:
            continue
        total += 1
        bucket: tuple[float, float | None] = (edges[0], edges[1] if len(edges) > 1 else None)
        if lat >= edges[-1]:
            bucket = (edges[-1], None)
        else:
            for i in range(len(edges) - 2, -1, -1):
                if lat >= edges[i]:
                    bucket = (edges[i], edges[i + 1])
                    break
        counts[bucket] += 1
    rows: list[Row] = []
    running = 0
    for (lo, hi), n in sorted(counts.items(), key=lambda kv: kv[0][0]):
        running += n
        rows.append(
            {
                "bucket_lo_ms": float(lo),
                "bucket_hi_ms": None if hi is None else float(hi),
                "restores": n,
                "cumulative_fraction": running / total,
            }
        )
    return rows


def flapping(events: list[Event], cfg: jobs.JobConfig) -> list[Row]:
    """Users changing address at least ``flap_min_changes`` times within
    ``flap_window_ms``; flap changes less than a window apart are one row."""
    w = cfg.flap_window_ms
    changes = [e for e in events if e["event"] == "ip_changed" and is_fact(e)]
    rows: list[Row] = []
    for uri, lines in by_user(changes, lambda e: e["ts_ms"]).items():
        ts = [e["ts_ms"] for e in lines]
        # Range frames: the changes within [t - w, t] (ties included), then whether any
        # change within [t, t + w] is flagged (prefix sums of the flags).
        n = [bisect_right(ts, t) - bisect_left(ts, t - w) for t in ts]
        flagged = [0]
        for k in n:
            flagged.append(flagged[-1] + (k >= cfg.flap_min_changes))
        inside = [
            i
            for i, t in enumerate(ts)
            if flagged[bisect_right(ts, t + w)] > flagged[bisect_left(ts, t)]
        ]
        burst: list[int] = []
        prev: int | None = None
        for i in inside:
            if prev is None or ts[i] - prev > w:
                if burst:
                    rows.append(_flap(uri, burst, ts, n))
                burst = []
            burst.append(i)
            prev = ts[i]
        if burst:
            rows.append(_flap(uri, burst, ts, n))
    return ordered(rows, ("uri", False), ("start_ms", False))


def _flap(uri: str, burst: list[int], ts: list[int], n: list[int]) -> Row:
    return {
        "uri": uri,
        "start_ms": min(ts[i] for i in burst),
        "end_ms": max(ts[i] for i in burst),
        "changes": len(burst),
        "peak_changes_in_window": max(n[i] for i in burst),
    }


def storms(events: list[Event], cfg: jobs.JobConfig) -> list[Row]:
    """Buckets of ``storm_window_ms`` where many users restored at once, well above the
    mean of their hour; adjacent stormy buckets are one storm."""
    w = cfg.storm_window_ms
    restores = [
        (e["uri"], e["ts_ms"] - e["ts_ms"] % w, hour_of(e["ts_ms"]))
        for e in events
        if e["event"] == "media_connected" and is_fact(e)
    ]
    users: dict[tuple[int, int], set[str]] = defaultdict(set)
    per_hour: dict[int, int] = defaultdict(int)
    for uri, bucket, hour in restores:
        users[(bucket, hour)].add(uri)
        per_hour[hour] += 1
    stormy = sorted(
        bucket
        for (bucket, hour), who in users.items()
        if len(who) >= cfg.storm_min_users
        and len(who) >= per_hour[hour] / (jobs.HOUR_MS / w) * cfg.storm_factor
    )
    island: dict[int, list[float]] = defaultdict(list)
    for number, bucket in enumerate(stormy, start=1):
        island[bucket].append(bucket / w - number)
    groups: dict[float, list[tuple[str, int]]] = defaultdict(list)
    for uri, bucket, _hour in restores:
        for key in island.get(bucket, ()):
            groups[key].append((uri, bucket))
    rows = [
        {
            "start_ms": min(b for _u, b in members),
            "end_ms": max(b for _u, b in members) + w,
            "users": len({u for u, _b in members}),
            "reconnects": len(members),
        }
        for members in groups.values()
    ]
    return ordered(rows, ("start_ms", False))


# ------------------------------------------------------------------- per network


def handover_matrix(events: list[Event]) -> list[Row]:
    """Moves between subnets, with the restores charged to each kind of move."""
    counts: dict[tuple[str | None, str | None], list[str]] = defaultdict(list)
    for e in _moves(events):
        counts[(subnet_of(e["prev_addr"]), subnet_of(e["addr"]))].append(e["uri"])
    lines = [
        e
        for e in events
        if (e["event"] == "ip_changed" and is_fact(e)) or restore_ms(e) is not None
    ]
    charged: dict[tuple[str | None, str | None], list[float]] = defaultdict(list)
    rank = lambda e: (e["ts_ms"], 0 if e["event"] == "ip_changed" else 1)  # noqa: E731
    for user_lines in by_user(lines, rank).values():
        last: tuple[str | None, str | None] | None = None
        for e in user_lines:
            if e["event"] == "ip_changed":
                last = (subnet_of(e["prev_addr"]), subnet_of(e["addr"]))
                continue
            lat = restore_ms(e)
            if lat is not None and last is not None:
                charged[last].append(lat)
    rows = []
    for (f, t), uris in counts.items():
        got = charged.get((f, t), [])
        rows.append(
            {
                "from_subnet": f,
                "to_subnet": t,
                "handovers": len(uris),
                "users": len(set(uris)),
                "restores": len(got),
                "restore_p50_ms": percentile(got, 0.5),
                "restore_p95_ms": percentile(got, 0.95),
            }
        )
    return ordered(rows, ("handovers", True), ("from_subnet", False), ("to_subnet", False))


def networks(
    events: list[Event], window: jobs.TimeWindow, starts: list[tuple[Event, int | None]]
) -> list[Row]:
    """Per subnet: episodes that began there in the window, restores that landed there."""
    inside = within(window)
    down: dict[str | None, list[str]] = defaultdict(list)
    for e, _end in starts:
        if e["addr"] is not None and inside(e["ts_ms"]):
            down[subnet_of(e["addr"])].append(e["uri"])
    up: dict[str | None, list[float]] = defaultdict(list)
    for e in in_window(events, window):
        lat = restore_ms(e)
        if lat is not None and e["addr"] is not None:
            up[subnet_of(e["addr"])].append(lat)
    rows = []
    for subnet in set(down) | set(up):
        landed = up.get(subnet, [])
        rows.append(
            {
                "subnet": subnet,
                "disconnections": len(down.get(subnet, [])),
                "users_disconnected": len(set(down.get(subnet, []))),
                "restores": len(landed),
                "restore_p50_ms": percentile(landed, 0.5),
                "restore_p95_ms": percentile(landed, 0.95),
            }
        )
    return ordered(rows, ("disconnections", True), ("subnet", False))


def sms_spend(events: list[Event]) -> list[Row]:
    """SMS sent and their cost per user per UTC day."""
    groups: dict[tuple[str, int], list[float | None]] = defaultdict(list)
    for e in events:
        if e["event"] == "sms_sent" and is_fact(e):
            groups[(e["uri"], e["ts_ms"] // _DAY_MS)].append(e["cost"])
    rows = []
    for (uri, day), costs in groups.items():
        paid = [c for c in costs if c is not None]
        rows.append(
            {
                "uri": uri,
                "day": date(1970, 1, 1) + timedelta(days=day),
                "sms_count": len(costs),
                "sms_cost": spark_round(sum(paid) if paid else 0.0, 4),
            }
        )
    return ordered(rows, ("day", False), ("uri", False))
