"""An in-process broker (``run_broker``) and agents with SMS fallback on one network.

Time: the broker's epoch clock is a :class:`FakeClock` (TTLs from publication, limit
periods); SMS delays and the links' retransmission timers run on the event loop's clock,
with the thesis' delay distribution scaled down (``SCALE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from mdeci.agent import Agent
from mdeci.broker.app import RunningBroker
from mdeci.channels.config import ChannelsConfig
from mdeci.config import (
    AgentSmsConfig,
    AuthConfig,
    BrokerSmsConfig,
    UserConfig,
)
from mdeci.sms.gateway import SimulatedNetwork, SmsGateway
from mdeci.sms.smsc import THESIS_DELAYS, SmscConfig
from mdeci.store.repo import BrokerStore
from tests.agent.farend import agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink
from tests.loopback_broker import broker_config, run_loopback_broker

BROKER_NO, ALICE_NO = "+15550000001", "+15550000002"
ALICE, BOB = "sip:alice@localhost", "sip:bob@localhost"
GUARD = 20.0
# 10 s -> 2 ms, 60 s -> 12 ms, 90-180 min -> 1.1-2.2 s; 5.1 % never.
SCALE = 0.0002
THESIS_SMSC = SmscConfig(
    delays=THESIS_DELAYS, duplicate=0.05, reorder=0.1, reorder_delay=20.0, time_scale=SCALE
)


def sms_config(**overrides: object) -> BrokerSmsConfig:
    base = BrokerSmsConfig(
        enabled=True, number=BROKER_NO, ttl=3.0, ack_timeout=0.05, ack_timeout_max=1.0
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


async def start_broker(
    tmp: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    sms: BrokerSmsConfig,
    gateway: SmsGateway | None,
    channels: ChannelsConfig | None = None,
) -> RunningBroker:
    config = broker_config(
        tmp,
        # Alice's MSISDN from the operator's user record: the only source the broker
        # trusts (the SDP's a=mdeci-msisdn is the device's word, not the operator's).
        auth=AuthConfig(
            users=(
                UserConfig(user="alice", password="alice-secret", msisdn=ALICE_NO),
                UserConfig(user="bob", password="bob-secret"),
            )
        ),
        sms=sms,
        channels=channels if channels is not None else ChannelsConfig(),
    )
    return await run_loopback_broker(config, store, clock, sink, sms_gateway=gateway)


def sms_agent(tmp: Path, port: int, gateway: SmsGateway | None) -> Agent:
    """Alice, whose SDP carries her MSISDN, with an SMS inbox on ``gateway``."""
    cfg = agent_config(tmp / "alice", "alice", "127.0.0.2", port)
    if gateway is not None:
        cfg = dataclasses.replace(
            cfg, msisdn=ALICE_NO, sms=AgentSmsConfig(enabled=True, broker_number=BROKER_NO)
        )
    return Agent(cfg, address_source=lo_only, sms_gateway=gateway)


def plain_agent(tmp: Path, user: str, host: str, port: int) -> Agent:
    return Agent(agent_config(tmp / user, user, host, port), address_source=lo_only)


@contextlib.asynccontextmanager
async def sms_world(
    tmp: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    sms: BrokerSmsConfig,
    net: SimulatedNetwork,
    channels: ChannelsConfig | None = None,
) -> AsyncIterator[tuple[RunningBroker, Agent, Agent]]:
    """The broker with SMS on ``net``, alice (an SMS inbox on ``net``) and bob (IP only),
    both connected; all three closed at the end."""
    broker = await start_broker(tmp, store, clock, sink, sms, net.gateway(BROKER_NO), channels)
    port = broker.sip_addr[1]
    alice = sms_agent(tmp, port, net.gateway(ALICE_NO))
    bob = plain_agent(tmp, "bob", "127.0.0.4", port)
    try:
        await alice.start()
        await bob.start()
        await guard(alice.wait_connected())
        await guard(bob.wait_connected())
        yield broker, alice, bob
    finally:
        await alice.close()
        await bob.close()
        await broker.close()


class Deaf:
    """Cuts an agent's IP path with the endpoint's public knob
    (``RudpEndpoint.drop_incoming``): every datagram towards the device is dropped, so to
    the broker its sends time out and it marks the user DISCONNECTED."""

    def __init__(self, agent: Agent) -> None:
        assert agent.endpoint is not None
        self.endpoint = agent.endpoint

    @property
    def on(self) -> bool:
        return self.endpoint.drop_incoming

    @on.setter
    def on(self, value: bool) -> None:
        self.endpoint.drop_incoming = value


async def ip_back(agent: Agent, host: str = "127.0.0.3") -> None:
    """The device's IP path comes back, with a new address (the mobility case): the
    agent moves there (``Agent.move_to``: REGISTER + re-INVITE), which tells the broker
    it is reachable again. The IP path must not be cut any more."""
    await guard(agent.move_to(host))


class Sink(WaitingSink):
    """A :class:`WaitingSink` that can also wait for any condition on its events."""

    async def wait_until(
        self, predicate: Callable[[], bool], settle: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Return once ``predicate()`` holds; checked after each broker churn event.

        ``settle`` (the broker's ``service.settled``) first, for a predicate on the store:
        the broker's database thread sends an event before it has finished the call that
        made it (a held ack is applied after its ``notify_delivered``), so the store is
        read only once that thread ran everything queued so far.
        """
        while True:
            self._changed.clear()
            if settle is not None:
                await settle()
            if predicate():
                return
            await self._changed.wait()  # at once if an event came during settle


async def until(
    sink: Sink, predicate: Callable[[], bool], settle: Callable[[], Awaitable[None]] | None = None
) -> None:
    """``sink.wait_until(predicate, settle)`` (without a hang guard: callers add it)."""
    await sink.wait_until(predicate, settle)


def network(config: SmscConfig, seed: int) -> SimulatedNetwork:
    return SimulatedNetwork(config, seed=seed)


T = TypeVar("T")


async def guard(aw: Awaitable[T]) -> T:
    """``aw`` under the hang guard (synchronises nothing)."""
    return await asyncio.wait_for(aw, GUARD)
