"""SIP transports for asyncio (RFC 3261 §18): UDP and TCP on one local address.

Glue only: bytes in become ``on_message(data, source, transport)`` calls, bytes out go
to the right socket. TCP messages are cut by Content-Length (:class:`StreamFramer`);
a stream that breaks framing is closed (§18.3). Connections are reused per peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

from sip.errors import SipParseError
from sip.message import StreamFramer

Address = tuple[str, int]


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _norm(addr: tuple[object, ...]) -> Address:
    return (str(addr[0]), int(str(addr[1])))


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, owner: Transports) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self.owner.on_datagram(data, _norm(addr), "udp")

    def error_received(self, exc: Exception) -> None:
        self.owner.errors += 1  # ICMP unreachable etc.: the transaction timers cope


class _TcpConn(asyncio.Protocol):
    def __init__(self, owner: Transports, peer: Address | None = None) -> None:
        self.owner = owner
        self.peer = peer
        self.framer = StreamFramer()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.peer is None:
            self.peer = _norm(transport.get_extra_info("peername"))
        self.owner.tcp_conns[self.peer] = self

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None
        self.framer.feed(data)
        try:
            while (msg := self.framer.next_message()) is not None:
                self.owner.on_parsed(msg, self.peer, "tcp")
        except SipParseError:
            # A stream that lost framing cannot be resynchronised (§18.3): close it.
            self.owner.malformed += 1
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.owner.tcp_conns.get(self.peer) is self:
            del self.owner.tcp_conns[self.peer]


class Transports:
    """UDP socket plus (optionally) a TCP listener on the same host and port."""

    def __init__(
        self,
        on_datagram: Callable[[bytes, Address, str], None],
        on_parsed: Callable[[object, Address, str], None],
    ) -> None:
        self.on_datagram = on_datagram
        self.on_parsed = on_parsed
        self.udp: asyncio.DatagramTransport | None = None
        self.tcp_server: asyncio.Server | None = None
        self.tcp_conns: dict[Address, _TcpConn] = {}
        self.local: Address = ("", 0)
        self.errors = 0
        self.malformed = 0

    async def open(self, host: str, port: int, tcp: bool = True) -> Address:
        """Bind UDP (and TCP on the same port). Port 0 picks a port free for both."""
        loop = asyncio.get_running_loop()
        for _ in range(20):
            udp, _proto = await loop.create_datagram_endpoint(
                lambda: _Udp(self), local_addr=(host, port), family=_family(host)
            )
            bound = _norm(udp.get_extra_info("sockname"))
            if not tcp:
                self.udp, self.local = udp, bound
                return bound
            try:
                server = await loop.create_server(
                    lambda: _TcpConn(self), host=bound[0], port=bound[1], reuse_address=True
                )
            except OSError:
                udp.close()
                if port:
                    raise
                continue  # the UDP port's TCP twin was taken: try another
            self.udp, self.tcp_server, self.local = udp, server, bound
            return bound
        raise OSError("no port free for both UDP and TCP")

    async def send(self, data: bytes, dest: Address, transport: str) -> None:
        """Send one message; over TCP, connect first if there is no connection to ``dest``."""
        if transport == "tcp":
            conn = self.tcp_conns.get(dest)
            if conn is None or conn.transport is None or conn.transport.is_closing():
                loop = asyncio.get_running_loop()
                _t, conn = await loop.create_connection(
                    lambda: _TcpConn(self, dest),
                    host=dest[0],
                    port=dest[1],
                    local_addr=(self.local[0], 0),
                )
            assert conn.transport is not None
            conn.transport.write(data)
            return
        if self.udp is not None:
            self.udp.sendto(data, dest)

    def send_soon(self, data: bytes, dest: Address, transport: str) -> None:
        """Send without awaiting (UDP at once; TCP on a task)."""
        if transport == "udp" and self.udp is not None:
            self.udp.sendto(data, dest)
            return
        task = asyncio.get_running_loop().create_task(self.send(data, dest, transport))
        task.add_done_callback(self._count_error)

    def _count_error(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.errors += 1

    async def close(self) -> None:
        """Close every socket."""
        if self.udp is not None:
            self.udp.close()
            self.udp = None
        for conn in list(self.tcp_conns.values()):
            if conn.transport is not None:
                conn.transport.close()
        self.tcp_conns.clear()
        if self.tcp_server is not None:
            self.tcp_server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.tcp_server.wait_closed(), 1.0)
            self.tcp_server = None
