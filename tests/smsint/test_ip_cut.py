"""The IP cut the harness uses (``RudpEndpoint.drop_incoming``) on loopback: while set,
the endpoint hears nothing and its peer's sends fail; cleared, the path works again."""

from __future__ import annotations

import asyncio

import pytest

from rudp import RudpConfig
from rudp.aio import PeerUnreachable, RudpEndpoint

KEY = b"k" * 32
FAST = RudpConfig(rto_initial=0.02, rto_min=0.01, rto_max=0.04, max_retries=1)


async def test_drop_incoming_cuts_and_restores_the_path() -> None:
    device = await RudpEndpoint.open("127.0.0.1", config=FAST)
    broker = await RudpEndpoint.open("127.0.0.1", config=FAST)
    try:
        to_broker = device.peer(KEY, broker.local_addr)
        to_device = broker.peer(KEY, device.local_addr)
        device.drop_incoming = True
        with pytest.raises(PeerUnreachable):
            await asyncio.wait_for(to_device.send(b"lost"), 5)
        assert device.stats.dropped_incoming >= 1

        device.drop_incoming = False
        to_device.reset()
        await asyncio.wait_for(to_device.send(b"back"), 5)
        assert await asyncio.wait_for(to_broker.receive(), 5) == b"back"
    finally:
        await device.close()
        await broker.close()
