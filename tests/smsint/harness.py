"""An in-process broker (``run_broker``) and agents with SMS fallback on one network.

Time: the broker's epoch clock is a :class:`FakeClock` (TTLs from publication, limit
periods); SMS delays and the links' retransmission timers run on the event loop's clock,
with the thesis' delay distribution scaled down (``SCALE``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from mdeci.agent import Agent
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import (
    AgentSmsConfig,
    AuthConfig,
    BrokerConfig,
    BrokerSmsConfig,
    SipConfig,
    UserConfig,
)
from mdeci.sms.gateway import SimulatedNetwork, SmsGateway
from mdeci.sms.smsc import THESIS_DELAYS, SmscConfig
from mdeci.store.repo import BrokerStore
from tests.agent.farend import FAST_RUDP, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink

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
) -> RunningBroker:
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host="127.0.0.1", port=0, t1=0.02, t2=0.16, t4=0.2),
        rudp=FAST_RUDP,
        auth=AuthConfig(
            users=tuple(UserConfig(user=u, password=f"{u}-secret") for u in ("alice", "bob"))
        ),
        sms=sms,
    )
    return await run_broker(
        config,
        sip_listen=("127.0.0.1", 0),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=clock,
        expire_interval=3600.0,
        sms_gateway=gateway,
    )


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


class Deaf:
    """Makes an agent's RUDP endpoint drop every datagram: to the broker, the device's
    IP path has failed (its sends time out and it marks the user DISCONNECTED)."""

    def __init__(self, agent: Agent) -> None:
        assert agent.endpoint is not None
        self.endpoint = agent.endpoint
        self.on = False
        real = agent.endpoint._on_datagram

        def filtered(data: bytes, addr: tuple[str, int]) -> None:
            if not self.on:
                real(data, addr)

        self.endpoint._on_datagram = filtered  # type: ignore[method-assign]


async def until(sink: WaitingSink, predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds; checked after each broker churn event."""
    while not predicate():
        sink._changed.clear()
        await sink._changed.wait()


def network(config: SmscConfig, seed: int) -> SimulatedNetwork:
    return SimulatedNetwork(config, seed=seed)


T = TypeVar("T")


async def guard(aw: Awaitable[T]) -> T:
    """``aw`` under the hang guard (synchronises nothing)."""
    return await asyncio.wait_for(aw, GUARD)
