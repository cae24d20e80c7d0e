"""On PostgreSQL a wake-up from another broker is a hint: rows queued for a user this
broker holds without one (a notification lost) still reach the user at the next sweep."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdeci.agent import run_agent
from mdeci.config import SubscriptionConfig
from mdeci.store.base import make_engine
from mdeci.store.repo import BrokerStore
from tests.agent.farend import GUARD, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink
from tests.loopback_broker import broker_config, run_loopback_broker

ALICE = "sip:alice@localhost"


@pytest.fixture
def silent(pg_store: BrokerStore) -> Iterator[BrokerStore]:
    """Another handle on the same schema that publishes without waking anybody (as a
    notification PostgreSQL could not deliver)."""
    engine = make_engine(pg_store.engine.url.render_as_string(hide_password=False))
    try:
        yield BrokerStore(engine)
    finally:
        engine.dispose()


async def test_rows_queued_without_a_wake_up_are_delivered_at_the_next_sweep(
    tmp_path: Path, pg_store: BrokerStore, silent: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    a = BrokerStore(pg_store.engine, "a")
    config = broker_config(tmp_path, node="a", subscriptions=SubscriptionConfig(sweep_interval=0.2))
    broker = await run_loopback_broker(config, a, clock, sink)
    alice = await run_agent(
        agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1]),
        address_source=lo_only,
    )
    try:
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        sub = await alice.agent.subscribe("stocks.*")
        inbox = alice.agent.listen()
        # The broker's own publish: delivered at once, and its link then knows the queue
        # is empty (it would not read it again before something wakes it).
        await asyncio.wait_for(broker.service.settled(), GUARD)
        silent.queues.publish(
            "sip:bob@localhost",
            "m1",
            "stocks.x",
            b"\xa0",
            b"late",
            urgent=False,
            published_at=clock(),
            targets=[(ALICE, int(sub.sub_id))],
            max_depth=10,
            policy="drop-oldest",
        )
        got = await asyncio.wait_for(inbox.get(), GUARD)
        assert got["subject"] == "stocks.x"
    finally:
        await alice.close(clean=False)
        await broker.close()
