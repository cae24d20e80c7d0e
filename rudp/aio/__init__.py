"""asyncio adapter for the RUDP core: one UDP socket per endpoint, many peers.

Glue only (STYLE.md): datagrams go into ``RudpConnection.receive_datagram``,
timers are one ``loop.call_at`` per peer, events become future results,
exceptions and queue items. The core decides everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass

from rudp import packet as wire
from rudp.config import RudpConfig
from rudp.connection import (
    MessageAcked,
    MessageFailed,
    MessageReceived,
    PeerDisconnected,
    RudpConnection,
    RudpStats,
    derive_connection_id,
)
from rudp.errors import PacketError, PeerUnreachable, RudpError

DEFAULT_CONFIG = RudpConfig()
# Kernel socket buffers: a window of small datagrams costs ~2 KB each of kernel memory
# (skb truesize), so Linux's 208 KB default drops a 512-packet burst on loopback.
SOCKET_BUFFER = 4 << 20


def set_socket_buffers(transport: asyncio.BaseTransport, size: int) -> None:
    """Ask for ``size``-byte send and receive buffers (the kernel caps it at rmem/wmem_max)."""
    sock = transport.get_extra_info("socket")
    if sock is None or size <= 0:
        return
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)


__all__ = ["EndpointStats", "PeerUnreachable", "RudpEndpoint", "RudpPeer", "derive_connection_id"]


@dataclass(slots=True)
class EndpointStats:
    """Datagrams the endpoint dropped before any connection saw them."""

    datagrams_received: int = 0
    unknown_cid: int = 0
    malformed: int = 0
    dropped_incoming: int = 0  # while ``RudpEndpoint.drop_incoming`` was set


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, endpoint: RudpEndpoint) -> None:
        self._endpoint = endpoint

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._endpoint._on_datagram(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP errors on UDP: the retransmission timer is the only judge of reachability


class RudpPeer:
    """One peer of an endpoint, identified by its session key (never by its address)."""

    def __init__(self, endpoint: RudpEndpoint, key: bytes, addr: tuple[str, int]) -> None:
        self._endpoint = endpoint
        self._loop = endpoint._loop
        self.addr = addr
        self.key = key
        self.connection = RudpConnection(
            key, endpoint.config, sender_id=int.from_bytes(secrets.token_bytes(4), "big")
        )
        self.on_disconnected: Callable[[PeerUnreachable], None] | None = None
        # Called for every authenticated datagram (DATA, ACK or PING): lets the owner see
        # a peer it gave up on talking again, before any message arrives.
        self.on_heard: Callable[[], None] | None = None
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False

    @property
    def connected(self) -> bool:
        return self.connection.connected

    @property
    def stats(self) -> RudpStats:
        return self.connection.stats

    def set_address(self, addr: tuple[str, int]) -> None:
        """Send to ``addr`` from now on (e.g. after a re-INVITE carried a new media address)."""
        self.addr = addr
        self._pump()

    def reset(self) -> None:
        """After DISCONNECTED: forget the failed state so ``send`` works again."""
        self.connection.reset(self._loop.time())
        self._pump()

    async def send(self, message: bytes) -> None:
        """Send one message; return when the peer acknowledged all of it.

        Raises PeerUnreachable when the retries ran out (for this message or one
        queued before it) or the peer is already DISCONNECTED; MessageTooLarge.
        """
        if self._closed:
            raise PeerUnreachable("endpoint closed", message)
        message_id = self.connection.send_message(message, self._loop.time())
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters[message_id] = future
        self._pump()
        await future

    async def receive(self) -> bytes:
        """The next message, in order."""
        return await self._inbox.get()

    def _feed(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.connection.receive_datagram(data, self._loop.time()):
            if addr != self.addr:
                self.addr = addr  # authenticated and newest: the peer moved (PROTOCOL.md §4)
            if self.on_heard is not None:
                self.on_heard()
        self._pump()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.connection.handle_timer(self._loop.time())
        self._pump()

    def _pump(self) -> None:
        if self._closed:
            return
        now = self._loop.time()
        for datagram in self.connection.datagrams_to_send(now):
            self._endpoint._sendto(datagram, self.addr)
        while (event := self.connection.next_event()) is not None:
            if isinstance(event, MessageReceived):
                self._inbox.put_nowait(event.data)
            elif isinstance(event, MessageAcked):
                future = self._waiters.pop(event.message_id, None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif isinstance(event, MessageFailed):
                future = self._waiters.pop(event.message_id, None)
                if future is not None and not future.done():
                    future.set_exception(PeerUnreachable("no ACK after retries", event.data))
            elif isinstance(event, PeerDisconnected) and self.on_disconnected is not None:
                self.on_disconnected(PeerUnreachable(f"{event.failed} messages failed"))
        when = self.connection.get_timer()
        if when != self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(when, self._on_timer) if when is not None else None
            self._timer_at = when

    def _close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(PeerUnreachable("endpoint closed"))
        self._waiters.clear()


class RudpEndpoint:
    """One UDP socket serving many RUDP peers, routed by connection id."""

    def __init__(self, config: RudpConfig, socket_buffer: int = SOCKET_BUFFER) -> None:
        self.config = config
        self.socket_buffer = socket_buffer
        self.stats = EndpointStats()
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.DatagramTransport | None = None
        self._peers: dict[int, RudpPeer] = {}
        #: Test and diagnostic knob: while true, every datagram received is dropped
        #: (counted in ``stats.dropped_incoming``) as if the path towards this endpoint
        #: had failed; sends are unaffected. Lets a test cut a device's IP path without a
        #: network namespace (the kernel here has no netem) and restore it by clearing it.
        self.drop_incoming = False

    @classmethod
    async def open(
        cls,
        host: str,
        port: int = 0,
        config: RudpConfig = DEFAULT_CONFIG,
        *,
        socket_buffer: int = SOCKET_BUFFER,
    ) -> RudpEndpoint:
        """Bind a UDP socket on host:port (0 = any free port); ``socket_buffer`` sizes its
        kernel buffers (0 keeps the system default). Raises OSError when binding fails."""
        endpoint = cls(config, socket_buffer)
        await endpoint._bind(host, port)
        return endpoint

    async def _bind(self, host: str, port: int) -> None:
        transport, _ = await self._loop.create_datagram_endpoint(
            lambda: _Protocol(self), local_addr=(host, port)
        )
        set_socket_buffers(transport, self.socket_buffer)
        self._transport = transport

    @property
    def local_addr(self) -> tuple[str, int]:
        if self._transport is None:
            raise RudpError("endpoint closed")
        name = self._transport.get_extra_info("sockname")
        return (str(name[0]), int(name[1]))

    def peer(self, key: bytes, addr: tuple[str, int]) -> RudpPeer:
        """The peer for ``key`` (created on first use; ``addr`` only sets a new peer's address)."""
        cid = derive_connection_id(key)
        existing = self._peers.get(cid)
        if existing is not None:
            return existing
        peer = RudpPeer(self, key, addr)
        self._peers[cid] = peer
        return peer

    def remove_peer(self, key: bytes) -> None:
        """Forget a peer; its pending sends fail with PeerUnreachable."""
        peer = self._peers.pop(derive_connection_id(key), None)
        if peer is not None:
            peer._close()

    async def rebind(self, host: str, port: int = 0) -> None:
        """Move to a new local address; peers keep their state and follow on the next packet."""
        old = self._transport
        await self._bind(host, port)
        if old is not None:
            old.close()
        for peer in self._peers.values():
            peer._pump()

    async def close(self) -> None:
        for peer in self._peers.values():
            peer._close()
        self._peers.clear()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def _sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._transport is not None:
            self._transport.sendto(data, addr)

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        self.stats.datagrams_received += 1
        if self.drop_incoming:
            self.stats.dropped_incoming += 1
            return
        try:
            cid = wire.peek_cid(data)
        except PacketError:
            self.stats.malformed += 1
            return
        peer = self._peers.get(cid)
        if peer is None:
            self.stats.unknown_cid += 1
            return
        peer._feed(data, addr)
