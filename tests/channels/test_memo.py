"""select's memo (with a CachedUsage) answers exactly what a fresh computation does:
the same decisions, step by step, as the same policy against plain counters, while
sends bring limits closer, across day, week and month boundaries and a clear()."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from mdeci.channels import (
    Channel,
    ClassPolicy,
    Kind,
    Limit,
    MemoryUsage,
    Outgoing,
    Period,
    SelectorPolicy,
    SendNow,
    Tariff,
    WeeklyCalendar,
    record_send,
    select,
)
from mdeci.channels.limits import CachedUsage

T0 = datetime(2025, 1, 30, 20, tzinfo=UTC).timestamp()  # month and week end within days
CHANNELS = (
    Channel(name="wifi", latency_ms=20, energy_mw=800),
    Channel(name="mno", tariff=Tariff(price=0.001), latency_ms=250, energy_mw=1500),
    Channel(name="sms", kind=Kind.SMS, tariff=Tariff(price=0.05), latency_ms=10_000),
)
CLASSES = {
    "urgent": ClassPolicy(kinds=frozenset(Kind)),
    "normal": ClassPolicy(),
    "bulk": ClassPolicy(max_delay=600),
}
LIMITS = (
    Limit(period=Period.MONTH, channel="sms", messages=7, money=0.3),
    Limit(period=Period.DAY, qclass="bulk", bytes=3000),
    Limit(period=Period.WEEK, money=0.4),
    Limit(period=Period.DAY, channel="mno", messages=9),
)
CAL = WeeklyCalendar.constant({"wifi": 0.3})


def _policy() -> SelectorPolicy:
    return SelectorPolicy(channels=CHANNELS, classes=CLASSES, limits=LIMITS)


def _run(rng: random.Random, steps: int, gaps: tuple[float, ...], sizes: Callable[[], int]) -> None:
    """``steps`` random messages, ``gaps`` seconds apart: the memoised policy over a
    :class:`CachedUsage` decides as a fresh one over plain counters, while most sends are
    counted on both and the cache is cleared half-way."""
    memo_policy, fresh_policy = _policy(), _policy()
    cached, plain = CachedUsage(MemoryUsage()), MemoryUsage()
    now = T0
    for step in range(steps):
        now += rng.choice(gaps)
        msg = Outgoing(
            user=rng.choice(("sip:a@x", "sip:b@x")),
            qclass=rng.choice(tuple(CLASSES)),
            size=sizes(),
            first_seen=now - rng.choice((0.0, 100.0, 1000.0)),
        )
        available = rng.choice(({"mno", "sms"}, {"sms"}, {"wifi", "mno", "sms"}, set()))
        got = select(memo_policy, msg, available=available, usage=cached, now=now, calendar=CAL)
        want = select(fresh_policy, msg, available=available, usage=plain, now=now, calendar=CAL)
        assert got == want, f"step {step}"
        if isinstance(got, SendNow) and rng.random() < 0.8:
            record_send(cached, msg, got, at=now)
            record_send(plain, msg, got, at=now)
        if step == steps // 2:
            cached.clear()


@pytest.mark.parametrize("seed", range(6))
def test_memoised_decisions_equal_fresh_ones(seed: int) -> None:
    rng = random.Random(seed)
    _run(rng, 400, (1.0, 60.0, 3600.0, 4 * 3600.0), lambda: rng.choice((100, 512, 900)))


def test_a_repeated_question_is_answered_from_the_memo() -> None:
    policy = _policy()
    inner = MemoryUsage()
    cached = CachedUsage(inner)
    msg = Outgoing(user="sip:a@x", qclass="urgent", size=100, first_seen=T0)
    first = select(policy, msg, available={"sms"}, usage=cached, now=T0)  # from the rooms
    misses = cached.misses
    second = select(policy, msg, available={"sms"}, usage=cached, now=T0)  # kept now
    assert second == first
    assert select(policy, msg, available={"sms"}, usage=cached, now=T0) is second
    assert cached.misses == misses  # no counter was read again


@pytest.mark.parametrize("seed", range(6))
def test_every_size_new_decisions_equal_fresh_ones(seed: int) -> None:
    """The first-ask path (rooms per user, class and day; no ranking kept) near limits:
    sizes around the bytes limit's room, money close to the bound."""
    rng = random.Random(100 + seed)
    _run(
        rng,
        600,
        (1.0, 60.0, 3600.0, 6 * 3600.0),
        lambda: rng.randint(1, 3000) if rng.random() < 0.7 else rng.randint(1, 40),
    )
