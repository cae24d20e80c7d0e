"""The live query over a churn-log folder that grows while it runs.

Files are added to the folder while the query runs, as a broker's rotation (or a log
shipper) adds them; after each one the test waits for the query to have processed all
that is there (``processAllAvailable``). The per-minute rows it writes are compared with
an independent count, in plain Python, of the lines the test wrote: each fact once (an
agent's copy of a broker fact is not one), a rotated copy of a file counted once, a
line later than the watermark not at all, and a storm alert for the minute in which
ten users reconnected.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.analytics.logs import T0_MS, line

pytestmark = pytest.mark.peer("spark")

WATERMARK_S = 180
STORM_USERS = 8


def user(i: int) -> str:
    return f"sip:u{i}@example.net"


def minute_lines(m: int) -> list[str]:
    """One minute of a small deployment, both roles' lines, ``m`` minutes after T0."""
    t = 60 * m
    out: list[str] = []
    for i in range(3):  # three handovers: the broker's re-INVITE, the agent's copy
        out.append(line(t + i, "session_reinvited", user(i), role="broker", addr="10.0.1.5:1"))
        out.append(line(t + i, "session_reinvited", user(i), role="agent", addr="10.0.1.5:1"))
        out.append(line(t + i, "ip_changed", user(i), role="agent", addr="10.0.1.5:1"))
    for i in range(3, 3 + m % 3 + 1):  # 1-3 breaks, as the broker saw them
        out.append(line(t + 10 + i, "media_disconnected", user(i), role="broker"))
    # A session's tear-down is not a break.
    out.append(line(t + 20, "media_disconnected", user(9), role="broker", reason="session ended"))
    for i in range(2):  # two restores: the agent's line has the latency, the broker's not
        out.append(line(t + 30 + i, "media_connected", user(i), role="broker"))
        out.append(
            line(
                t + 30 + i, "media_connected", user(i), role="agent", latency_ms=100.0 * (m + i + 1)
            )
        )
    return out


def storm_lines(m: int) -> list[str]:
    """Ten users reconnecting within minute ``m``: a reconnect storm."""
    return [
        line(60 * m + 40 + i, "media_connected", user(100 + i), role="agent", latency_ms=900.0 + i)
        for i in range(10)
    ]


def expected(files: list[list[str]], late: set[str]) -> dict[int, dict[str, Any]]:
    """The per-minute count of the lines written, by the definitions, in plain Python."""
    seen: set[str] = set()
    rows: dict[int, dict[str, Any]] = defaultdict(
        lambda: {"handovers": 0, "disconnections": 0, "lat": [], "users": set()}
    )
    for lines in files:
        for raw in lines:
            if raw in seen or raw in late:
                continue
            seen.add(raw)
            r = json.loads(raw)
            ts = (_ms(r["ts"]) - T0_MS) // 1000
            row = rows[ts // 60]
            if r["event"] == "session_reinvited" and r["role"] == "broker":
                row["handovers"] += 1
            if r["event"] == "media_disconnected" and r.get("reason") != "session ended":
                row["disconnections"] += 1
            if r["event"] == "media_connected" and r["role"] == "agent":
                row["lat"].append(r["latency_ms"])
                row["users"].add(r["uri"])
    return rows


def _ms(text: str) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_live_minutes_match_an_independent_count(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from analytics.watch import WatchConfig, start

    logs, out = tmp_path / "logs", tmp_path / "out"
    logs.mkdir()
    printed: list[str] = []
    cfg = WatchConfig(watermark=f"{WATERMARK_S} seconds", storm_users=STORM_USERS, trigger_s=0.5)
    query = start(spark, str(logs), str(out), cfg, echo=printed.append)

    def add(name: str, lines: list[str]) -> None:
        # Written aside and renamed in: the file source must never see half a file.
        tmp = logs / f".{name}.tmp"
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.rename(logs / name)
        query.processAllAvailable()

    try:
        first = minute_lines(0) + minute_lines(1) + storm_lines(1)
        add("churn.log.1", first)
        # Rotation: churn.log.1 becomes churn.log.2, a "new" file with the same lines.
        add("churn.log.2", first)
        second = minute_lines(2) + minute_lines(3)
        add("churn.log.3", second)
        # A line for minute 0 arriving after the watermark (3 min behind 3:59) passed it.
        late = line(30.5, "session_reinvited", user(7), role="broker")
        # And a line far ahead, so the watermark passes minute 3 and it is final.
        ahead = line(60 * 10, "registered", user(0), role="broker")
        add("churn.log.4", [late, ahead])
        deadline = time.monotonic() + 120
        got: dict[int, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            # Minutes are written once the watermark passed them: a batch after the data.
            query.processAllAvailable()
            if (out / "minutes").exists():
                rows = pq.read_table(out / "minutes").to_pylist()
                got = {int((r["minute"].timestamp() * 1000 - T0_MS) // 60_000): r for r in rows}
            if {0, 1, 2, 3} <= set(got):
                break
        assert query.exception() is None
    finally:
        query.stop()

    want = expected([first, first, second, [late]], late={late})
    assert sorted(got) == [0, 1, 2, 3], got  # minute 10 is not final yet
    for m in range(4):
        g, w = got[m], want[m]
        assert g["handovers"] == w["handovers"], (m, g, w)
        assert g["disconnections"] == w["disconnections"], (m, g, w)
        assert g["restores"] == len(w["lat"]), (m, g, w)
        assert g["users_restored"] == len(w["users"]), (m, g, w)
        lat = sorted(w["lat"])
        assert g["restore_p50_ms"] == pytest.approx(_pct(lat, 0.5))
        assert g["restore_p95_ms"] == pytest.approx(_pct(lat, 0.95))
        assert g["storm"] == (len(w["users"]) >= STORM_USERS), (m, g)
    assert [m for m in range(4) if got[m]["storm"]] == [1]
    alerts = pq.read_table(out / "alerts").to_pylist()
    assert len(alerts) == 1 and alerts[0]["users_restored"] == 12
    assert any("STORM: 12 users reconnected" in p for p in printed), printed
    assert sum(1 for p in printed if "handovers 3" in p) == 4, printed


def _pct(xs: list[float], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
