"""Usage limits per channel, per queue class and global, per day, week and month.

Periods are calendar periods in UTC: a day starts at 00:00 UTC, a week on Monday, a month
on its first day; a limit counts what was sent since the start of the current period. A
limit bounds any of messages, bytes and money; a message is refused on a channel when
sending it would take a counter above its limit. Usage is counted by a
:class:`UsageCounter`: :class:`MemoryUsage` here, ``mdeci.store.usage.SqlUsage`` durably.
"""

from __future__ import annotations

import enum
import functools
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


_EPOCH = date(1970, 1, 1)


def utc_day(at: float) -> date:
    """The UTC calendar day of the Unix time ``at``."""
    return _day_number(int(at // 86400))


@functools.lru_cache(maxsize=64)
def _day_number(epoch_day: int) -> date:
    # Memoised: every send of a day asks for the same date, and datetime.fromtimestamp
    # per send would be a visible part of record_send.
    return datetime.fromtimestamp(epoch_day * 86400, UTC).date()


def period_days(period: Period, at: float) -> tuple[date, date]:
    """First day of the period containing ``at`` and first day of the next one (UTC)."""
    return period_of_day(period, int(at // 86400))


@functools.lru_cache(maxsize=256)
def period_of_day(period: Period, epoch_day: int) -> tuple[date, date]:
    """:func:`period_days` for UTC day number ``epoch_day`` (days since 1970-01-01);
    memoised: every message of a day asks the same question."""
    day = _EPOCH + timedelta(days=epoch_day)
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

    def allows_more(self, used: Usage, messages: int, nbytes: int, money: float) -> bool:
        """:meth:`allows` for ``used`` plus these amounts, without building a Usage."""
        return not (
            (self.messages is not None and used.messages + messages > self.messages)
            or (self.bytes is not None and used.bytes + nbytes > self.bytes)
            or (self.money is not None and used.money + money > self.money + 1e-9)
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


_Window = tuple[str, date, date, str | None, str | None]
_NOTHING = Usage()


class CachedUsage:
    """A :class:`UsageCounter` that remembers period sums in front of another one.

    Each distinct question (user, period, channel, class) is asked of ``inner`` once;
    :meth:`add` writes through and adds the new usage to every remembered sum it falls
    in, so the cache stays exact without re-reading. Valid while this object is the only
    writer of ``inner`` (one broker per database); :meth:`clear` forgets everything.
    At most ``max_entries`` sums are kept (all are dropped when full).

    :meth:`added` (what was added for a user since :attr:`epoch` began) lets the
    selector keep a decision while the usage added since cannot have changed it
    (``select`` docstring). Counts only grow (usage added is never negative).
    """

    def __init__(self, inner: UsageCounter, *, max_entries: int = 100_000) -> None:
        self.inner = inner
        self.max_entries = max_entries
        self._sums: dict[_Window, Usage] = {}
        self._by_user: defaultdict[str, set[_Window]] = defaultdict(set)
        self.misses = 0
        #: Bumped by :meth:`clear` (sums may then be read again with other values).
        self.epoch = 0
        self._added: dict[str, Usage] = {}

    def added(self, user: str) -> Usage:
        """Everything :meth:`add` counted for ``user`` (any channel, class, day) since
        the current :attr:`epoch` began."""
        return self._added.get(user, _NOTHING)

    def clear(self) -> None:
        self._sums.clear()
        self._by_user.clear()
        self._added.clear()
        self.epoch += 1

    def add(self, user: str, channel: str, qclass: str, at: float, usage: Usage) -> None:
        self._added[user] = self._added.get(user, _NOTHING) + usage
        self.inner.add(user, channel, qclass, at, usage)
        day = utc_day(at)
        for key in self._by_user.get(user, ()):
            _, first, end, ch, qc = key
            if first <= day < end and ch in (None, channel) and qc in (None, qclass):
                self._sums[key] = self._sums[key] + usage

    def usage(
        self,
        user: str,
        first_day: date,
        end_day: date,
        *,
        channel: str | None = None,
        qclass: str | None = None,
    ) -> Usage:
        key = (user, first_day, end_day, channel, qclass)
        found = self._sums.get(key)
        if found is None:
            self.misses += 1
            found = self.inner.usage(user, first_day, end_day, channel=channel, qclass=qclass)
            if len(self._sums) >= self.max_entries:
                self.clear()
            self._sums[key] = found
            self._by_user[user].add(key)
        return found
