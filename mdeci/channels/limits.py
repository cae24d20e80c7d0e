"""Usage limits per channel, per queue class and global, per day, week and month.

Periods are calendar periods in UTC: a day starts at 00:00 UTC, a week on Monday, a month
on its first day; a limit counts what was sent since the start of the current period. A
limit bounds any of messages, bytes and money; a message is refused on a channel when
sending it would take a counter above its limit. Usage is counted by a
:class:`UsageCounter`: :class:`MemoryUsage` here, ``mdeci.store.usage.SqlUsage`` durably.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Protocol

from mdeci.channels.errors import PolicyError


class Period(enum.Enum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


@dataclass(frozen=True, slots=True)
class Usage:
    """What was sent: messages, bytes and money."""

    messages: int = 0
    bytes: int = 0
    money: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.messages + other.messages, self.bytes + other.bytes, self.money + other.money
        )


def utc_day(at: float) -> date:
    """The UTC calendar day of the Unix time ``at``."""
    return datetime.fromtimestamp(at, UTC).date()


def period_days(period: Period, at: float) -> tuple[date, date]:
    """First day of the period containing ``at`` and first day of the next one (UTC)."""
    day = utc_day(at)
    if period is Period.DAY:
        return day, day + timedelta(days=1)
    if period is Period.WEEK:
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    start = day.replace(day=1)
    nxt = date(start.year + (start.month == 12), start.month % 12 + 1, 1)
    return start, nxt


class UsageCounter(Protocol):
    """Durable (or not) counters of what was sent, bucketed by UTC day.

    ``channel`` or ``qclass`` of ``None`` in :meth:`usage` means "any".
    """

    def add(self, user: str, channel: str, qclass: str, at: float, usage: Usage) -> None:
        """Count ``usage`` sent to ``user`` on ``channel`` for class ``qclass`` at ``at``."""
        ...

    def usage(
        self,
        user: str,
        first_day: date,
        end_day: date,
        *,
        channel: str | None = None,
        qclass: str | None = None,
    ) -> Usage:
        """Total sent to ``user`` on days ``first_day <= day < end_day``."""
        ...


class MemoryUsage:
    """A :class:`UsageCounter` in a dict: for tests and for brokers without a database."""

    def __init__(self) -> None:
        self._buckets: defaultdict[tuple[str, str, str, date], Usage] = defaultdict(Usage)

    def add(self, user: str, channel: str, qclass: str, at: float, usage: Usage) -> None:
        key = (user, channel, qclass, utc_day(at))
        self._buckets[key] = self._buckets[key] + usage

    def usage(
        self,
        user: str,
        first_day: date,
        end_day: date,
        *,
        channel: str | None = None,
        qclass: str | None = None,
    ) -> Usage:
        total = Usage()
        for (u, ch, qc, day), used in self._buckets.items():
            if (
                u == user
                and first_day <= day < end_day
                and channel in (None, ch)
                and qclass in (None, qc)
            ):
                total = total + used
        return total


@dataclass(frozen=True, kw_only=True, slots=True)
class Limit:
    """At most ``messages``/``bytes``/``money`` per ``period`` (``None``: unbounded).

    ``channel`` and ``qclass`` set the scope: both ``None`` is a global limit, only
    ``channel`` a per-channel one, only ``qclass`` a per-class one, both a per-channel-
    and-class one.
    """

    period: Period
    channel: str | None = None
    qclass: str | None = None
    messages: int | None = None
    bytes: int | None = None
    money: float | None = None

    def __post_init__(self) -> None:
        if self.messages is None and self.bytes is None and self.money is None:
            raise PolicyError("a limit must bound messages, bytes or money")
        for what, value in (("messages", self.messages), ("bytes", self.bytes)):
            if value is not None and value < 0:
                raise PolicyError(f"limit {what} must be >= 0")
        if self.money is not None and not (self.money >= 0 and math.isfinite(self.money)):
            raise PolicyError("limit money must be finite and >= 0")

    def applies(self, channel: str, qclass: str) -> bool:
        return self.channel in (None, channel) and self.qclass in (None, qclass)

    def allows(self, used: Usage, extra: Usage) -> bool:
        """Whether ``used + extra`` stays within every bound of this limit."""
        total = used + extra
        return not (
            (self.messages is not None and total.messages > self.messages)
            or (self.bytes is not None and total.bytes > self.bytes)
            # A nano-unit of slack: money is summed in floats.
            or (self.money is not None and total.money > self.money + 1e-9)
        )

    def describe(self) -> str:
        scope = f"channel={self.channel or '*'} class={self.qclass or '*'}"
        bounds = ", ".join(
            f"{k}<={v}"
            for k, v in (("messages", self.messages), ("bytes", self.bytes), ("money", self.money))
            if v is not None
        )
        return f"{self.period.value} limit ({scope}: {bounds})"


def first_exceeded(
    limits: Iterable[Limit],
    usage: UsageCounter,
    *,
    user: str,
    channel: str,
    qclass: str,
    extra: Usage,
    now: float,
) -> Limit | None:
    """The first limit that sending ``extra`` on ``channel`` now would exceed, or ``None``."""
    for limit in limits:
        if not limit.applies(channel, qclass):
            continue
        first, end = period_days(limit.period, now)
        used = usage.usage(user, first, end, channel=limit.channel, qclass=limit.qclass)
        if not limit.allows(used, extra):
            return limit
    return None
