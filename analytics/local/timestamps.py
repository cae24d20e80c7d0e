"""Spark's reading of a ``ts`` text as a timestamp (``try_to_timestamp`` with no format).

:func:`analytics.parse._ts_ms` casts ``ts`` with Spark's own parser, which takes more
than RFC 3339 (``2024-03-04``, ``2024-03-04 10:00``, a region zone after the seconds)
and refuses some of it (``10:00Z`` without seconds). A line's validity must not depend
on the engine, so this is a port of that parser's rules: segments of digits split by
``- - T|space : : .``, a zone after the seconds, a session zone of UTC, the fraction
truncated to microseconds, and the instant floored to milliseconds (``unix_millis``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache

# The canonical form the broker and the agents write: most lines take this path.
_CANONICAL = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z", re.ASCII)
_DAY_MS = 86_400_000
_DIGITS = frozenset(b"0123456789")
# java.time.ZoneId.SHORT_IDS, which Spark passes to ZoneId.of.
_SHORT_IDS = {
    "ACT": "Australia/Darwin",
    "AET": "Australia/Sydney",
    "AGT": "America/Argentina/Buenos_Aires",
    "ART": "Africa/Cairo",
    "AST": "America/Anchorage",
    "BET": "America/Sao_Paulo",
    "BST": "Asia/Dhaka",
    "CAT": "Africa/Harare",
    "CNT": "America/St_Johns",
    "CST": "America/Chicago",
    "CTT": "Asia/Shanghai",
    "EAT": "Africa/Addis_Ababa",
    "ECT": "Europe/Paris",
    "IET": "America/Indiana/Indianapolis",
    "IST": "Asia/Kolkata",
    "JST": "Asia/Tokyo",
    "MIT": "Pacific/Apia",
    "NET": "Asia/Yerevan",
    "NST": "Pacific/Auckland",
    "PLT": "Asia/Karachi",
    "PNT": "America/Phoenix",
    "PRT": "America/Puerto_Rico",
    "PST": "America/Los_Angeles",
    "SST": "Pacific/Guadalcanal",
    "VST": "Asia/Ho_Chi_Minh",
    "EST": "-05:00",
    "MST": "-07:00",
    "HST": "-10:00",
}
_OFFSET = re.compile(r"([+-])(\d{1,2})(?::?(\d\d)(?::?(\d\d))?)?", re.ASCII)


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days from 1970-01-01 to the proleptic Gregorian date (any year, as java.time)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _month_days(y: int, m: int) -> int:
    if m == 2:
        return 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28
    return 30 if m in (4, 6, 9, 11) else 31


def ts_ms(text: str) -> int | None:
    """Epoch milliseconds of ``text`` as Spark reads it in a UTC session; None if not a time."""
    m = _CANONICAL.fullmatch(text)
    if m is not None:
        y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
        frac = m.group(7) or ""
        if not (1 <= mo <= 12 and 1 <= d <= _month_days(y, mo) and h < 24 and mi < 60 and s < 60):
            return None
        micros = int((frac + "000000")[:6])
        return (
            days_from_civil(y, mo, d) * _DAY_MS + ((h * 60 + mi) * 60 + s) * 1000 + micros // 1000
        )
    return _general(text)


def _general(text: str) -> int | None:
    parsed = _segments(text.encode("utf-8"))
    if parsed is None:
        return None
    seg, zone, just_time = parsed
    y, mo, d, h, mi, s, micros = seg[:7]
    if just_time:
        # A time alone is on today's date in its zone, as Spark reads it.
        today = datetime.now(UTC).date()
        y, mo, d = today.year, today.month, today.day
    if not (1 <= mo <= 12 and 1 <= d <= _month_days(y, mo) and h < 24 and mi < 60 and s < 60):
        return None
    local_ms = days_from_civil(y, mo, d) * _DAY_MS + ((h * 60 + mi) * 60 + s) * 1000
    offset = _offset_ms(zone, y, mo, d, h, mi, s)
    if offset is None:
        return None
    return local_ms - offset + micros // 1000


def _segments(b: bytes) -> tuple[list[int], str | None, bool] | None:
    """Spark's ``parseTimestampString``: the seven segments, the zone text, time only."""

    def valid(segment: int, digits: int) -> bool:
        return (
            segment == 6
            or (segment == 0 and 4 <= digits <= 6)
            or (segment == 7 and digits <= 2)
            or (segment not in (0, 6, 7) and 0 < digits <= 2)
        )

    seg = [1, 1, 1, 0, 0, 0, 0, 0, 0]
    i = value = digits = milli_digits = 0
    tz: str | None = None
    just_time = False
    sign: int | None = None
    j, end = 0, len(b)
    # Spark trims whitespace and ISO control characters at both ends.
    while j < end and (b[j] <= 0x20 or b[j] == 0x7F):
        j += 1
    while end > j and (b[end - 1] <= 0x20 or b[end - 1] == 0x7F):
        end -= 1
    if j < end and b[j] in (0x2D, 0x2B):
        sign = -1 if b[j] == 0x2D else 1
        j += 1
    while j < end:
        c = b[j]
        if c not in _DIGITS:
            ch = chr(c)
            if j == 0 and ch == "T":
                just_time = True
                i += 3
            elif i < 2:
                if ch == "-":
                    if not valid(i, digits):
                        return None
                    seg[i], value, digits = value, 0, 0
                    i += 1
                elif i == 0 and ch == ":" and sign is None:
                    just_time = True
                    if not valid(3, digits):
                        return None
                    seg[3], value, digits = value, 0, 0
                    i = 4
                else:
                    return None
            elif i == 2:
                if ch not in (" ", "T") or not valid(i, digits):
                    return None
                seg[i], value, digits = value, 0, 0
                i += 1
            elif i in (3, 4):
                if ch != ":" or not valid(i, digits):
                    return None
                seg[i], value, digits = value, 0, 0
                i += 1
            elif i in (5, 6):
                if ch == "." and i == 5:
                    if not valid(i, digits):
                        return None
                    seg[i], value, digits = value, 0, 0
                    i += 1
                else:
                    if not valid(i, digits):
                        return None
                    seg[i], value, digits = value, 0, 0
                    i += 1
                    tz = b[j:end].decode("utf-8", "replace")
                    j = end - 1
                if i == 6 and ch != ".":
                    i += 1
            else:
                if i < len(seg) and ch in (":", " "):
                    if not valid(i, digits):
                        return None
                    seg[i], value, digits = value, 0, 0
                    i += 1
                else:
                    return None
        else:
            if i == 6:
                milli_digits += 1
            if i != 6 or digits < 6:
                value = value * 10 + (c - 0x30)
            digits += 1
        j += 1
    if not valid(i, digits):
        return None
    seg[i] = value
    while milli_digits < 6:
        seg[6] *= 10
        milli_digits += 1
    seg[0] *= sign or 1
    return seg, tz, just_time


def _offset_ms(zone: str | None, y: int, mo: int, d: int, h: int, mi: int, s: int) -> int | None:
    """The zone's offset from UTC at that local time, in ms (java.time's ``ZoneId.of``)."""
    if zone is None:
        return 0
    text = zone.strip()
    # Spark's own rewrites before ZoneId.of: (+|-)h:mm and (+|-)hh:m.
    text = re.sub(r"([+-])(\d):", r"\g<1>0\2:", text, count=1)
    text = re.sub(r"([+-])(\d\d):(\d)$", r"\1\2:0\3", text, count=1)
    text = _SHORT_IDS.get(text, text)
    if text == "Z":
        return 0
    if text[:1] in ("+", "-"):
        return _fixed(text)
    for prefix in ("UTC", "GMT", "UT"):
        if text.startswith(prefix):
            rest = text[len(prefix) :]
            if rest == "":
                return 0
            return _fixed(rest) if rest[:1] in ("+", "-") else None
    return _region(text, y, mo, d, h, mi, s)


def _fixed(text: str) -> int | None:
    m = _OFFSET.fullmatch(text)
    if m is None:
        return None
    hh, mm, ss = int(m.group(2)), int(m.group(3) or 0), int(m.group(4) or 0)
    if len(m.group(2)) == 1 and m.group(3) is not None:
        return None  # ZoneOffset.of takes +h alone, not +h:mm
    if hh > 18 or mm > 59 or ss > 59 or (hh == 18 and (mm or ss)):
        return None
    sign = -1 if m.group(1) == "-" else 1
    return sign * ((hh * 60 + mm) * 60 + ss) * 1000


@lru_cache(maxsize=64)
def _zone(name: str) -> object | None:
    from zoneinfo import ZoneInfo

    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9~/._+-]+", name):
        return None
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, KeyError):
        return None


def _region(name: str, y: int, mo: int, d: int, h: int, mi: int, s: int) -> int | None:
    from zoneinfo import ZoneInfo

    zone = _zone(name)
    if not isinstance(zone, ZoneInfo) or not 1 <= y <= 9999:
        return None
    # java.time resolves a local time in a gap by moving it forward and an overlap to the
    # earlier offset: fold=0 does both.
    offset = datetime(y, mo, d, h, mi, s, tzinfo=zone).utcoffset() or timedelta(0)
    return int(offset.total_seconds() * 1000)
