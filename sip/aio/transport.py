"""SIP transports for asyncio (RFC 3261 §18): UDP, TCP and TLS on one local host.

Glue only: bytes in become ``on_message(data, source, transport)`` calls, bytes out go
to the right socket. Stream messages are cut by Content-Length (:class:`StreamFramer`);
a stream that breaks framing is closed (§18.3). Connections are reused per peer, for
requests and responses alike (§18.2.2, and in-dialog requests to the same next hop).

Limits (issue 12): at most ``StreamLimits.max_connections`` accepted connections (more
are closed at once), a connection idle for ``idle_timeout`` seconds is closed, and a
stream message body may be at most ``max_body`` bytes (a larger Content-Length closes
the connection without buffering it). A double CRLF "ping" on a stream gets a single
CRLF "pong" (RFC 5626 §3.5.1); :meth:`Transports.ping_streams` sends such pings on the
connections we opened.

TLS (``sips:``, §26.2) listens on its own port with an :class:`ssl.SSLContext` for the
server side, and connects out with a client context that verifies the peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sip.errors import SipParseError
from sip.message import StreamFramer

Address = tuple[str, int]
STREAMS = ("tcp", "tls")
# Datagrams read per wake in batch mode: enough to amortise the loop's cost at 10k/s,
# few enough that the loop still turns (timers, TCP) under a flood.
UDP_BATCH = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamLimits:
    """Bounds on TCP/TLS connections (see the module docstring)."""

    max_connections: int = 256
    idle_timeout: float = 300.0
    max_body: int = 65536


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


class _BatchUdp:
    """A UDP socket read in batches: every wake drains up to :data:`UDP_BATCH`
    datagrams and hands them over in one call, so a registrar can answer a burst with
    one store commit. asyncio's datagram transport reads one datagram per loop turn,
    and at thousands per second that turn costs more than the SIP work. Sends go
    straight to the socket; a full send buffer drops the datagram (UDP's own terms: the
    client retransmits)."""

    def __init__(
        self, owner: Transports, sock: socket.socket, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.owner = owner
        self.sock = sock
        self.loop = loop
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._drain)

    def _drain(self) -> None:
        batch: list[tuple[bytes, Address]] = []
        recvfrom = self.sock.recvfrom
        for _ in range(UDP_BATCH):
            try:
                data, addr = recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.owner.errors += 1  # ICMP unreachable etc.
                continue
            batch.append((data, (addr[0], addr[1])))
        if batch and self.owner.on_datagrams is not None:
            self.owner.on_datagrams(batch)

    def sendto(self, data: bytes, addr: Address) -> None:
        try:
            self.sock.sendto(data, addr)
        except OSError:
            self.owner.errors += 1

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


def bind_sockets(
    host: str, port: int, *, reuse_port: bool = False
) -> tuple[socket.socket, socket.socket]:
    """A UDP socket and a listening TCP socket on the same host and port (port 0: a port
    free for both). With ``reuse_port`` both carry SO_REUSEPORT, so worker processes that
    are handed them (or bind their own) share the port; the kernel spreads datagrams by
    their source and destination addresses, so one client always reaches one worker."""
    family = _family(host)
    for _ in range(20):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        tcp = socket.socket(family, socket.SOCK_STREAM)
        try:
            for sock in (udp, tcp):
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # A burst of thousands of REGISTERs must wait in the kernel, not be dropped.
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            udp.bind((host, port))
            bound = _norm(udp.getsockname())
            tcp.bind((host, bound[1]))
            tcp.listen(128)
        except OSError:
            udp.close()
            tcp.close()
            if port:
                raise
            continue
        return udp, tcp
    raise OSError("no port free for both UDP and TCP")


# Classic BPF (linux/filter.h) for SO_ATTACH_REUSEPORT_CBPF: the program sees the UDP
# payload and returns the index of the socket (in bind order) to deliver to.
_SO_ATTACH_REUSEPORT_CBPF = 51
_LD_W_ABS, _ADD_X, _MUL_K, _TAX, _TXA, _MOD_K, _RET_A = 0x20, 0x0C, 0x24, 0x07, 0x87, 0x94, 0x16
# Bytes 32..159 of a request: its Via (branch), From and To in practice.
_SPREAD_WORDS = range(32, 160, 4)


def spread_by_payload(sock: socket.socket, workers: int) -> None:
    """Make the SO_REUSEPORT group of ``sock`` pick a worker by a hash of the datagram's
    bytes 32-159 instead of by the sender's address. One busy client (a load generator,
    a proxy in front of us) then reaches every worker, and a retransmission, being the
    same bytes, still reaches the worker that answered it (whose answer cache has it).
    Datagrams shorter than that go to the first worker. Linux only; raises OSError."""
    program: list[tuple[int, int, int, int]] = []
    for offset in _SPREAD_WORDS:
        # X = (X + word) * 31, over 32-bit words (X starts at 0).
        program += [(_LD_W_ABS, 0, 0, offset), (_ADD_X, 0, 0, 0), (_MUL_K, 0, 0, 31),
                    (_TAX, 0, 0, 0)]  # fmt: skip
    program += [(_TXA, 0, 0, 0), (_MOD_K, 0, 0, workers), (_RET_A, 0, 0, 0)]
    filters = (_SockFilter * len(program))(*(_SockFilter(*i) for i in program))
    fprog = _SockFprog(len(program), ctypes.cast(filters, ctypes.c_void_p))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, bytes(fprog))


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.c_void_p))


class _StreamConn(asyncio.Protocol):
    def __init__(
        self, owner: Transports, kind: str, peer: Address | None = None, accepted: bool = False
    ) -> None:
        self.owner = owner
        self.kind = kind
        self.peer = peer
        self.accepted = accepted
        self.framer = StreamFramer(max_body=owner.limits.max_body)
        self.transport: asyncio.Transport | None = None
        self._idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.peer is None:
            self.peer = _norm(transport.get_extra_info("peername"))
        if self.accepted and len(self.owner.accepted) >= self.owner.limits.max_connections:
            self.owner.refused += 1
            self.peer = None
            transport.close()
            return
        if self.accepted:
            self.owner.accepted.add(self)
        self.owner.conns[(self.kind, self.peer)] = self
        self._touch()

    def _touch(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self.owner.limits.idle_timeout, self._expire)

    def _expire(self) -> None:
        self.owner.idle_closed += 1
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.transport is None:
            return
        self._touch()
        if self.framer.buffered == 0 and data.startswith(b"\r\n\r\n") and not data.strip():
            # RFC 5626 §3.5.1: a CRLFCRLF ping between messages gets a CRLF pong.
            self.transport.write(b"\r\n")
            return
        self.framer.feed(data)
        while True:
            try:
                msg = self.framer.next_message()
            except SipParseError as exc:
                self.owner.malformed += 1
                if self.framer.broken:
                    # A stream that lost framing cannot be resynchronised (§18.3).
                    self.transport.close()
                    return
                # A whole message that does not parse: answer it (400) and go on.
                if self.owner.on_malformed is not None:
                    self.owner.on_malformed(exc, self.peer, self.kind)
                continue
            if msg is None:
                return
            self.owner.on_parsed(msg, self.peer, self.kind)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self.owner.accepted.discard(self)
        if self.peer is None:
            return
        key = (self.kind, self.peer)
        if self.owner.conns.get(key) is self:
            del self.owner.conns[key]


class Transports:
    """A UDP socket plus (optionally) a TCP listener on the same host and port, and a TLS
    listener on ``tls_port`` when a server context is given."""

    def __init__(
        self,
        on_datagram: Callable[[bytes, Address, str], None],
        on_parsed: Callable[[object, Address, str], None],
        *,
        on_malformed: Callable[[SipParseError, Address, str], None] | None = None,
        limits: StreamLimits | None = None,
        tls_server: ssl.SSLContext | None = None,
        tls_client: ssl.SSLContext | None = None,
    ) -> None:
        self.on_datagram = on_datagram
        self.on_parsed = on_parsed
        self.on_malformed = on_malformed
        self.limits = limits or StreamLimits()
        self.tls_server = tls_server
        self.tls_client = tls_client
        self.udp: asyncio.DatagramTransport | _BatchUdp | None = None
        # Set before opening to read UDP in batches (see _BatchUdp); None: one by one.
        self.on_datagrams: Callable[[Sequence[tuple[bytes, Address]]], None] | None = None
        self.tcp_server: asyncio.Server | None = None
        self.tls_listener: asyncio.Server | None = None
        self.conns: dict[tuple[str, Address], _StreamConn] = {}
        self.local: Address = ("", 0)
        self.tls_local: Address | None = None
        self.errors = 0
        self.malformed = 0
        self.accepted: set[_StreamConn] = set()  # accepted stream connections open now
        self.refused = 0  # accepted connections closed at once (over the limit)
        self.idle_closed = 0

    @property
    def tcp_conns(self) -> dict[Address, _StreamConn]:
        """Open TCP connections by peer address."""
        return {peer: c for (kind, peer), c in self.conns.items() if kind == "tcp"}

    def stream_to(self, dest: Address) -> str | None:
        """The stream transport of an open connection to ``dest`` (TLS first), or None."""
        for kind in ("tls", "tcp"):
            conn = self.conns.get((kind, dest))
            if conn is not None and conn.transport is not None:
                return kind
        return None

    async def open(self, host: str, port: int, tcp: bool = True, tls_port: int = 0) -> Address:
        """Bind UDP (and TCP on the same port; TLS on ``tls_port`` when configured).
        Port 0 picks a port free for both UDP and TCP."""
        loop = asyncio.get_running_loop()
        bound: Address | None = None
        for _ in range(20):
            udp, _proto = await loop.create_datagram_endpoint(
                lambda: _Udp(self), local_addr=(host, port), family=_family(host)
            )
            candidate = _norm(udp.get_extra_info("sockname"))
            if not tcp:
                self.udp, self.local, bound = udp, candidate, candidate
                break
            try:
                server = await loop.create_server(
                    lambda: _StreamConn(self, "tcp", accepted=True),
                    host=candidate[0],
                    port=candidate[1],
                    reuse_address=True,
                )
            except OSError:
                udp.close()
                if port:
                    raise
                continue  # the UDP port's TCP twin was taken: try another
            self.udp, self.tcp_server, self.local, bound = udp, server, candidate, candidate
            break
        if bound is None:
            raise OSError("no port free for both UDP and TCP")
        if self.tls_server is not None:
            listener = await loop.create_server(
                lambda: _StreamConn(self, "tls", accepted=True),
                host=bound[0],
                port=tls_port,
                ssl=self.tls_server,
                reuse_address=True,
            )
            self.tls_listener = listener
            self.tls_local = _norm(listener.sockets[0].getsockname())
        return bound

    async def open_sockets(self, udp: socket.socket, tcp: socket.socket | None) -> Address:
        """Serve on sockets bound beforehand (:func:`bind_sockets`, or handed down by a
        parent process); no TLS. UDP is read in batches when :attr:`on_datagrams` is set."""
        loop = asyncio.get_running_loop()
        if self.on_datagrams is not None:
            self.udp = _BatchUdp(self, udp, loop)
        else:
            udp.setblocking(False)
            self.udp, _proto = await loop.create_datagram_endpoint(lambda: _Udp(self), sock=udp)
        self.local = _norm(udp.getsockname())
        if tcp is not None:
            tcp.setblocking(False)
            self.tcp_server = await loop.create_server(
                lambda: _StreamConn(self, "tcp", accepted=True), sock=tcp
            )
        return self.local

    async def send(self, data: bytes, dest: Address, transport: str) -> None:
        """Send one message; over a stream, connect first if there is no connection."""
        if transport in STREAMS:
            conn = self.conns.get((transport, dest))
            if conn is None or conn.transport is None or conn.transport.is_closing():
                loop = asyncio.get_running_loop()
                if transport == "tls":
                    if self.tls_client is None:
                        raise OSError("no TLS client context configured")
                    _t, conn = await loop.create_connection(
                        lambda: _StreamConn(self, "tls", dest),
                        host=dest[0],
                        port=dest[1],
                        ssl=self.tls_client,
                        server_hostname=dest[0],
                        local_addr=(self.local[0], 0),  # from our host, as TCP (a move)
                    )
                else:
                    _t, conn = await loop.create_connection(
                        lambda: _StreamConn(self, "tcp", dest),
                        host=dest[0],
                        port=dest[1],
                        local_addr=(self.local[0], 0),
                    )
            assert conn.transport is not None
            conn.transport.write(data)
            return
        if self.udp is not None:
            self.udp.sendto(data, dest)

    def ping_streams(self) -> int:
        """A CRLFCRLF keep-alive (RFC 5626 §3.5.1) on every stream connection we opened;
        how many. It keeps a flow the peer sends its requests back over open through its
        idle timeout (and ours: its CRLF pong counts as traffic)."""
        sent = 0
        for conn in self.conns.values():
            transport = conn.transport
            if not conn.accepted and transport is not None and not transport.is_closing():
                transport.write(b"\r\n\r\n")
                sent += 1
        return sent

    def send_soon(self, data: bytes, dest: Address, transport: str) -> None:
        """Send without awaiting (UDP at once; streams on a task)."""
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
        for conn in list(self.conns.values()):
            if conn.transport is not None:
                conn.transport.close()
        self.conns.clear()
        self.accepted.clear()
        for name in ("tcp_server", "tls_listener"):
            server: asyncio.Server | None = getattr(self, name)
            if server is not None:
                server.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 1.0)
                setattr(self, name, None)
        self.tls_local = None
