"""The agent against a SIP + RUDP far end on loopback (tests/agent/farend.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent import Agent, Status
from mdeci.broker import Broker
from mdeci.config import IpMonitorConfig, IpMonitorMode
from mdeci.store.repo import BrokerStore
from tests.agent.farend import GUARD, FarEnd, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink, make_broker


@pytest.fixture
def broker(store: BrokerStore, clock: FakeClock, sink: WaitingSink) -> Broker:
    return make_broker(store, clock, sink)


@pytest.fixture
async def far(broker: Broker) -> AsyncIterator[FarEnd]:
    end = await FarEnd(broker).start()
    try:
        yield end
    finally:
        await end.stop()


async def start_agent(tmp: Path, user: str, host: str, far: FarEnd) -> Agent:
    agent = Agent(agent_config(tmp / user, user, host, far), address_source=lo_only)
    await agent.start()
    await asyncio.wait_for(agent.wait_connected(), GUARD)
    return agent


class MoveDetections(logging.Handler):
    """Collects the agent's ``move_detected`` operator lines; ``twice`` is set at the second."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen = 0
        self.twice = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "move_detected":
            self.seen += 1
            if self.seen >= 2:
                self.twice.set()


async def next_record(queue: asyncio.Queue[dict[str, Any]]) -> dict[str, Any]:
    return await asyncio.wait_for(queue.get(), GUARD)


async def test_sub_pub_notify_once_then_move(tmp_path: Path, far: FarEnd) -> None:
    alice = await start_agent(tmp_path, "alice", "127.0.0.2", far)
    bob = await start_agent(tmp_path, "bob", "127.0.0.4", far)
    try:
        ok = await asyncio.wait_for(alice.subscribe("news.#", "price < 10"), GUARD)
        assert [s.sub_id for s in alice.subscriptions] == [ok.sub_id]
        inbox = alice.listen()
        result = await asyncio.wait_for(bob.publish("news.rio", {"price": 5}, b"hello"), GUARD)
        assert (result.state, result.matched) == ("published", 1)
        first = await next_record(inbox)
        assert (first["nseq"], first["text"], first["msg_id"]) == (1, "hello", result.msg_id)

        await asyncio.wait_for(alice.move_to("127.0.0.3"), GUARD)
        moved = await alice.wait_event("ip_changed")
        assert moved["addr"].startswith("127.0.0.3:")
        assert moved["prev_addr"].startswith("127.0.0.2:")
        assert alice.status().media_addr.startswith("127.0.0.3:")

        await asyncio.wait_for(bob.publish("news.sp", {"price": 7}, b"again"), GUARD)
        second = await next_record(inbox)
        assert (second["nseq"], second["text"]) == (2, "again")
        await alice.wait_event("notify_delivered", nseq=2)
        assert [r["nseq"] for r in alice.delivered_since(0)] == [1, 2]
        assert inbox.empty()
        assert alice.status().status is Status.CONNECTED
    finally:
        await alice.close()
        await bob.close()
    events = [json.loads(line)["event"] for line in (tmp_path / "alice" / "churn.log").open()]
    for name in (
        "registered",
        "session_started",
        "media_connected",
        "notify_delivered",
        "ip_changed",
        "session_reinvited",
        "session_ended",
        "unregistered",
    ):
        assert name in events, name


async def test_broker_unreachable_then_back(
    tmp_path: Path, far: FarEnd, store: BrokerStore, sink: WaitingSink
) -> None:
    alice = await start_agent(tmp_path, "alice", "127.0.0.2", far)
    try:
        await asyncio.wait_for(alice.subscribe("alerts.*"), GUARD)
        inbox = alice.listen()
        await far.stop()  # the broker host goes dark
        result = await asyncio.wait_for(alice.publish("alerts.fire", {}, b"one"), GUARD)
        assert result.state == "buffered"
        await alice.wait_event("media_disconnected")
        assert alice.status().status is Status.DISCONNECTED
        later = await alice.publish("alerts.flood", {}, b"two")
        assert later.state == "buffered" and alice.status().buffered == 2

        await far.start()  # back on the same SIP port, new media port
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        got = [await next_record(inbox), await next_record(inbox)]
        assert sorted(r["text"] for r in got) == ["one", "two"]
        assert [r["nseq"] for r in got] == [1, 2]
        await asyncio.wait_for(alice.wait_event("notify_delivered", nseq=2), GUARD)
        # The pub-ok for "two" may land just after its own notification came back.
        await asyncio.wait_for(alice.wait_until(lambda: alice.status().buffered == 0), GUARD)
        assert inbox.empty()
        # Each publish went out once: two notifications, both acked, none left.
        await asyncio.wait_for(sink.wait_for("notify_delivered", alice.config.aor, 2), GUARD)
        assert far.service is not None
        await far.service.settled()  # the broker applies the held ack after its event
        assert store.queues.depth(alice.config.aor) == 0
    finally:
        await alice.close()


async def test_restart_never_hands_over_twice(
    tmp_path: Path, far: FarEnd, broker: Broker, store: BrokerStore
) -> None:
    alice = await start_agent(tmp_path, "alice", "127.0.0.2", far)
    bob = await start_agent(tmp_path, "bob", "127.0.0.4", far)
    try:
        await asyncio.wait_for(alice.subscribe("news.#"), GUARD)
        inbox = alice.listen()
        await bob.publish("news.a", {}, b"1")
        assert (await next_record(inbox))["nseq"] == 1
        await alice.close()
        # Two more while alice is away: nseq 2 and 3 wait in her queue.
        await bob.publish("news.b", {}, b"2")
        await bob.publish("news.c", {}, b"3")
        # A crash after nseq 2 reached the application and before its ack left:
        state = tmp_path / "alice"
        with (state / "inbox.jsonl").open("a") as fh:
            fh.write(json.dumps({"nseq": 2, "text": "2"}) + "\n")
        (state / "nseq.json").write_text(json.dumps({"highest": 2, "recent": []}))

        alice = await start_agent(tmp_path, "alice", "127.0.0.2", far)
        await alice.wait_event("notify_delivered", nseq=3)
        assert [e["nseq"] for e in alice.recent_events if e["event"] == "notify_delivered"] == [3]
        assert [r["nseq"] for r in alice.delivered_since(0)] == [1, 2, 3]
        assert alice.status().highest_nseq == 3
    finally:
        await alice.close()
        await bob.close()


async def test_a_move_that_cannot_bind_is_tried_again(tmp_path: Path, far: FarEnd) -> None:
    """The monitor took a named address for ours even when the agent could not bind it
    (an IPv6 address still in duplicate address detection): it never named it again, so
    the agent stayed on the old address for good. Now each check names it again."""
    addresses = [frozenset({"127.0.0.1/8"})]
    cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", far)
    cfg = dataclasses.replace(
        cfg, ip_monitor=IpMonitorConfig(mode=IpMonitorMode.POLL, poll_interval=0.05)
    )
    agent = Agent(cfg, address_source=lambda: addresses[0])
    logger = logging.getLogger("mdeci.agent")
    level, catch = logger.level, MoveDetections()
    logger.setLevel(logging.INFO)
    logger.addHandler(catch)
    try:
        await agent.start()
        await asyncio.wait_for(agent.wait_connected(), GUARD)
        addresses[0] = frozenset({"192.0.2.77/32"})  # TEST-NET-1: not local, cannot bind
        await asyncio.wait_for(catch.twice.wait(), GUARD)
        assert agent.status().sip_addr.startswith("127.0.0.2:")
    finally:
        logger.removeHandler(catch)
        logger.setLevel(level)
        await agent.close()
