"""Subscription leases on a real broker whose default TTL is about a second, through
``mdeci.client`` and the agent's API: renewed over several TTLs and a move, a fixed one
ending at its TTL, a refused renewal told on the ``tail`` stream and by ``mdeci subs``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from mdeci.agent import Agent, run_agent
from mdeci.broker.app import run_broker
from mdeci.cli import main
from mdeci.client import BadRequest, Client
from mdeci.commands.client import readable_event
from mdeci.config import SubscriptionConfig
from mdeci.store.repo import BrokerStore
from tests.agent.farend import FAST_RUDP, GUARD, agent_config, lo_only
from tests.broker.conftest import WaitingSink
from tests.loopback_broker import broker_config

TTL = 1.2  # the broker's default TTL: the agent renews every 0.8 s
ALICE = "sip:alice@localhost"


async def test_leases_live_over_ttls_and_a_move_and_their_end_is_told(
    tmp_path: Path,
    store: BrokerStore,
    sink: WaitingSink,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    subs = SubscriptionConfig(default_ttl=TTL, sweep_interval=0.5)
    broker = await run_broker(
        broker_config(tmp_path, subscriptions=subs),
        sip_listen=("127.0.0.1", 0),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=time.time,  # the agents' clock too: TTLs pass for real
    )
    port = broker.sip_addr[1]
    alice_cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", port)
    alice = await run_agent(
        dataclasses.replace(alice_cfg, rudp=dataclasses.replace(FAST_RUDP, keepalive_interval=0.3)),
        address_source=lo_only,
    )
    bob = Agent(agent_config(tmp_path / "bob", "bob", "127.0.0.4", port), address_source=lo_only)
    try:
        await bob.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await asyncio.wait_for(bob.wait_connected(), GUARD)
        async with Client(alice.config.api_socket) as client:
            events = await client.subscription_events()
            with pytest.raises(BadRequest, match="'lease' must be true"):
                await client.request({"op": "sub", "subject": "stocks.*", "lease": "yes"})
            assert await client.subscriptions() == []
            lease = await client.subscribe("stocks.*")
            fixed = await client.subscribe("news.*", lease=False)
            assert (lease.lease, fixed.lease) == (True, False)
            assert lease.expires_at is not None
            first = lease.expires_at

            def expiry() -> float:
                found = [s for s in alice.agent.subscriptions if s.sub_id == lease.sub_id]
                return found[0].expires_at if found else 0.0

            agent = alice.agent
            await asyncio.wait_for(agent.wait_until(lambda: expiry() >= first + TTL / 2), GUARD)
            await asyncio.wait_for(alice.move_to("127.0.0.3"), GUARD)
            await asyncio.wait_for(agent.wait_until(lambda: expiry() >= first + 3 * TTL), GUARD)

            ended = await asyncio.wait_for(anext(events), GUARD)
            assert (ended.sub_id, ended.state, ended.reason) == (
                fixed.sub_id,
                "ended",
                "TTL reached",
            )
            stream = await client.notifications()
            async with stream:
                published = await asyncio.wait_for(bob.publish("stocks.a", {}, b"x"), GUARD)
                assert (published.state, published.matched) == ("published", 1)
                got = await asyncio.wait_for(anext(stream), GUARD)
                assert (got.sub_id, got.payload) == (lease.sub_id, b"x")

            # Removed at the broker behind the agent's back: the next renewal is refused.
            assert store.subscriptions.remove_subscription(ALICE, int(lease.sub_id))
            refused = await asyncio.wait_for(anext(events), GUARD)
            assert (refused.sub_id, refused.state) == (lease.sub_id, "ended")
            assert refused.reason.startswith("renewal refused: 404")
            logged = [r.getMessage() for r in caplog.records if r.name == "mdeci.agent"]
            assert f"subscription {lease.sub_id} (stocks.*) ended: {refused.reason}" in logged
            assert f"subscription {fixed.sub_id} (news.*) ended: TTL reached" in logged
            await events.close()
            listed = await client.subscriptions(ended=True)
            assert {(s.sub_id, s.state) for s in listed} == {
                (lease.sub_id, "ended"),
                (fixed.sub_id, "ended"),
            }
        sock = str(alice.config.api_socket)

        async def cli(*argv: str) -> int:
            return await asyncio.wait_for(asyncio.to_thread(main, [*argv, "--socket", sock]), GUARD)

        assert await cli("sub", "sports.*", "--ttl", "60", "--fixed") == 0
        assert capsys.readouterr().out.endswith(" (fixed)\n")
        assert await cli("subs") == 0
        table = capsys.readouterr().out
        assert "ended: renewal refused: 404" in table and "ended: TTL reached" in table
        (sports,) = [line for line in table.splitlines() if "sports.*" in line]
        assert "fixed" in sports and "live" in sports
    finally:
        await alice.close(clean=False)
        await bob.close(clean=False)
        await broker.close()


def test_tail_prints_subscription_events_as_one_line() -> None:
    ended = {"sub_id": "7", "state": "ended", "reason": "TTL reached", "subject": "news.*"}
    assert readable_event({"subscription": ended}) == "subscription 7 news.* ended: TTL reached"
    again = {**ended, "sub_id": "9", "state": "live", "replaces": "7", "reason": "lapsed"}
    assert readable_event({"subscription": again}) == "subscription 9 news.* replaces 7: lapsed"
