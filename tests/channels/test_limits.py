"""Limits per channel, per class and global; durable counts (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime

import pytest

from mdeci.channels import (
    CHEAPEST,
    Channel,
    ClassPolicy,
    Kind,
    Limit,
    NoChannel,
    Outgoing,
    Period,
    SelectorPolicy,
    SendNow,
    Tariff,
    Usage,
    period_days,
    record_send,
    select,
)
from mdeci.store.usage import SqlUsage
from tests.channels.conftest import Reopen

USER = "sip:alice@example.org"
# Wednesday 2025-01-15 12:00 UTC
T0 = datetime(2025, 1, 15, 12, tzinfo=UTC).timestamp()
DAY = 86400.0

SMS = Channel(name="sms", kind=Kind.SMS, tariff=Tariff(price=0.05), latency_ms=10_000)
GPRS = Channel(name="gprs", tariff=Tariff(price=0.10), latency_ms=500)
# Cheapest-first, so SMS (0.05) beats GPRS (0.10) until a limit says otherwise.
URGENT = {
    "urgent": ClassPolicy(weights=CHEAPEST, kinds=frozenset(Kind)),
    "normal": ClassPolicy(weights=CHEAPEST),
}


def _send(policy: SelectorPolicy, counter: object, at: float, qclass: str = "urgent") -> object:
    msg = Outgoing(user=USER, qclass=qclass, size=100, first_seen=at)
    decision = select(policy, msg, available={"sms", "gprs"}, usage=counter, now=at)  # type: ignore[arg-type]
    if isinstance(decision, SendNow):
        record_send(counter, msg, decision, at=at)  # type: ignore[arg-type]
    return decision


def test_periods_are_utc_calendar_periods() -> None:
    assert period_days(Period.DAY, T0) == (date(2025, 1, 15), date(2025, 1, 16))
    assert period_days(Period.WEEK, T0) == (date(2025, 1, 13), date(2025, 1, 20))
    assert period_days(Period.MONTH, T0) == (date(2025, 1, 1), date(2025, 2, 1))
    dec = datetime(2025, 12, 31, 23, 59, tzinfo=UTC).timestamp()
    assert period_days(Period.MONTH, dec) == (date(2025, 12, 1), date(2026, 1, 1))


def test_channel_over_monthly_limit_is_skipped_and_count_survives_restart(
    counter_factory: Reopen,
) -> None:
    # SMS is the best channel (cheaper), but at most 3 SMS a month.
    policy = SelectorPolicy(
        channels=(SMS, GPRS),
        classes=URGENT,
        limits=(Limit(period=Period.MONTH, channel="sms", messages=3),),
    )
    counter = counter_factory()
    picks = [_send(policy, counter, T0 + i * DAY) for i in range(2)]
    assert [p.channel.name for p in picks] == ["sms", "sms"]  # type: ignore[attr-defined]

    counter = counter_factory()  # the broker restarts
    third = _send(policy, counter, T0 + 2 * DAY)
    assert isinstance(third, SendNow) and third.channel.name == "sms"

    counter = counter_factory()  # and again
    fourth = _send(policy, counter, T0 + 3 * DAY)
    assert isinstance(fourth, SendNow) and fourth.channel.name == "gprs"
    month = period_days(Period.MONTH, T0)
    assert counter.usage(USER, *month, channel="sms") == Usage(3, 300, pytest.approx(0.15))  # type: ignore[arg-type]

    # A new month: SMS again.
    feb = datetime(2025, 2, 1, tzinfo=UTC).timestamp()
    fifth = _send(policy, counter, feb)
    assert isinstance(fifth, SendNow) and fifth.channel.name == "sms"


def test_global_money_limit_blocks_everything_and_says_why(counter_factory: Reopen) -> None:
    policy = SelectorPolicy(
        channels=(SMS, GPRS),
        classes=URGENT,
        limits=(Limit(period=Period.DAY, money=0.20),),
    )
    counter = counter_factory()
    names = []
    for i in range(5):
        d = _send(policy, counter, T0 + i)
        names.append(d.channel.name if isinstance(d, SendNow) else None)
    # 0.05 * 4 = 0.20; the fifth SMS would cost 0.25 > 0.20, and GPRS is dearer.
    assert names == ["sms", "sms", "sms", "sms", None]
    blocked = _send(policy, counter, T0 + 10)
    assert isinstance(blocked, NoChannel)
    assert dict(blocked.blocked).keys() == {"sms", "gprs"}
    assert "money<=0.2" in dict(blocked.blocked)["sms"]
    # Next day the daily limit resets.
    assert isinstance(_send(policy, counter, T0 + DAY), SendNow)


def test_per_class_and_weekly_byte_limits(counter_factory: Reopen) -> None:
    policy = SelectorPolicy(
        channels=(GPRS, SMS),
        classes=URGENT,
        limits=(
            Limit(period=Period.WEEK, qclass="normal", bytes=250),
            Limit(period=Period.WEEK, channel="gprs", qclass="urgent", messages=1),
        ),
    )
    counter = counter_factory()
    normal = [_send(policy, counter, T0 + i, qclass="normal") for i in range(3)]
    assert [isinstance(d, SendNow) for d in normal] == [True, True, False]
    urgent = [_send(policy, counter, T0 + i, qclass="urgent") for i in range(3)]
    # Urgent on GPRS is over its limit (1/week) after the first; SMS takes over.
    assert [d.channel.name for d in urgent] == ["sms", "sms", "sms"]  # type: ignore[attr-defined]
    # (SMS wins on score anyway here; check the GPRS/urgent limit directly.)
    policy_gprs_only = SelectorPolicy(channels=(GPRS,), classes=URGENT, limits=policy.limits)
    first = _send(policy_gprs_only, counter, T0 + 5)
    second = _send(policy_gprs_only, counter, T0 + 6)
    assert isinstance(first, SendNow) and isinstance(second, NoChannel)
    # Monday of the next week: both reset.
    monday = datetime(2025, 1, 20, tzinfo=UTC).timestamp()
    assert isinstance(_send(policy_gprs_only, counter, monday), SendNow)


def test_spend_report(sql_factory: Callable[[], SqlUsage]) -> None:
    counter = sql_factory()
    counter.add(USER, "sms", "urgent", T0, Usage(2, 280, 0.003))
    counter.add(USER, "sms", "normal", T0 + DAY, Usage(1, 140, 0.0015))
    counter.add("sip:bob@x", "gprs", "bulk", T0, Usage(1, 1000, 0.0000048))
    first, end = period_days(Period.MONTH, T0)
    report = counter.spend(first, end)
    assert [(r.user, r.channel, r.messages, r.bytes) for r in report] == [
        ("sip:alice@example.org", "sms", 3, 420),
        ("sip:bob@x", "gprs", 1, 1000),
    ]
    assert report[0].money == pytest.approx(0.0045)
    assert report[1].money == pytest.approx(0.0000048)
    assert counter.spend(first, end, user="sip:bob@x")[0].channel == "gprs"
