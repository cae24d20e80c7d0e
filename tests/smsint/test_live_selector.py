"""The running broker's channel decisions follow the cost function.

A real broker (SIP, RUDP, SQLite) with alice CONNECTED over IP and an MSISDN in her user
record, bob publishing. Every queued notification goes through the selector with IP and
SMS available: when SMS scores better (IP unreliable), an urgent notification goes on
both (alice's nseq gate hands it to her application once); raising the SMS price or
raising IP's reliability V flips that back to IP alone. Each limit kind stops SMS,
logs it, and tells alice's device with a ``limit`` frame.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from mdeci.agent import Agent
from mdeci.broker.app import RunningBroker
from mdeci.channels import Period, period_days
from mdeci.channels.config import ChannelsConfig, IpConfig, LimitConfig, Scope
from mdeci.sms import segments_needed
from mdeci.sms.smsc import SmscConfig
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    ALICE_NO,
    BROKER_NO,
    Deaf,
    Sink,
    guard,
    ip_back,
    network,
    plain_agent,
    sms_agent,
    sms_config,
    start_broker,
    until,
)

# IP's V barely moves from the configured figure during a test (the live averages are
# tested on their own below): the decisions here are the configured ones.
STILL = 0.001
# Urgent weights (0.1, 0.1, 0.2, 0.6), a 2-SMS frame (170 bytes): f(IP, V = 0.02) = 2.78,
# f(IP, V = 1) = 0.43, f(SMS at $0.0015) = 1.90, f(SMS at $50) = 2.94 (docs/channels.md
# "Worked example").
UNRELIABLE_IP = IpConfig(coverage=0.02)


async def _world(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: Sink,
    channels: ChannelsConfig,
    **sms: object,
) -> tuple[RunningBroker, Agent, Agent]:
    net = network(SmscConfig(time_scale=0.001), 5)  # 1-5 ms, no loss
    broker = await start_broker(
        tmp_path, store, clock, sink, sms_config(**sms), net.gateway(BROKER_NO), channels
    )
    port = broker.sip_addr[1]
    alice = sms_agent(tmp_path, port, net.gateway(ALICE_NO))
    bob = plain_agent(tmp_path, "bob", "127.0.0.4", port)
    await alice.start()
    await bob.start()
    await guard(alice.wait_connected())
    await guard(bob.wait_connected())
    await guard(alice.subscribe("alerts.*"))
    return broker, alice, bob


async def _decided(broker: RunningBroker) -> None:
    """Return once the SMS side decided for everything queued so far: a publish's
    ``pub-ok`` comes after the kick that starts its look (on the database thread)."""
    assert broker.sms is not None
    await guard(broker.sms.idle())


async def _close(broker: RunningBroker, *agents: Agent) -> None:
    for agent in agents:
        await agent.close()
    await broker.close()


@pytest.mark.parametrize(
    ("price", "ip", "by_sms"),
    [
        (0.0015, UNRELIABLE_IP, True),  # IP with V = 0.02: SMS beats it -> both
        (50.0, UNRELIABLE_IP, False),  # the same, SMS at $50: IP alone
        (0.0015, IpConfig(coverage=1.0), False),  # IP reliable: IP alone
    ],
)
async def test_price_and_ip_reliability_flip_the_live_decision(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: Sink,
    price: float,
    ip: IpConfig,
    by_sms: bool,
) -> None:
    channels = ChannelsConfig(ip=ip, alpha=STILL)
    broker, alice, bob = await _world(tmp_path, store, clock, sink, channels, price=price)
    try:
        inbox = alice.listen()
        await guard(bob.publish("alerts.fire", {"level": 3}, b"x" * 50, urgent=True))
        await _decided(broker)
        sent = sink.named("sms_sent")
        assert [e.fields["nseq"] for e in sent] == ([1] if by_sms else [])
        record = await guard(inbox.get())
        assert record["nseq"] == 1
        if by_sms:
            assert "both" in str(sent[0].fields["reason"])
            await guard(alice.wait_event("sms_received", nseq=1))
            await guard(sink.wait_for("notify_delivered", ALICE))
        # A normal one never goes by SMS (its class allows IP only).
        await guard(bob.publish("alerts.info", {}, b"y", urgent=False))
        await _decided(broker)
        record = await guard(inbox.get())
        assert record["nseq"] == 2
        assert len(sink.named("sms_sent")) == len(sent)
        assert [r["nseq"] for r in alice.delivered_since(0)] == [1, 2]  # each once
    finally:
        await _close(broker, alice, bob)


SIZE = 160  # bytes of one test notify frame, give or take a few
PRICE = 0.0015
FRAME_COST = PRICE * segments_needed(SIZE)  # 2 SMS each


def _limit(period: Period, measure: str, scope: str) -> LimitConfig:
    """A limit of this kind that lets exactly two of the test's SMS through."""
    bound: dict[str, object] = {
        "messages": {"messages": 2},
        "bytes": {"bytes": int(2.5 * SIZE)},
        "money": {"money": 2.5 * FRAME_COST},
    }[measure]  # type: ignore[assignment]
    kinds: dict[str, dict[str, object]] = {
        "user": {"scope": Scope.USER, "user": "alice"},
        "class": {"qclass": "urgent"},
        "global": {"scope": Scope.GLOBAL},
    }
    return LimitConfig(period=period, **kinds[scope], **bound)  # type: ignore[arg-type]


@pytest.mark.parametrize("scope", ["user", "class", "global"])
@pytest.mark.parametrize("measure", ["messages", "bytes", "money"])
@pytest.mark.parametrize("period", list(Period))
async def test_each_limit_kind_stops_sms_and_tells_the_device(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: Sink,
    period: Period,
    measure: str,
    scope: str,
) -> None:
    limit = _limit(period, measure, scope)
    channels = ChannelsConfig(ip=UNRELIABLE_IP, alpha=STILL, limits=(limit,))
    broker, alice, bob = await _world(tmp_path, store, clock, sink, channels, price=PRICE)
    try:
        payload = b"x" * 40
        for i in range(3):
            await guard(bob.publish("alerts.fire", {"i": i}, payload, urgent=True))
        await _decided(broker)
        sent = sink.named("sms_sent")
        assert [e.fields["nseq"] for e in sent] == [1, 2]
        for e in sent:
            size, cost = e.fields["bytes"], e.fields["cost"]
            assert isinstance(size, int) and isinstance(cost, float)
            assert segments_needed(size) == segments_needed(SIZE)
            assert abs(size - SIZE) < 0.1 * SIZE
            assert cost == pytest.approx(FRAME_COST)
        blocked = [e for e in sink.named("notify_queued") if e.fields.get("channel") == "sms"]
        assert [e.fields["nseq"] for e in blocked] == [3]
        assert f"{period.value} limit" in str(blocked[0].fields["reason"])
        await guard(alice.wait_until(lambda: bool(alice.limits)))
        (told,) = alice.limits
        assert told.channel == "sms" and told.qclass == "urgent"
        assert told.limit.startswith("global " if scope == "global" else period.value)
        assert told.until == _epoch(period_days(period, clock())[1])  # the period's end
        # IP still delivers all three, once each.
        await guard(alice.wait_until(lambda: len(alice.delivered_since(0)) == 3))
        assert sorted(int(r["nseq"]) for r in alice.delivered_since(0)) == [1, 2, 3]
        # A fourth is refused SMS too, and the device is not told again.
        await guard(bob.publish("alerts.fire", {"i": 4}, payload, urgent=True))
        await _decided(broker)
        assert len(sink.named("sms_sent")) == 2
        await guard(alice.wait_until(lambda: len(alice.delivered_since(0)) == 4))
        assert len(alice.limits) == 1
    finally:
        await _close(broker, alice, bob)


def _epoch(day: date) -> float:
    return float((day - date(1970, 1, 1)).days * 86400)


async def test_limit_reached_while_ip_is_down_is_told_when_it_returns(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    limit = LimitConfig(period=Period.MONTH, messages=1)
    channels = ChannelsConfig(limits=(limit,))
    broker, alice, bob = await _world(tmp_path, store, clock, sink, channels)
    try:
        deaf = Deaf(alice)
        deaf.on = True
        await guard(bob.publish("alerts.fire", {}, b"a", urgent=True))
        await guard(sink.wait_for("media_disconnected", ALICE))
        await guard(sink.wait_for("notify_delivered", ALICE))  # by SMS
        await guard(bob.publish("alerts.fire", {}, b"b", urgent=True))
        await guard(
            until(
                sink,
                lambda: any(
                    e.fields.get("nseq") == 2
                    for e in sink.named("notify_queued")
                    if e.fields.get("channel") == "sms"
                ),
            )
        )
        assert alice.limits == []  # IP is down and SMS is what the limit stops
        deaf.on = False
        await ip_back(alice)
        await guard(alice.wait_until(lambda: bool(alice.limits)))
        assert alice.limits[0].limit.startswith("month limit")
        await guard(alice.wait_until(lambda: len(alice.delivered_since(0)) == 2))
    finally:
        await _close(broker, alice, bob)
