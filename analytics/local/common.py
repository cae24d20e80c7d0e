"""What the local tables share: the definitions of :mod:`analytics.jobs` on one event (a
dict of the event's fields and ``ts_ms``), and Spark's arithmetic where Python's differs
(exact percentiles, half-up rounding, a double as text)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from analytics import jobs
from analytics import schema as S

Event = dict[str, Any]
Row = dict[str, Any]

_AGENT_EVENTS = frozenset(S.AGENT_EVENTS)
_V4 = re.compile(r"^(\d{1,3}\.\d{1,3}\.\d{1,3})\.\d{1,3}(:\d+)?$", re.ASCII)
_V6 = re.compile(r"^\[([^\]]+)\](:\d+)?$", re.ASCII)


def is_fact(e: Event) -> bool:
    """The line counts: its role is its event's authority, or it has none (jobs.is_fact)."""
    role = e["role"]
    if role is None:
        return True
    return bool(role == ("agent" if e["event"] in _AGENT_EVENTS else "broker"))


def device(e: Event) -> bool:
    """The device wrote the line (or it has no role)."""
    return e["role"] is None or e["role"] == "agent"


def restore_ms(e: Event) -> float | None:
    """``latency_ms`` of a restore (jobs.restore_ms), else None."""
    if e["event"] == "media_connected" and device(e):
        value: float | None = e["latency_ms"]
        return value
    return None


def within(window: jobs.TimeWindow) -> Callable[[int], bool]:
    """True for an instant in ``[since, until)``."""
    lo = window.since_ms
    hi = window.until_ms
    if lo is None and hi is None:
        return lambda _ms: True
    if hi is None:
        return lambda ms: ms >= lo  # type: ignore[operator]
    if lo is None:
        return lambda ms: ms < hi
    return lambda ms: lo <= ms < hi


def in_window(events: Iterable[Event], window: jobs.TimeWindow) -> list[Event]:
    inside = within(window)
    return [e for e in events if inside(e["ts_ms"])]


def subnet_of(addr: str | None) -> str | None:
    """``a.b.c.0/24`` for an IPv4 ``ip:port``, else the address without its port."""
    if addr is None:
        return None
    m = _V4.match(addr)
    if m is not None and m.group(1):
        return m.group(1) + ".0/24"
    m = _V6.match(addr)
    if m is not None and m.group(1):
        return m.group(1)
    return addr


def hour_of(ms: int) -> int:
    return ms - ms % jobs.HOUR_MS


def percentile(values: list[float], q: float) -> float | None:
    """Spark's exact ``percentile``: linear interpolation between closest ranks, with its
    own formula (the same doubles, not merely close ones)."""
    if not values:
        return None
    xs = sorted(values)
    position = q * (len(xs) - 1)
    lower = math.floor(position)
    higher = math.ceil(position)
    lo, hi = xs[lower], xs[higher]
    if higher == lower or lo == hi:
        return float(lo)
    return (higher - position) * lo + (position - lower) * hi


def spark_round(value: float | None, scale: int) -> float | None:
    """Spark's ``round``: half up, on the decimal the double prints as."""
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return value
    step = Decimal(1).scaleb(-scale)
    return float(Decimal(repr(value)).quantize(step, rounding=ROUND_HALF_UP))


def double_text(value: float) -> str:
    """A double cast to text as Spark (Java) writes it: ``123.4``, ``1.0E7``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        text = repr(value)
        if "e" in text:  # repr prints some of these in exponent form
            text = f"{Decimal(text):f}"
        return text if "." in text else text + ".0"
    number = Decimal(repr(value))
    digits = "".join(map(str, number.as_tuple().digits)).rstrip("0") or "0"
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{number.adjusted()}"


def by_user(events: Iterable[Event], key: Callable[[Event], Any]) -> dict[str, list[Event]]:
    """The events of each user, sorted by ``key`` (a stable sort: ties keep file order)."""
    users: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        users[e["uri"]].append(e)
    for lines in users.values():
        lines.sort(key=key)
    return users


def ordered(rows: list[Row], *keys: tuple[str, bool]) -> list[Row]:
    """``rows`` sorted as ``jobs.ordered`` sorts (each key ascending or, with True,
    descending; nulls first ascending and last descending, as Spark sorts them)."""
    for name, descending in reversed(keys):
        rows.sort(
            key=lambda r, n=name: (r[n] is not None, r[n] if r[n] is not None else 0),  # type: ignore[misc]
            reverse=descending,
        )
    return rows
