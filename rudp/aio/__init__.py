"""asyncio adapter for the RUDP core: one UDP socket per endpoint, many peers.

Glue only (tests/test_layering.py checks the cores import no I/O): datagrams go to
``rudp.endpoint.EndpointCore``, which routes each to its peer's connection with its
source address; what the connections emit goes out (path challenges to the address they
name), the peers' deadlines are one ``loop.call_at``, waiters are futures. The cores decide.

Per wake of the event loop the endpoint reads every datagram waiting (up to
``rudp.sockets.READ_BATCH``) and only then asks each connection that got one for what to
send: a burst of DATA costs one ACK per batch and one epoll per batch. Sends made within
one loop iteration are written together just after it, in as few system calls as UDP GSO
allows (``rudp.gso``; one callback flushes every peer that sent). :meth:`RudpPeer.write`
and :meth:`RudpPeer.drain` queue messages without a future each, for bulk senders.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Callable
from typing import TypeVar

from rudp import packet as wire
from rudp import sockets
from rudp.aio.peer import RudpPeer
from rudp.aio.udp import UdpSocket
from rudp.config import RudpConfig
from rudp.connection import derive_connection_id
from rudp.endpoint import EndpointCore, EndpointStats
from rudp.errors import PeerUnreachable
from rudp.path import Address

K = TypeVar("K", bound=RudpPeer)

__all__ = ["EndpointStats", "PeerUnreachable", "RudpEndpoint", "RudpPeer", "derive_connection_id"]

DEFAULT_CONFIG = RudpConfig()


class RudpEndpoint(EndpointCore[RudpPeer]):
    """One UDP socket serving many RUDP peers, routed by connection id (``EndpointCore``)."""

    def __init__(
        self,
        config: RudpConfig,
        socket_buffer: int = sockets.SOCKET_BUFFER,
        protection: wire.Protection = wire.Protection.AEAD,
    ) -> None:
        self.config = config
        self.protection = protection
        self.socket_buffer = socket_buffer
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._socket = UdpSocket(self._loop, socket_buffer, self._read_ready)
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int = 0,
        config: RudpConfig = DEFAULT_CONFIG,
        *,
        socket_buffer: int = sockets.SOCKET_BUFFER,
        protection: wire.Protection = wire.Protection.AEAD,
    ) -> RudpEndpoint:
        """Bind a UDP socket on host:port (0 = any free port); ``socket_buffer`` sizes its
        kernel buffers (0 keeps the system default); ``protection``: AEAD, or the
        integrity-only reference of the benchmark. Raises OSError when binding fails."""
        endpoint = cls(config, socket_buffer, protection)
        await endpoint._socket.bind(host, port)
        return endpoint

    @property
    def local_addr(self) -> Address:
        return self._socket.local_addr

    def peer(self, key: bytes, addr: Address) -> RudpPeer:
        """The peer for ``key`` (created on first use; ``addr`` only sets a new peer's address)."""
        return self.peer_of(RudpPeer, key, addr)

    def peer_of(self, kind: type[K], key: bytes, addr: Address) -> K:
        """:meth:`peer` made as ``kind`` (with its report hooks); TypeError: made as another."""
        peer = self._peer(key, lambda: kind(self, key, addr, secrets.randbits(32)))
        if not isinstance(peer, kind):
            raise TypeError(f"the peer of this key is a {type(peer).__name__}")
        return peer

    async def rebind(self, host: str, port: int = 0) -> None:
        """Move to a new local address. Peers keep their state; what they have in flight
        is sent again from the new address at once (:meth:`RudpPeer.path_changed`), and
        the remote end follows after validating the new path. The old socket is still
        read for ``rudp.aio.udp.REBIND_LINGER`` seconds (what was on its way there is not lost)."""
        await self._socket.bind(host, port)
        self._moved()

    async def close(self) -> None:
        self._close_peers()
        self._socket.close()
        if self._timer is not None:
            self._timer.cancel()

    def _set_timer(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, lambda: self._timers_due(self._loop.time()))

    def _at_turn_end(self, flush: Callable[[], None]) -> None:
        self._loop.call_soon(flush)

    def _read_ready(self, sock: socket.socket) -> None:
        """Read what waits, then let each peer that got some answer once."""
        for peer in self.feed(sockets.read_batch(sock)):
            peer._flush()
