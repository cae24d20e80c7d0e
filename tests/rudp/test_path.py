"""Path validation (issue 12, criterion 3): a peer's address changes only after the new
path answered a PATH_CHALLENGE; a copy of a valid datagram from elsewhere does not move it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from rudp import RudpConfig
from rudp.aio import RudpEndpoint

KEY = bytes(range(32))
FAST = RudpConfig(rto_initial=0.1, rto_min=0.05, keepalive_interval=0)
GUARD = 10.0


class Relay(asyncio.DatagramProtocol):
    """a <-> relay <-> b on one socket; can send a copy of the next a->b datagram first
    from an attacker's socket (a spoofed source: the copy arrives before the original)."""

    def __init__(self, b: tuple[str, int]) -> None:
        self.b = b
        self.a: tuple[str, int] | None = None
        self.send: Callable[[bytes, tuple[str, int]], None] | None = None
        self.attacker: asyncio.DatagramTransport | None = None
        self.copy_next = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.send = getattr(transport, "sendto")  # noqa: B009

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        source = (str(addr[0]), int(addr[1]))
        assert self.send is not None
        if source == self.b:
            if self.a is not None:
                self.send(data, self.a)
            return
        self.a = source
        if self.copy_next and self.attacker is not None:
            self.copy_next = False
            self.attacker.sendto(data, self.b)
        self.send(data, self.b)


class Sink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.got.put_nowait(data)


async def test_spoofed_copy_does_not_move_the_peer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rudp")
    loop = asyncio.get_running_loop()
    a = await RudpEndpoint.open("127.0.0.1", 0, FAST)
    b = await RudpEndpoint.open("127.0.0.1", 0, FAST)
    relay_t, relay = await loop.create_datagram_endpoint(
        lambda: Relay(b.local_addr), local_addr=("127.0.0.1", 0)
    )
    relay_addr = relay_t.get_extra_info("sockname")[:2]
    attacker_t, attacker = await loop.create_datagram_endpoint(Sink, local_addr=("127.0.0.5", 0))
    relay.attacker = attacker_t
    try:
        pa = a.peer(KEY, relay_addr)
        pb = b.peer(KEY, relay_addr)
        await asyncio.wait_for(pa.send(b"first"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"first"
        relay.copy_next = True
        await asyncio.wait_for(pa.send(b"second"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"second"
        # The copy from 127.0.0.5 authenticated and was the newest: b challenged that
        # path, which cannot answer (it does not hold the keys), and kept the peer.
        challenge = await asyncio.wait_for(attacker.got.get(), GUARD)
        assert challenge[0] == 2  # a RUDP v2 datagram, encrypted
        assert pb.addr == relay_addr and pb.path_changes == 0
        assert pb.stats.path_challenges_sent == 1
        await asyncio.wait_for(pb.send(b"reply"), GUARD)  # still reaches a, via the relay
        assert await asyncio.wait_for(pa.receive(), GUARD) == b"reply"
        assert any("validating new path" in r.getMessage() for r in caplog.records)
    finally:
        await a.close()
        await b.close()
        relay_t.close()
        attacker_t.close()


async def test_a_real_move_is_followed_after_the_challenge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rudp")
    a = await RudpEndpoint.open("127.0.0.2", 0, FAST)
    b = await RudpEndpoint.open("127.0.0.1", 0, FAST)
    try:
        pa = a.peer(KEY, b.local_addr)
        pb = b.peer(KEY, a.local_addr)
        await asyncio.wait_for(pa.send(b"before"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"before"
        await a.rebind("127.0.0.3", 0)  # the device moved; no re-INVITE here
        await asyncio.wait_for(pa.send(b"after"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"after"
        await asyncio.wait_for(pb.send(b"to the new address"), GUARD)
        assert await asyncio.wait_for(pa.receive(), GUARD) == b"to the new address"
        assert pb.addr == a.local_addr and pb.path_changes == 1
        assert pa.stats.path_responses_sent >= 1
        assert any("validated" in r.getMessage() for r in caplog.records)
    finally:
        await a.close()
        await b.close()
