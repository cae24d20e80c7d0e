"""The wall-clock uses of the cores across a jump of one hour, forward and backward.

Each test runs a core on a fake wall clock that jumps as NTP or a resumed VM makes it
jump, and asserts the behaviour docs/faults.md ("Clock jumps") chooses: subscription TTLs
and usage limits follow the wall clock (they are absolute times and calendar periods,
stored in SQL and shared across restarts), the churn log stamps what the clock says in
the order things happen. The agent's timers must not follow the wall clock at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mdeci.agent import Agent
from mdeci.broker import MemorySink
from mdeci.channels.limits import (
    CachedUsage,
    Limit,
    MemoryUsage,
    Period,
    Usage,
    UsageCounter,
    first_exceeded,
)
from mdeci.churnlog import ChurnLog, Event, Role
from mdeci.store.base import make_engine
from mdeci.store.repo import BrokerStore
from mdeci.store.usage import SqlUsage
from tests.agent.farend import agent_config, lo_only
from tests.broker.conftest import FakeClock, make_broker
from tests.broker.core_helpers import publish, queued, subscribe
from tests.store.conftest import sqlite_path, sqlite_template  # noqa: F401

HOUR = 3600.0
ALICE = "sip:alice@example.com"
BOB = "sip:bob@example.com"
USER = "sip:alice@example.com"
ONE = Usage(messages=1, bytes=100)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# ---------------------------------------------------------------- subscription TTLs


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[BrokerStore]:
    """A BrokerStore on a fresh migrated SQLite file."""
    engine = make_engine(f"sqlite:///{request.getfixturevalue('sqlite_path')}")
    try:
        yield BrokerStore(engine)
    finally:
        engine.dispose()


def test_a_forward_jump_expires_the_subscriptions_it_passes(
    store: BrokerStore,
) -> None:
    clock, sink = FakeClock(), MemorySink()
    broker = make_broker(store, clock, sink)
    short = subscribe(broker, ALICE, "a", ttl=1800)  # remaining life shorter than the jump
    subscribe(broker, BOB, "a", ttl=7200)  # longer than the jump
    assert publish(broker, "before", "a").matched == 2
    clock.advance(HOUR)
    assert publish(broker, "after", "a").matched == 1
    assert [e.uri for e in sink.named("subscription_expired")] == [ALICE]
    assert int(short.sub_id) not in broker.matcher
    # What was queued before the jump is still delivered (expiry stops matching only).
    assert [q[1] for q in queued(store, ALICE)] == ["before"]
    assert [q[1] for q in queued(store, BOB)] == ["before", "after"]


def test_a_backward_jump_lengthens_a_subscription_by_the_jump(
    store: BrokerStore,
) -> None:
    clock, sink = FakeClock(), MemorySink()
    broker = make_broker(store, clock, sink)
    sub = subscribe(broker, ALICE, "a", ttl=1800)
    clock.advance(-HOUR)
    clock.advance(1800)  # the TTL's 30 minutes passed, but the clock names an earlier time
    assert publish(broker, "m1", "a").matched == 1
    assert broker.sweep() == []
    clock.advance(HOUR)  # the clock reaches the absolute expires_at
    assert publish(broker, "m2", "a").matched == 0
    assert [e.uri for e in sink.named("subscription_expired")] == [ALICE]
    assert int(sub.sub_id) not in broker.matcher


def test_a_forward_jump_lets_the_sweep_remove_what_it_passed(
    store: BrokerStore,
) -> None:
    clock, sink = FakeClock(), MemorySink()
    broker = make_broker(store, clock, sink)
    subscribe(broker, ALICE, "a", ttl=1800)
    subscribe(broker, BOB, "b", ttl=7200)
    clock.advance(HOUR)
    assert [s.uri for s in broker.sweep()] == [ALICE]
    assert len(broker.matcher) == 1


# ---------------------------------------------------------------- limits per day / month


KINDS = ["memory", "cached", "sql"]


def _counter(kind: str, request: pytest.FixtureRequest) -> UsageCounter:
    if kind == "memory":
        return MemoryUsage()
    if kind == "cached":
        return CachedUsage(MemoryUsage())
    broker_store: BrokerStore = request.getfixturevalue("store")
    return SqlUsage(broker_store.engine)


def _refused(usage: UsageCounter, limit: Limit, now: float) -> bool:
    found = first_exceeded(
        [limit], usage, user=USER, channel="sms", qclass="default", extra=ONE, now=now
    )
    return found is not None


def _send(usage: UsageCounter, now: float, count: int = 1) -> None:
    for _ in range(count):
        usage.add(USER, "sms", "default", now, ONE)


# (period, a wall time 30 minutes before the period's end, that period's first day)
BOUNDARIES = [
    (Period.DAY, "2026-11-27T23:30:00"),
    (Period.MONTH, "2026-11-30T23:30:00"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("period", "before_end"), BOUNDARIES)
def test_a_forward_jump_across_a_period_end_starts_the_next_period(
    kind: str, period: Period, before_end: str, request: pytest.FixtureRequest
) -> None:
    usage = _counter(kind, request)
    limit = Limit(period=period, channel="sms", messages=3)
    now = _epoch(before_end)
    _send(usage, now, 3)
    assert _refused(usage, limit, now)
    now += HOUR  # 00:30 of the next day (and month)
    assert not _refused(usage, limit, now)  # a new period: its count starts at zero
    _send(usage, now, 3)
    assert _refused(usage, limit, now)
    # The earlier sends stay counted in the period they were made in.
    assert _refused(usage, limit, now - HOUR)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("period", "before_end"), BOUNDARIES)
def test_a_backward_jump_across_a_period_start_counts_against_the_previous_period(
    kind: str, period: Period, before_end: str, request: pytest.FixtureRequest
) -> None:
    usage = _counter(kind, request)
    limit = Limit(period=period, channel="sms", messages=3)
    earlier = _epoch(before_end)
    _send(usage, earlier, 2)  # the previous period already holds 2 of 3
    now = earlier + HOUR  # 00:30 of the new period
    _send(usage, now, 3)
    assert _refused(usage, limit, now)
    now -= HOUR  # back to 23:30 of the previous period
    assert not _refused(usage, limit, now)  # 1 left there, not 3: its own sends count
    _send(usage, now, 1)
    assert _refused(usage, limit, now)
    assert _refused(usage, limit, now + HOUR)  # the new period keeps its 3


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jump", [HOUR, -HOUR])
def test_a_jump_inside_a_period_changes_no_limit(
    kind: str, jump: float, request: pytest.FixtureRequest
) -> None:
    usage = _counter(kind, request)
    day = Limit(period=Period.DAY, channel="sms", messages=3)
    month = Limit(period=Period.MONTH, channel="sms", messages=5)
    now = _epoch("2026-11-27T12:00:00")
    _send(usage, now, 3)
    assert _refused(usage, day, now)
    now += jump
    assert _refused(usage, day, now)
    assert not _refused(usage, month, now)
    _send(usage, now, 2)
    assert _refused(usage, month, now)


# ---------------------------------------------------------------- churn log timestamps


@pytest.mark.parametrize("jump", [HOUR, -HOUR])
def test_the_churn_log_stamps_what_the_clock_says_in_the_order_written(
    tmp_path: Path, jump: float
) -> None:
    clock = FakeClock(_epoch("2026-11-27T12:00:00"))
    path = tmp_path / "churn.jsonl"
    with ChurnLog(path, "broker-1", clock, role=Role.BROKER) as log:
        log.add(Event.MEDIA_CONNECTED, ALICE, {"addr": "127.0.0.1:9"})
        clock.advance(jump)
        log.add(Event.MEDIA_DISCONNECTED, ALICE, {"reason": "timeout"})
        clock.advance(0.001)
        log.add(Event.MEDIA_CONNECTED, ALICE, {"addr": "127.0.0.1:9"})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["event"] for r in records] == [
        "media_connected",
        "media_disconnected",
        "media_connected",
    ]
    hour = "13" if jump > 0 else "11"
    assert [r["ts"] for r in records] == [
        "2026-11-27T12:00:00.000Z",
        f"2026-11-27T{hour}:00:00.000Z",
        f"2026-11-27T{hour}:00:00.001Z",
    ]


# ---------------------------------------------------------------- agent timers


class JumpingClock:
    """A wall clock in epoch seconds that moves with real time (the loop's clock from a
    fixed epoch) and jumps by the ``offset`` a test sets."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return asyncio.get_running_loop().time() + 1_795_000_000.0 + self.offset


async def test_a_backward_wall_clock_jump_does_not_delay_the_agents_timers(
    tmp_path: Path,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    config = agent_config(tmp_path / "alice", "alice", "127.0.0.2", port)
    config = dataclasses.replace(
        config,
        sip=dataclasses.replace(config.sip, t1=0.5, t2=4.0, t4=5.0),  # 32 s transactions
        reconnect=dataclasses.replace(config.reconnect, warn_after=0.5),
    )
    clock = JumpingClock()
    agent = Agent(config, clock=clock, address_source=lo_only)
    await agent.start()
    try:
        clock.offset = -HOUR  # the REGISTER is on its way; warn_after is 0.5 s away
        await asyncio.wait_for(
            agent.wait_until(lambda: "unreachable" in agent.status().alerts), 5.0
        )
    finally:
        await agent.close(clean=False)
