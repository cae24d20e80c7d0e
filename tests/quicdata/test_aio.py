"""The QUIC glue on real loopback UDP sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from quicdata.aio import QuicDataPeer, QuicDataServer, connect
from quicdata.connection import QuicDataConfig
from tests.quicdata.net import SECRET, certificate

FAST = QuicDataConfig(idle_timeout=1.0, keepalive=0.3, proof_timeout=2.0)
HOST = "127.0.0.1"


async def open_server(accept: Callable[[QuicDataPeer], None]) -> QuicDataServer:
    return await QuicDataServer.open(HOST, 0, certificate(), lambda sid: SECRET, accept, FAST)


async def test_messages_both_ways_and_a_move_to_another_address() -> None:
    accepted: asyncio.Queue[QuicDataPeer] = asyncio.Queue()
    server = await QuicDataServer.open(
        "127.0.0.1", 0, certificate(), lambda sid: SECRET, accepted.put_nowait
    )
    agent = await connect(
        server.local_addr, SECRET, certificate().fingerprint, local_host="127.0.0.1"
    )
    try:
        assert agent.peer is not None
        await asyncio.wait_for(agent.peer.wait_connected(), 5)
        broker_side = await asyncio.wait_for(accepted.get(), 5)
        await asyncio.wait_for(broker_side.wait_connected(), 5)
        moved: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()

        def path_changed(new: tuple[str, int], old: tuple[str, int] | None) -> None:
            if not moved.done():
                moved.set_result(new)

        broker_side.on_path_changed = path_changed
        for i in range(100):
            agent.peer.send(b"pub %d" % i)
        assert [await asyncio.wait_for(broker_side.receive(), 5) for _ in range(100)] == [
            b"pub %d" % i for i in range(100)
        ]
        broker_side.send(b"notify")
        assert await asyncio.wait_for(agent.peer.receive(), 5) == b"notify"

        await agent.rebind("127.0.0.2")
        agent.peer.send(b"after the move")
        assert await asyncio.wait_for(broker_side.receive(), 5) == b"after the move"
        assert await asyncio.wait_for(moved, 5) == agent.local_addr
        broker_side.send(b"to the new address")
        assert await asyncio.wait_for(agent.peer.receive(), 5) == b"to the new address"
        assert len(server.peers) == 1
    finally:
        agent.close()
        await server.close()


async def test_a_wrong_fingerprint_fails_the_agent_and_the_broker_sees_the_close() -> None:
    reasons: asyncio.Queue[str] = asyncio.Queue()

    def accept(peer: QuicDataPeer) -> None:
        peer.on_disconnected = reasons.put_nowait

    server = await QuicDataServer.open(
        "127.0.0.1", 0, certificate(), lambda sid: SECRET, accept, FAST
    )
    agent = await connect(server.local_addr, SECRET, bytes(32), local_host="127.0.0.1", config=FAST)
    try:
        assert agent.peer is not None
        with pytest.raises(ConnectionError, match="the SDP answer names"):
            await asyncio.wait_for(agent.peer.wait_connected(), 5)
        # Closed before the handshake is confirmed at the broker: QUIC sends that close
        # as a transport APPLICATION_ERROR (12) without its reason (RFC 9000 §10.2.3).
        assert await asyncio.wait_for(reasons.get(), 5) == "closed by the peer (12): "
        await asyncio.sleep(0)  # the close's bookkeeping runs in the next turn
        assert server.peers == []
    finally:
        agent.close()
        await server.close()


async def test_a_broker_that_stops_answering_is_disconnected_by_idle_timeout() -> None:
    server = await QuicDataServer.open(
        "127.0.0.1", 0, certificate(), lambda sid: SECRET, lambda p: None, FAST
    )
    agent = await connect(
        server.local_addr, SECRET, certificate().fingerprint, local_host="127.0.0.1", config=FAST
    )
    try:
        assert agent.peer is not None
        await asyncio.wait_for(agent.peer.wait_connected(), 5)
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        agent.peer.on_disconnected = lost.set_result
        assert server._transport is not None
        server._transport.close()  # silence, no CONNECTION_CLOSE
        server._transport = None
        assert await asyncio.wait_for(lost, 5) == "idle timeout"
    finally:
        agent.close()
        await server.close()


async def test_a_broker_that_closes_tells_the_agent_why() -> None:
    server = await open_server(lambda peer: None)
    agent = await connect(server.local_addr, SECRET, certificate().fingerprint, local_host=HOST)
    try:
        assert agent.peer is not None
        await asyncio.wait_for(agent.peer.wait_connected(), 5)
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        agent.peer.on_disconnected = lost.set_result
        await server.close()
        assert await asyncio.wait_for(lost, 5) == "closed by the peer (0): server closing"
        assert server.peers == []
    finally:
        agent.close()
