"""The agent against the real broker (``mdeci.broker.app.run_broker``) with digest auth."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from mdeci.agent import Agent, Status
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import AuthConfig, BrokerConfig, SipConfig, UserConfig
from mdeci.store.repo import BrokerStore
from tests.agent.farend import FAST_RUDP, GUARD, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink


async def start_broker(
    tmp: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, port: int = 0
) -> RunningBroker:
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host="127.0.0.1", port=0, t1=0.02, t2=0.16, t4=0.2),
        rudp=FAST_RUDP,
        auth=AuthConfig(
            users=tuple(UserConfig(user=u, password=f"{u}-secret") for u in ("alice", "bob"))
        ),
    )
    return await run_broker(
        config,
        sip_listen=("127.0.0.1", port),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=clock,
        expire_interval=3600.0,
    )


async def test_agents_through_the_real_broker(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    broker = await start_broker(tmp_path, store, clock, sink)
    port = broker.sip_addr[1]
    # An idle agent notices a restarted broker when its keepalive PING goes unanswered.
    alice_cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", port)
    fast_ping = dataclasses.replace(FAST_RUDP, keepalive_interval=0.3)
    alice = Agent(dataclasses.replace(alice_cfg, rudp=fast_ping), address_source=lo_only)
    bob = Agent(agent_config(tmp_path / "bob", "bob", "127.0.0.4", port), address_source=lo_only)
    try:
        await alice.start()
        await bob.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await asyncio.wait_for(bob.wait_connected(), GUARD)
        await asyncio.wait_for(alice.subscribe("stocks.*", "(Stock == 'PETR4')"), GUARD)
        inbox = alice.listen()
        result = await asyncio.wait_for(bob.publish("stocks.br", {"Stock": "PETR4"}, b"1"), GUARD)
        assert result.state == "published"
        assert (await asyncio.wait_for(inbox.get(), GUARD))["nseq"] == 1

        await asyncio.wait_for(alice.move_to("127.0.0.3"), GUARD)
        await asyncio.wait_for(bob.publish("stocks.br", {"Stock": "PETR4"}, b"2"), GUARD)
        got = await asyncio.wait_for(inbox.get(), GUARD)
        assert (got["nseq"], got["text"]) == (2, "2")

        # The broker goes away; bob's publish waits in his buffer; the broker comes back.
        await broker.close()
        buffered = await asyncio.wait_for(bob.publish("stocks.br", {"Stock": "PETR4"}, b"3"), GUARD)
        assert buffered.state == "buffered"
        broker = await start_broker(tmp_path, store, clock, sink, port)
        got = await asyncio.wait_for(inbox.get(), GUARD)
        assert (got["nseq"], got["text"]) == (3, "3")
        await asyncio.wait_for(bob.wait_event("media_connected", count=2), GUARD)
        await asyncio.wait_for(bob.wait_until(lambda: bob.status().buffered == 0), GUARD)
        assert alice.status().status is Status.CONNECTED
        assert [r["nseq"] for r in alice.delivered_since(0)] == [1, 2, 3]
    finally:
        await alice.close()
        await bob.close()
        await broker.close()


async def test_an_idle_agent_notices_a_closed_broker(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    # Regression: RUDP keepalive PINGs went unanswered without consequence, so an agent
    # with nothing in flight stayed CONNECTED to a dead broker (and, after a restart,
    # never re-keyed: the restored peer's new incarnation was dropped as unknown_sender).
    broker = await start_broker(tmp_path, store, clock, sink)
    cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1])
    fast_ping = dataclasses.replace(FAST_RUDP, keepalive_interval=0.3)
    alice = Agent(dataclasses.replace(cfg, rudp=fast_ping), address_source=lo_only)
    try:
        await alice.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await broker.close()
        lost = await asyncio.wait_for(alice.wait_event("media_disconnected"), GUARD)
        assert lost["reason"].startswith("rudp:")
        assert alice.status().status is Status.DISCONNECTED
    finally:
        await alice.close(clean=False)  # no BYE to a dead broker
        await broker.close()
