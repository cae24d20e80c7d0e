"""A real broker on loopback for the tests that need one: ``run_broker`` with the tests'
fast SIP and RUDP timers, digest users whose password is ``<user>-secret``, a fake clock
and expiry sweeps far enough apart that a test never sees one unless it asks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import AuthConfig, BrokerConfig, SipConfig, UserConfig
from mdeci.store.repo import BrokerStore
from tests.agent.farend import FAST_RUDP
from tests.broker.conftest import FakeClock, WaitingSink


def users(*names: str) -> tuple[UserConfig, ...]:
    """Digest users, each with the password ``<name>-secret``."""
    return tuple(UserConfig(user=name, password=f"{name}-secret") for name in names)


def broker_config(tmp: Path, *, auth: AuthConfig | None = None, **fields: Any) -> BrokerConfig:
    """The broker of domain ``localhost`` with its data in ``tmp/broker``; ``auth``
    defaults to alice and bob; ``fields`` set the other sections."""
    return BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host="127.0.0.1", port=0, t1=0.02, t2=0.16, t4=0.2),
        rudp=FAST_RUDP,
        auth=auth if auth is not None else AuthConfig(users=users("alice", "bob")),
        **fields,
    )


async def run_loopback_broker(
    config: BrokerConfig,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    *,
    port: int = 0,
    **options: Any,
) -> RunningBroker:
    """Run ``config`` with SIP on 127.0.0.1:``port`` (0: any) and RUDP on any port;
    ``options`` go to :func:`run_broker`."""
    return await run_broker(
        config,
        sip_listen=("127.0.0.1", port),
        media_listen=("127.0.0.1", 0),
        store=store,
        log=sink,
        clock=clock,
        expire_interval=3600.0,
        **options,
    )
