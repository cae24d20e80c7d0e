"""A broker whose user another broker took over (a newer epoch) neither delivers, nor
acks, nor writes for that user: it drops the session and logs it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdeci.agent import Agent, run_agent
from mdeci.store.base import make_engine
from mdeci.store.ownership import Held
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from tests.agent.farend import GUARD, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink
from tests.loopback_broker import broker_config, run_loopback_broker

ALICE = "sip:alice@localhost"


@pytest.fixture
def node_b(any_store: BrokerStore) -> Iterator[BrokerStore]:
    """Another broker's handle on the same database."""
    engine = make_engine(any_store.engine.url.render_as_string(hide_password=False))
    try:
        yield BrokerStore(engine, "b")
    finally:
        engine.dispose()


async def test_a_broker_that_lost_alice_delivers_and_writes_nothing_more_for_her(
    tmp_path: Path, any_store: BrokerStore, node_b: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    a = BrokerStore(any_store.engine, "a")
    broker = await run_loopback_broker(broker_config(tmp_path, node="a"), a, clock, sink)
    port = broker.sip_addr[1]
    alice = await run_agent(
        agent_config(tmp_path / "alice", "alice", "127.0.0.2", port), address_source=lo_only
    )
    bob = Agent(agent_config(tmp_path / "bob", "bob", "127.0.0.4", port), address_source=lo_only)
    try:
        await bob.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await asyncio.wait_for(bob.wait_connected(), GUARD)
        await alice.agent.subscribe("stocks.*")
        inbox = alice.agent.listen()
        assert (await bob.publish("stocks.a", {"n": 1})).state == "published"
        first = await asyncio.wait_for(inbox.get(), GUARD)
        assert first["subject"] == "stocks.a"
        # Broker a holds her; broker b takes her over from the epoch it reads.
        held = node_b.ownership.holder(ALICE)
        assert held is not None and held[0] == "a"
        assert node_b.ownership.take_over(ALICE, held[1]) == Held(held[1] + 1)
        # From now on a changes nothing of her queue (an ack it still held is refused:
        # b sends that one again, and her agent drops it by nseq).
        before = [row.subject for row in node_b.queues.pending(ALICE)]

        assert (await bob.publish("stocks.b", {"n": 2})).state == "published"
        ended = await asyncio.wait_for(sink.wait_for("session_ended", ALICE), GUARD)
        assert ended.fields["reason"] == f"lost to b at epoch {held[1] + 1}"
        await broker.service.settled()
        assert broker.service.sessions.get(ALICE) is None
        assert not broker.service.is_connected(ALICE)
        # Nothing of stocks.b went to her from a, and her queue is b's to drain.
        assert inbox.empty()
        assert [row.subject for row in node_b.queues.pending(ALICE)] == [*before, "stocks.b"]
        # Her row is b's, untouched by a's end of the session (no ENDED written).
        row = node_b.sessions.get_session(ALICE)
        assert row is not None and row.status is SessionStatus.CONNECTED
        assert node_b.ownership.holder(ALICE) == ("b", held[1] + 1)
        # Bob, whom a still holds, is served as before.
        assert broker.service.is_connected("sip:bob@localhost")
    finally:
        await alice.close(clean=False)
        await bob.close(clean=False)
        await broker.close()


async def test_the_sweep_finds_a_user_taken_over_while_there_was_nothing_to_send(
    tmp_path: Path, any_store: BrokerStore, node_b: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    """A broker that was frozen while alice went to another finds out at its sweep, even
    when it has nothing to send her and hears nothing from her: the same drop and log."""
    a = BrokerStore(any_store.engine, "a")
    broker = await run_loopback_broker(broker_config(tmp_path, node="a"), a, clock, sink)
    alice = await run_agent(
        agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1]),
        address_source=lo_only,
    )
    try:
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        held = node_b.ownership.holder(ALICE)
        assert held is not None and held[0] == "a"
        assert node_b.ownership.take_over(ALICE, held[1]) == Held(held[1] + 1)
        await broker.service.worker.run(broker.service.broker.sweep)
        ended = await asyncio.wait_for(sink.wait_for("session_ended", ALICE), GUARD)
        assert ended.fields["reason"] == f"lost to b at epoch {held[1] + 1}"
        await broker.service.settled()
        assert broker.service.sessions.get(ALICE) is None
        assert node_b.ownership.holder(ALICE) == ("b", held[1] + 1)
    finally:
        await alice.close(clean=False)
        await broker.close()
