"""The asyncio adapter on real loopback UDP sockets."""

from __future__ import annotations

import asyncio

import pytest

from rudp import PeerUnreachable, RudpConfig
from rudp.aio import RudpEndpoint
from rudp.errors import MessageTooLarge

KEY = b"k" * 32

# Quick timers and one retry: a peer that stops answering fails within a second.
FAILS_FAST = RudpConfig(rto_initial=0.05, rto_min=0.05, max_retries=1, keepalive_interval=0)


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


async def test_unknown_cid_and_garbage_counted_by_endpoint() -> None:
    a = await RudpEndpoint.open("127.0.0.1", config=RudpConfig(rto_initial=0.2))
    b = await RudpEndpoint.open("127.0.0.1")
    try:
        pb = b.peer(KEY, a.local_addr)
        stranger = a.peer(b"other key 0123456789abcdef", b.local_addr)  # b does not know it
        pa = a.peer(KEY, b.local_addr)
        # Tasks start in creation order, and one socket to one destination on loopback
        # keeps order: once b has the good message it has judged the stranger's datagram.
        lost = asyncio.ensure_future(stranger.send(b"lost"))
        good = asyncio.ensure_future(pa.send(b"good"))
        await asyncio.wait_for(good, 5)
        assert await asyncio.wait_for(pb.receive(), 5) == b"good"
        assert b.stats.unknown_cid >= 1
        assert pb.stats.unknown_cid == 0  # routing happened before any connection saw it
        lost.cancel()
    finally:
        await a.close()
        await b.close()


async def test_write_then_drain_waits_for_every_ack_and_fails_with_the_peer() -> None:
    a = await RudpEndpoint.open("127.0.0.1", config=FAILS_FAST)
    b = await RudpEndpoint.open("127.0.0.1", config=FAILS_FAST)
    try:
        pa, pb = a.peer(KEY, b.local_addr), b.peer(KEY, a.local_addr)
        await asyncio.wait_for(pa.drain(), 5)  # nothing written: nothing to wait for
        for i in range(50):
            pa.write(b"%d" % i)
        await asyncio.wait_for(pa.drain(), 5)
        assert not any(pa.connection.is_pending(i) for i in range(50))
        assert [await asyncio.wait_for(pb.receive(), 5) for _ in range(50)] == [
            b"%d" % i for i in range(50)
        ]
        await b.close()  # nobody answers any more: the retries run out
        pa.write(b"lost")
        with pytest.raises(PeerUnreachable):
            await asyncio.wait_for(pa.drain(), 5)
        with pytest.raises(PeerUnreachable):
            pa.write(b"after the failure")
    finally:
        await a.close()
        await b.close()


async def test_send_many_nowait_is_done_once_every_message_is_acked_and_fails_with_one() -> None:
    a = await RudpEndpoint.open("127.0.0.1", config=FAILS_FAST)
    b = await RudpEndpoint.open("127.0.0.1", config=FAILS_FAST)
    try:
        pa, pb = a.peer(KEY, b.local_addr), b.peer(KEY, a.local_addr)
        with pytest.raises(ValueError):
            pa.send_many_nowait([])
        # 40 messages of 3 fragments each: many datagrams, acked a few at a time.
        messages = [bytes([i]) * (2 * pa.connection.payload_size + 1) for i in range(40)]
        done = pa.send_many_nowait(messages)
        await asyncio.wait_for(done, 5)
        assert not any(pa.connection.is_pending(i) for i in range(40))
        assert [await asyncio.wait_for(pb.receive(), 5) for _ in messages] == messages
        with pytest.raises(MessageTooLarge):  # all or none: the first is not queued either
            pa.send_many_nowait([b"small", b"x" * (FAILS_FAST.max_message_size + 1)])
        assert not pa.connection.is_pending(40)
        b.drop_incoming = True  # nobody answers any more: the retries run out
        lost = pa.send_many_nowait([b"lost 1", b"lost 2"])
        with pytest.raises(PeerUnreachable):
            await asyncio.wait_for(lost, 5)
        with pytest.raises(PeerUnreachable):
            pa.send_many_nowait([b"after the failure", b"and another"])
    finally:
        await a.close()
        await b.close()
