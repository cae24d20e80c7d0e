"""Subscription TTL on a fake clock, through the whole broker (``run_broker`` with an
injected clock) and real agents on loopback.

An expired subscription stops matching at once (before any sweep); notifications queued
for it before it expired are still delivered; expiry survives a broker restart on the same
SQLite file, both for a subscription that expired before the restart and for one that
expired while the broker was down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mdeci.agent import Agent
from mdeci.store.base import make_engine
from mdeci.store.repo import BrokerStore
from tests.agent.farend import GUARD, agent_config, lo_only
from tests.agent.test_real_broker import start_broker
from tests.broker.conftest import T0, FakeClock, WaitingSink
from tests.e2e.harness_b import sqlite_store

ALICE = "sip:alice@localhost"


async def _published(agent: Agent, subject: str, text: str) -> int:
    result = await asyncio.wait_for(agent.publish(subject, {}, text.encode()), GUARD)
    assert result.state == "published", result
    assert result.matched is not None
    return result.matched


async def test_ttl_expiry_queued_delivery_and_restart(tmp_path: Path) -> None:
    clock, sink = FakeClock(), WaitingSink()
    store = sqlite_store(tmp_path / "db")
    engine = store.engine
    sqlite_path = tmp_path / "db" / "broker.db"
    broker = await start_broker(tmp_path, store, clock, sink)
    port = broker.sip_addr[1]
    alice_cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", port)
    alice = Agent(alice_cfg, address_source=lo_only)
    bob = Agent(agent_config(tmp_path / "bob", "bob", "127.0.0.4", port), address_source=lo_only)
    engine2 = None
    try:
        await alice.start()
        await bob.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await asyncio.wait_for(bob.wait_connected(), GUARD)
        short = await alice.subscribe("feed.*", ttl=60, lease=False)
        mid = await alice.subscribe("news.*", ttl=120, lease=False)
        long = await alice.subscribe("keep.*", ttl=3600, lease=False)
        assert (short.expires_at, mid.expires_at, long.expires_at) == (T0 + 60, T0 + 120, T0 + 3600)

        # Alice goes away; what bob publishes now waits in her queue.
        await alice.close()
        await asyncio.wait_for(sink.wait_for("media_disconnected", ALICE), GUARD)
        assert await _published(bob, "feed.a", "feed.a") == 1
        assert await _published(bob, "news.a", "news.a") == 1
        assert await _published(bob, "keep.a", "keep.a") == 1

        # 61 s later the 60 s subscription matches nothing, with no sweep run yet.
        clock.advance(61)
        assert sink.named("subscription_expired") == []
        assert await _published(bob, "feed.b", "feed.b") == 0
        assert await _published(bob, "news.b", "news.b") == 1
        # The match noticed it and swept it (docs/protocol.md §6: removed at matching time).
        expired = await asyncio.wait_for(sink.wait_for("subscription_expired", ALICE), GUARD)
        assert f"sub_id={short.sub_id} " in str(dict(expired.fields)["reason"])

        # Restart on the same file; the 120 s subscription expires while it is down.
        await broker.close()
        engine.dispose()
        clock.advance(60)
        engine2 = make_engine(f"sqlite:///{sqlite_path}")
        store2 = BrokerStore(engine2)
        broker = await start_broker(tmp_path, store2, clock, sink, port)
        # Bob's old RUDP association died with the broker: a publish nobody hears brings
        # him back (buffered, then re-sent after his reconnection).
        await asyncio.wait_for(bob.publish("nobody.hears", {}, b"x"), GUARD)
        await asyncio.wait_for(bob.wait_until(lambda: bob.status().buffered == 0), GUARD)
        assert bob.connected

        assert await _published(bob, "feed.c", "feed.c") == 0
        assert await _published(bob, "news.c", "news.c") == 0
        assert await _published(bob, "keep.c", "keep.c") == 1
        alive = store2.subscriptions.list_subscriptions(ALICE, clock())
        assert [s.subject for s in alive] == ["keep.*"]
        swept = await broker.service.worker.run(broker.broker.sweep)
        assert [s.subject for s in swept] == ["news.*"]

        # Alice comes back: everything queued before expiry arrives, in order, once.
        alice = Agent(alice_cfg, address_source=lo_only)
        inbox = alice.listen()
        await alice.start()
        got = [
            (await asyncio.wait_for(inbox.get(), GUARD))["text"] for _ in range(5)
        ]  # fmt: skip
        assert got == ["feed.a", "news.a", "keep.a", "news.b", "keep.c"]
        subs = await asyncio.wait_for(alice.list_subscriptions(), GUARD)
        assert [s.subject for s in subs] == ["keep.*"]
        # Her acks empty the queue (the broker logs each acked notification).
        await asyncio.wait_for(sink.wait_for("notify_delivered", ALICE, count=5), GUARD)
        assert store2.queues.depth(ALICE) == 0
    finally:
        await alice.close()
        await bob.close()
        await broker.close()
        engine.dispose()
        if engine2 is not None:
            engine2.dispose()
