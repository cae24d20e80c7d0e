"""The asyncio adapter on real loopback UDP sockets."""

from __future__ import annotations

import asyncio

from rudp import RudpConfig
from rudp.aio import RudpEndpoint

KEY = b"k" * 32


async def test_send_receive_both_ways_and_rebind_followed() -> None:
    a = await RudpEndpoint.open("127.0.0.1")
    b = await RudpEndpoint.open("127.0.0.1")
    try:
        pa = a.peer(KEY, b.local_addr)
        pb = b.peer(KEY, a.local_addr)
        assert a.peer(KEY, ("127.0.0.1", 9)) is pa
        big = bytes(range(256)) * 300
        await asyncio.wait_for(asyncio.gather(pa.send(b"one"), pa.send(big)), 5)
        assert await asyncio.wait_for(pb.receive(), 5) == b"one"
        assert await asyncio.wait_for(pb.receive(), 5) == big
        old = a.local_addr
        await a.rebind("127.0.0.1")
        assert a.local_addr != old
        await asyncio.wait_for(pa.send(b"from new address"), 5)
        assert await asyncio.wait_for(pb.receive(), 5) == b"from new address"
        assert pb.addr == a.local_addr  # followed the authenticated peer
        await asyncio.wait_for(pb.send(b"reply"), 5)
        assert await asyncio.wait_for(pa.receive(), 5) == b"reply"
    finally:
        await a.close()
        await b.close()


async def test_unknown_cid_counted_by_endpoint() -> None:
    a = await RudpEndpoint.open("127.0.0.1", config=RudpConfig(rto_initial=0.2))
    b = await RudpEndpoint.open("127.0.0.1")
    try:
        b.peer(b"other key 0123456789abcdef", a.local_addr)
        pa = a.peer(KEY, b.local_addr)
        sent = asyncio.ensure_future(pa.send(b"lost"))
        for _ in range(200):
            if b.stats.unknown_cid:
                break
            await asyncio.sleep(0.01)
        assert b.stats.unknown_cid >= 1
        sent.cancel()
    finally:
        await a.close()
        await b.close()
