"""The broker holds a delay-tolerant notification while the device is on a costly
network and its calendar expects a cheaper one: ``run_broker`` without SMS (an IP-only
broker) and real agents on loopback; the device's network is its address
(``[network]`` prefixes: 127.0.0.3 is Wi-Fi, the rest of 127/8 cellular)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from mdeci.agent import Agent
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.channels.config import ChannelsConfig, default_class_configs
from mdeci.config import AuthConfig, BrokerConfig, SipConfig, UserConfig
from mdeci.config.agent import (
    AgentCalendarConfig,
    CalendarRuleConfig,
    NetworkConfig,
    NetworkKindConfig,
)
from mdeci.store.repo import BrokerStore
from tests.agent.farend import FAST_RUDP, GUARD, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink

ALICE = "sip:alice@localhost"
NETWORK = NetworkConfig(
    kinds=(
        NetworkKindConfig(kind="wifi", prefixes=("127.0.0.3/32",)),
        NetworkKindConfig(kind="cellular", prefixes=("127.0.0.0/8",)),
    )
)
CALENDAR = AgentCalendarConfig(rules=(CalendarRuleConfig(channel="wifi", p=0.9),))


async def start_broker(
    tmp: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, bulk_delay: float
) -> RunningBroker:
    classes = tuple(
        dataclasses.replace(c, max_delay=bulk_delay) if c.name == "bulk" else c
        for c in default_class_configs()
    )
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host="127.0.0.1", port=0, t1=0.02, t2=0.16, t4=0.2),
        rudp=FAST_RUDP,
        auth=AuthConfig(
            users=tuple(UserConfig(user=u, password=f"{u}-secret") for u in ("alice", "bob"))
        ),
        channels=ChannelsConfig(classes=classes),
    )
    assert not config.sms.enabled  # an IP-only broker: SMS is not a channel
    return await run_broker(
        config,
        sip_listen=("127.0.0.1", 0),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=clock,
        expire_interval=3600.0,
    )


def decisions(sink: WaitingSink) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for e in sink.named("channel_decided"):
        out.setdefault(int(e.fields["nseq"]), []).append(str(e.fields["reason"]))  # type: ignore[arg-type]
    return out


async def agents(
    tmp: Path, broker: RunningBroker, *, in_order: bool = False
) -> tuple[Agent, Agent]:
    port = broker.sip_addr[1]
    alice_cfg = dataclasses.replace(
        agent_config(tmp / "alice", "alice", "127.0.0.2", port), network=NETWORK, calendar=CALENDAR
    )
    alice = Agent(alice_cfg, address_source=lo_only)
    bob = Agent(agent_config(tmp / "bob", "bob", "127.0.0.4", port), address_source=lo_only)
    await alice.start()
    await bob.start()
    await asyncio.wait_for(alice.wait_connected(), GUARD)
    await asyncio.wait_for(bob.wait_connected(), GUARD)
    # Handled after alice's device and calendar frames (one ordered stream).
    await asyncio.wait_for(alice.subscribe("news.#", in_order=in_order), GUARD)
    return alice, bob


async def test_bulk_waits_for_wifi_urgent_goes_at_once(
    tmp_path: Path, any_store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    store = any_store  # SQLite, then PostgreSQL
    broker = await start_broker(tmp_path, store, clock, sink, bulk_delay=3600.0)
    alice, bob = await agents(tmp_path, broker)
    try:
        inbox = alice.listen()
        big = await asyncio.wait_for(
            bob.publish("news.big", payload=b"b" * 500, qclass="bulk"), GUARD
        )
        assert big.state == "published"
        now = await asyncio.wait_for(bob.publish("news.now", urgent=True), GUARD)
        assert now.state == "published"
        first = await asyncio.wait_for(inbox.get(), GUARD)
        assert (first["subject"], first["nseq"]) == ("news.now", 2)  # at once, on cellular
        await sink.wait_for("channel_decided", ALICE, count=2)
        made = decisions(sink)
        assert made[1][0].startswith("network=cellular class=bulk decision=wait for=wifi")
        assert made[2] == ["network=cellular class=urgent decision=deliver"]
        assert inbox.empty()

        await asyncio.wait_for(alice.move_to("127.0.0.3"), GUARD)  # the Wi-Fi comes
        second = await asyncio.wait_for(inbox.get(), GUARD)
        assert (second["subject"], second["nseq"]) == ("news.big", 1)
        assert decisions(sink)[1][1] == "network=wifi class=bulk decision=deliver"
        await sink.wait_for("notify_delivered", ALICE, count=2)
        # Nothing lost or duplicated; the acks reach the store once the hold is over.
        assert sorted(r["nseq"] for r in alice.delivered_since(0)) == [1, 2]
        delivered = [e.fields["nseq"] for e in sink.named("notify_delivered") if e.uri == ALICE]
        assert sorted(delivered) == [1, 2]  # type: ignore[type-var]
    finally:
        await alice.close()
        await bob.close()
        await broker.close()
    assert store.queues.depth(ALICE) == 0


async def test_deadline_sends_on_the_costly_network(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    broker = await start_broker(tmp_path, store, clock, sink, bulk_delay=10.0)
    alice, bob = await agents(tmp_path, broker)
    try:
        inbox = alice.listen()
        await asyncio.wait_for(bob.publish("news.big", qclass="bulk"), GUARD)
        held = await sink.wait_for("channel_decided", ALICE)
        assert "decision=wait for=wifi" in str(held.fields["reason"])
        assert inbox.empty()
        clock.advance(9.0)  # P x Dmax = 0.9 x 10 s: the deadline makes cellular the best
        got = await asyncio.wait_for(inbox.get(), GUARD)
        assert (got["subject"], got["nseq"]) == ("news.big", 1)
        late = await sink.wait_for("channel_decided", ALICE, count=2)
        assert late.fields["reason"] == "network=cellular class=bulk decision=deliver"
    finally:
        await alice.close()
        await bob.close()
        await broker.close()


async def test_in_order_an_urgent_one_takes_the_held_bulk_along(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    broker = await start_broker(tmp_path, store, clock, sink, bulk_delay=3600.0)
    alice, bob = await agents(tmp_path, broker, in_order=True)
    try:
        inbox = alice.listen()
        await asyncio.wait_for(bob.publish("news.big", qclass="bulk"), GUARD)
        held = await sink.wait_for("channel_decided", ALICE)
        assert "decision=wait for=wifi" in str(held.fields["reason"])
        await asyncio.wait_for(bob.publish("news.now", urgent=True), GUARD)
        # The urgent one goes at once on cellular, after the held bulk one (in order).
        got = [await asyncio.wait_for(inbox.get(), GUARD) for _ in range(2)]
        assert [(g["subject"], g["nseq"]) for g in got] == [("news.big", 1), ("news.now", 2)]
        assert decisions(sink)[1][1] == "network=cellular class=bulk decision=deliver why=in_order"
        await sink.wait_for("notify_delivered", ALICE, count=2)
    finally:
        await alice.close()
        await bob.close()
        await broker.close()
    assert store.queues.depth(ALICE) == 0
