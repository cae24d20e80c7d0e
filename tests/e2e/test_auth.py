"""A user may only register, subscribe and receive as its own AOR.

Wrong credentials are refused (401/403) and leave nothing in the database (no binding, no
session, no subscription); an agent configured as alice with bob's password never gets a
session; bob's credentials with alice in From get 403; and frames over the RUDP peer of
alice's session act for alice only: they cannot cancel, list, see or acknowledge bob's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from pathlib import Path

import pytest

from mdeci.agent import Agent
from mdeci.agent.errors import NotConnected
from mdeci.frames import Ack, Error, List, Notify, Pub, PubOk, Sub, SubOk, Subs, Unsub
from rudp.aio import PeerUnreachable
from sip.errors import SipRequestFailed
from tests.agent.farend import agent_config, lo_only
from tests.agent.test_real_broker import start_broker
from tests.broker.conftest import FakeClock, WaitingSink
from tests.e2e.harness_b import Device, devices, eventually, snapshot, sqlite_store, uri

ALICE, BOB = uri("alice"), uri("bob")


async def test_wrong_credentials_are_refused_and_store_nothing(tmp_path: Path) -> None:
    store, clock, sink = sqlite_store(tmp_path / "db"), FakeClock(), WaitingSink()
    broker = await start_broker(tmp_path, store, clock, sink)
    before = snapshot(store.engine)
    try:
        async with devices() as opened:
            cases = [
                # (user, password, From AOR, expected statuses)
                ("alice", "bob-secret", None, {401}),  # alice with bob's password
                ("bob", None, ALICE, {403}),  # bob's own credentials, alice in From
                ("mallory", "guess", None, {401, 403, 404}),  # nobody we know
            ]
            for user, password, aor, statuses in cases:
                dev = await Device.open(user, "127.0.0.2", password=password, aor=aor)
                opened.append(dev)
                with pytest.raises(SipRequestFailed) as reg:
                    await asyncio.wait_for(dev.ua.register(broker.sip_addr, 600), 30)
                assert reg.value.status in statuses, (user, reg.value.status)
                with pytest.raises(SipRequestFailed) as inv:
                    await dev.call(broker)
                assert inv.value.status in statuses, (user, inv.value.status)

        # The agent daemon's core, configured as alice with bob's password.
        cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1])
        agent = Agent(dataclasses.replace(cfg, password="bob-secret"), address_source=lo_only)
        try:
            await agent.start()

            async def refused() -> bool:
                return agent.last_error is not None

            await eventually(refused)
            assert "401" in str(agent.last_error)
            assert not agent.connected
            with pytest.raises(NotConnected):
                await agent.subscribe("a.*")
        finally:
            await agent.close()

        assert snapshot(store.engine) == before
        assert store.bindings.bindings(ALICE, clock()) == []
        assert store.sessions.get_session(ALICE) is None
        assert store.subscriptions.list_subscriptions(ALICE, clock()) == []
        assert sink.named("registered") == [] and sink.named("session_started") == []
    finally:
        await broker.close()
        store.engine.dispose()


async def test_a_session_peer_acts_only_for_its_owner(tmp_path: Path) -> None:
    store, clock, sink = sqlite_store(tmp_path / "db"), FakeClock(), WaitingSink()
    broker = await start_broker(tmp_path, store, clock, sink)
    try:
        async with devices() as opened:
            alice = await Device.open("alice", "127.0.0.2")
            bob = await Device.open("bob", "127.0.0.4")
            opened += [alice, bob]
            await alice.call(broker)
            await bob.call(broker)
            await asyncio.wait_for(sink.wait_for("media_connected", BOB), 30)
            await asyncio.wait_for(sink.wait_for("media_connected", ALICE), 30)

            bobs = await bob.ask(Sub(req=1, subject="b.*"))
            assert isinstance(bobs, SubOk)
            # Alice cannot cancel bob's subscription: answered as an unknown id.
            refused = await alice.ask(Unsub(req=1, sub_id=bobs.sub_id))
            assert isinstance(refused, Error) and refused.code == 404
            assert [s.subject for s in store.subscriptions.list_subscriptions(BOB, clock())] == [
                "b.*"
            ]
            # Her listing is hers (empty), not bob's.
            listed = await alice.ask(List(req=2))
            assert isinstance(listed, Subs) and listed.items == ()
            # What she subscribes is stored under her URI, whatever she might wish.
            mine = await alice.ask(Sub(req=3, subject="a.*"))
            assert isinstance(mine, SubOk)
            assert [s.subject for s in store.subscriptions.list_subscriptions(ALICE, clock())] == [
                "a.*"
            ]

            # Bob's notification goes to bob's peer; alice's ack does not remove it.
            ok = await bob.ask(Pub(req=2, msg_id="m1", subject="b.x", payload=b"for bob"))
            assert isinstance(ok, PubOk) and ok.matched == 1
            note = await bob.next()
            assert isinstance(note, Notify) and note.payload == b"for bob"
            await alice.send(Ack(upto=10**6))
            # RUDP delivers in order: once this answer is here, the ack was handled.
            assert isinstance(await alice.ask(List(req=4)), Subs)
            assert store.queues.depth(BOB) == 1
            await bob.send(Ack(upto=note.nseq))
            assert isinstance(await bob.ask(List(req=3)), Subs)
            assert store.queues.depth(BOB) == 0
            # Alice got only the answers to her own requests.
            assert alice.frames.empty()

            # A peer keyed by no session is not heard at all: no answer, nothing stored.
            before = snapshot(store.engine)
            stranger = await Device.open("alice", "127.0.0.3")
            opened.append(stranger)
            stranger.attach(broker.media_addr, secrets.token_bytes(32))
            with pytest.raises(PeerUnreachable):
                await stranger.send(Sub(req=1, subject="b.*"))
            assert snapshot(store.engine) == before
    finally:
        await broker.close()
        store.engine.dispose()
