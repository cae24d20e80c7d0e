"""The tables of :mod:`analytics.figures` and :mod:`analytics.recommend`, computed
locally, and the summary's figures of ``analytics.churn._stats``. Each function follows
the docstring of its namesake there."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

from analytics import jobs
from analytics.local.common import (
    Event,
    Row,
    by_user,
    device,
    double_text,
    is_fact,
    ordered,
    percentile,
    restore_ms,
    spark_round,
    subnet_of,
)
from analytics.local.tables import tie_rank
from analytics.recommend import needed


def per_move(events: list[Event]) -> list[Row]:
    """One row per move: its networks, the first restore, gaps' missed counts and refused
    duplicates charged to it (a line goes to the user's latest move at or before it)."""

    def is_move(e: Event) -> bool:
        return e["event"] == "ip_changed" and is_fact(e)

    def charged(e: Event) -> bool:
        return (
            e["event"] in ("notify_gap", "notify_duplicate") or restore_ms(e) is not None
        ) and device(e)

    lines = [e for e in events if is_move(e) or charged(e)]
    after: dict[tuple[str, int], dict[str, Any]] = {}
    for uri, user_lines in by_user(lines, lambda e: (e["ts_ms"], 0 if is_move(e) else 1)).items():
        at: int | None = None
        for e in user_lines:
            if is_move(e):
                at = e["ts_ms"]
                continue
            if at is None:
                continue
            a = after.setdefault((uri, at), {"lost": None, "dup": 0, "up": None})
            if e["event"] == "notify_gap":
                a["lost"] = (a["lost"] or 0) + (e["missed"] or 0)
            elif e["event"] == "notify_duplicate":
                a["dup"] += 1
            lat = restore_ms(e)
            if lat is not None:
                up = (e["ts_ms"], lat)
                if a["up"] is None or up < a["up"]:
                    a["up"] = up
    rows = []
    for e in events:
        if not is_move(e):
            continue
        a = after.get((e["uri"], e["ts_ms"]), {"lost": None, "dup": 0, "up": None})
        rows.append(
            {
                "uri": e["uri"],
                "ts_ms": e["ts_ms"],
                "old_network": subnet_of(e["prev_addr"]),
                "new_network": subnet_of(e["addr"]),
                "reason": e["reason"],
                "restore_ms": None if a["up"] is None else a["up"][1],
                "lost": a["lost"] or 0,
                "duplicated": a["dup"],
            }
        )
    return ordered(rows, ("uri", False), ("ts_ms", False))


def per_device(events: list[Event], cfg: jobs.JobConfig) -> list[Row]:
    """Deliveries, bytes and money per user and channel."""
    got: dict[tuple[str, str], list[int]] = {}
    for e in events:
        if e["event"] == "notify_delivered" and device(e):
            g = got.setdefault((e["uri"], e["channel"] or "ip"), [0, 0])
            g[0] += 1
            g[1] += e["bytes"] or 0
    paid: dict[tuple[str, str], float] = {}
    for e in events:
        if e["event"] == "sms_sent" and is_fact(e):
            key = (e["uri"], "sms")
            paid[key] = paid.get(key, 0.0) + (e["cost"] or 0.0)
    rows = []
    for key in set(got) | set(paid):
        deliveries, size = got.get(key, (0, 0))
        if key[1] == "sms":
            cost = paid.get(key, 0.0)
        else:
            # Null bytes (a row only SMS paid for) cost nothing, as in the Spark job.
            cost = size / 1_000_000.0 * cfg.ip_cost_per_mb if key in got else 0.0
        rows.append(
            {
                "uri": key[0],
                "channel": key[1],
                "deliveries": deliveries,
                "bytes": size,
                "cost": spark_round(float(cost), 4),
            }
        )
    return ordered(rows, ("uri", False), ("channel", False))


_PLACES = frozenset(("registered", "session_started", "ip_changed", "media_connected"))


def latency_by_network(events: list[Event]) -> list[Row]:
    """End-to-end delivery latency per channel and network (the subnet of the device's
    latest known address, or ``sms``)."""

    def place(e: Event) -> bool:
        return e["addr"] is not None and e["event"] in _PLACES

    def delivery(e: Event) -> bool:
        return e["event"] == "notify_delivered" and device(e) and e["latency_ms"] is not None

    lines = [e for e in events if place(e) or delivery(e)]
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for user_lines in by_user(lines, lambda e: (e["ts_ms"], 0 if place(e) else 1)).values():
        where: str | None = None
        for e in user_lines:
            if place(e):
                where = e["addr"]
                continue
            channel = e["channel"] or "ip"
            network = "sms" if channel == "sms" else (subnet_of(where) or "unknown")
            groups[(channel, network)].append(e["latency_ms"])
    rows = [
        {
            "channel": channel,
            "network": network,
            "deliveries": len(lat),
            "p50_ms": percentile(lat, 0.5),
            "p95_ms": percentile(lat, 0.95),
            "p99_ms": percentile(lat, 0.99),
            "mean_ms": sum(lat) / len(lat),
        }
        for (channel, network), lat in groups.items()
    ]
    return ordered(rows, ("deliveries", True), ("network", False))


def per_broker(events: list[Event]) -> list[Row]:
    """Users, sessions, handoffs and failovers per broker node."""
    mine = [
        e
        for e in events
        if e["role"] == "broker"
        and e["node"] is not None
        and e["event"] in ("session_started", "session_reinvited", "session_ended")
    ]
    users: dict[str, set[str]] = defaultdict(set)
    handoffs: dict[str, int] = defaultdict(int)
    for e in mine:
        users[e["node"]].add(e["uri"])
        if e["event"] == "session_reinvited":
            handoffs[e["node"]] += 1
    sessions: dict[str, int] = defaultdict(int)
    failovers: dict[str, int] = defaultdict(int)
    edges = [e for e in mine if e["event"] != "session_reinvited"]
    # At the same millisecond a start sorts before an end (the Spark job's null key first).
    key = lambda e: (e["ts_ms"], e["event"] == "session_ended")  # noqa: E731
    for user_lines in by_user(edges, key).values():
        prev: Event | None = None
        for e in user_lines:
            if e["event"] == "session_started":
                sessions[e["node"]] += 1
                if (
                    prev is not None
                    and prev["event"] == "session_started"
                    and prev["node"] != e["node"]
                ):
                    failovers[e["node"]] += 1
            prev = e
    rows = [
        {
            "broker": node,
            "users": len(who),
            "sessions": sessions.get(node, 0),
            "handoffs": handoffs.get(node, 0),
            "failovers": failovers.get(node, 0),
        }
        for node, who in users.items()
    ]
    return ordered(rows, ("broker", False))


def _log2(x: float) -> float | None:
    # Spark's log2: log(x) / log(2), null for x <= 0.
    return math.log(x) / math.log(2) if x > 0 else None


def recommendations(current: list[Event], eps: list[Row], cfg: jobs.JobConfig) -> list[Row]:
    """The RUDP timeout and retries, the give-up time, the subscription TTL and the queue
    bound the data argues for, each with its basis or why there is none."""
    facts = [e for e in current if is_fact(e)]
    live = [
        e["latency_ms"]
        for e in facts
        if e["event"] == "notify_delivered"
        and (e["channel"] or "ip") == "ip"
        and e["latency_ms"] is not None
        and e["latency_ms"] < cfg.live_delivery_ms
    ]
    closed = [ep["duration_ms"] for ep in eps if not ep["open"]]
    short = [d for d in closed if d < cfg.short_disconnection_ms]
    deepest: dict[tuple[str, int], int | None] = {}
    drops: dict[tuple[str, int], int] = defaultdict(int)
    kinds = ("media_connected", "notify_queued", "notify_dropped")
    stretch_lines = [e for e in facts if e["event"] in kinds]
    for uri, lines in by_user(stretch_lines, lambda e: (e["ts_ms"], tie_rank(e["event"]))).items():
        stretch = 0
        for e in lines:
            if e["event"] == "media_connected":
                stretch += 1
            key = (uri, stretch)
            depth = deepest.setdefault(key, None)
            if e["event"] == "notify_queued" and e["queue_depth"] is not None:
                deepest[key] = e["queue_depth"] if depth is None else max(depth, e["queue_depth"])
            elif e["event"] == "notify_dropped":
                drops[key] += 1
    backlogs = [(depth or 0) + drops[key] for key, depth in deepest.items()]
    rtt_p99, rtt_n = percentile(live, 0.99), len(live)
    blip, blip_n = percentile([float(d) for d in short], 0.9), len(short)
    dur_p99, dur_n = percentile([float(d) for d in closed], 0.99), len(closed)
    queue, queue_n = (max(backlogs) if backlogs else None), len(backlogs)
    p99, p90 = needed(cfg, 0.99), needed(cfg, 0.9)
    rto_ok = rtt_n >= p99
    rto = 200.0 if rtt_p99 is None else max(200.0, float(math.ceil(rtt_p99 * 2 / 50) * 50))
    retries_ok = rto_ok and blip_n >= p90
    log = None if blip is None else _log2(blip / rto + 1)
    retries = min(15.0, max(1.0, float(math.ceil(log)) if log is not None else 1.0))
    ttl_ok = dur_n >= p99
    ttl = 600.0 if dur_p99 is None else max(600.0, float(math.ceil(dur_p99 * 1.5 / 300_000) * 300))

    def short_of(count: int, need: int, what: str) -> str:
        return f"not enough data: {count} {what}, {need:,} needed"

    def figure(value: float | None, scale: int) -> str:
        rounded = spark_round(value, scale)
        return "" if rounded is None else double_text(rounded)

    rows: list[tuple[str, bool, float | None, str, str, str]] = [
        (
            "rudp_initial_rto_ms",
            rto_ok,
            rto,
            "ms",
            f"2 x p99 of live delivery latency ({figure(rtt_p99, 1)} ms), at least 200",
            short_of(rtt_n, p99, "live deliveries"),
        ),
        (
            "rudp_max_retries",
            retries_ok,
            retries,
            "retries",
            f"back-off covers p90 of short disconnections ({figure(blip, 0)} ms)",
            short_of(blip_n, p90, "short disconnections")
            if rto_ok
            else short_of(rtt_n, p99, "live deliveries"),
        ),
        (
            "rudp_give_up_after_ms",
            retries_ok,
            rto * (math.pow(2.0, retries) - 1),
            "ms",
            "initial RTO x (2^retries - 1)",
            "not enough data for the timeout or the retries",
        ),
        (
            "subscription_ttl_s",
            ttl_ok,
            ttl,
            "s",
            "1.5 x p99 of disconnection durations ("
            f"{figure(None if dur_p99 is None else dur_p99 / 1000, 1)} s), at least 600",
            short_of(dur_n, p99, "disconnections"),
        ),
        (
            "queue_max_per_uri",
            queue_n >= p90,
            None if queue is None else float(queue),
            "notifications",
            "deepest backlog plus drops between two restores",
            short_of(queue_n, p90, "stretches between restores"),
        ),
    ]
    return [
        {
            "setting": setting,
            "value": value if enough else None,
            "unit": unit,
            "basis": basis if enough else shortfall,
        }
        for setting, enough, value, unit, basis, shortfall in rows
    ]


def saved(events: list[Event]) -> list[Row]:
    """Per user, each delivered notification's first and last ``channel_decided`` line
    (``analytics.figures.saved``): what "deliver now" cost, what was paid, bytes moved."""
    per: dict[tuple[str, int], list[tuple[tuple[int, int, float, str], bool, int]]] = defaultdict(
        list
    )
    for e in events:
        text = e["reason"] or ""
        wait, deliver = "decision=wait" in text, "decision=deliver" in text
        if e["event"] != "channel_decided" or e["nseq"] is None or not (wait or deliver):
            continue
        if not is_fact(e):
            continue
        found = re.search(r"network=(\S*)", text)
        at = (e["ts_ms"], 0 if wait else 1, float(e["cost"] or 0.0), found[1] if found else "")
        per[(e["uri"], e["nseq"])].append((at, wait, int(e["bytes"] or 0)))
    users: dict[str, dict[str, Any]] = {}
    for (uri, _), lines in per.items():
        delivered = [at for at, wait, _ in lines if not wait]
        if not delivered:
            continue
        first, last = min(at for at, _, _ in lines), max(delivered)
        waited = any(wait for _, wait, _ in lines)
        u = users.setdefault(
            uri, {"uri": uri, "decided": 0, "waited": 0, "bytes_moved": 0, "_now": [], "_paid": []}
        )
        u["decided"] += 1
        u["waited"] += int(waited)
        if waited and first[3] != last[3]:
            u["bytes_moved"] += max(b for _, _, b in lines)
        u["_now"].append(first[2])
        u["_paid"].append(last[2])
    rows = []
    for u in users.values():
        now, paid = math.fsum(u.pop("_now")), math.fsum(u.pop("_paid"))
        rows.append({**u, "cost_now": now, "cost_paid": paid, "saved": now - paid})
    return ordered(rows, ("uri", False))


def stats(current: list[Event]) -> dict[str, Any]:
    """The summary's restore percentiles over the window, its first and last fact, and
    the other role's copies (``analytics.churn._stats``)."""
    lat = [x for x in (restore_ms(e) for e in current) if x is not None]
    fact_ts = [e["ts_ms"] for e in current if is_fact(e)]
    return {
        "p": [percentile(lat, q) for q in (0.5, 0.95, 0.99)] if lat else None,
        "a": min(fact_ts) if fact_ts else None,
        "b": max(fact_ts) if fact_ts else None,
        "copies": len(current) - len(fact_ts),
    }
