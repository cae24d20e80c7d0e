"""A real broker (``run_broker``, digest auth, SQLite) with alice's agent serving its API
(the application's side) and bob's agent publishing."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mdeci.agent import Agent, RunningAgent, run_agent
from mdeci.broker.app import RunningBroker
from mdeci.store.repo import BrokerStore
from tests.agent.farend import FAST_RUDP, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink, clock, sink, store  # noqa: F401
from tests.loopback_broker import broker_config, run_loopback_broker
from tests.store.conftest import sqlite_path, sqlite_template  # noqa: F401


async def start_broker(
    tmp: Path, db: BrokerStore, fake_clock: FakeClock, log: WaitingSink, port: int = 0
) -> RunningBroker:
    return await run_loopback_broker(broker_config(tmp), db, fake_clock, log, port=port)


@dataclass
class Deployment:
    """The broker and the two agents; :meth:`restart_broker` keeps its SIP port."""

    tmp: Path
    store: BrokerStore
    clock: FakeClock
    sink: WaitingSink
    broker: RunningBroker
    alice: RunningAgent
    bob: Agent

    @property
    def socket(self) -> Path:
        return self.alice.config.api_socket

    async def stop_broker(self) -> None:
        await self.broker.close()

    async def start_broker(self) -> None:
        port = self.alice.config.broker.address.port
        self.broker = await start_broker(self.tmp, self.store, self.clock, self.sink, port)


@pytest.fixture
async def deployment(
    tmp_path: Path,
    store: BrokerStore,  # noqa: F811
    clock: FakeClock,  # noqa: F811
    sink: WaitingSink,  # noqa: F811
) -> AsyncIterator[Deployment]:
    broker = await start_broker(tmp_path, store, clock, sink)
    port = broker.sip_addr[1]
    # A quick keepalive: alice notices a stopped broker well within the tests' guard.
    alice_cfg = agent_config(tmp_path / "alice", "alice", "127.0.0.2", port)
    fast_ping = dataclasses.replace(FAST_RUDP, keepalive_interval=0.3)
    alice = await run_agent(dataclasses.replace(alice_cfg, rudp=fast_ping), address_source=lo_only)
    bob = Agent(agent_config(tmp_path / "bob", "bob", "127.0.0.4", port), address_source=lo_only)
    dep = Deployment(tmp_path, store, clock, sink, broker, alice, bob)
    try:
        await bob.start()
        await alice.wait_connected()
        await bob.wait_connected()
        yield dep
    finally:
        await alice.close(clean=False)
        await bob.close(clean=False)
        await dep.broker.close()
