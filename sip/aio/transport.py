"""SIP transports for asyncio (RFC 3261 §18): UDP, TCP and TLS on one local host.

Glue only: bytes in become ``on_message(data, source, transport)`` calls, bytes out go
to the right socket. Stream messages are cut by Content-Length (:class:`StreamFramer`);
a stream that breaks framing is closed (§18.3). Connections are reused per peer, for
requests and responses alike (§18.2.2, and in-dialog requests to the same next hop).

Limits: accepted TCP and TLS connections pass :mod:`sip.admission` at the accept, before
any TLS handshake (``sip/aio/listener.py``): a total, a share per source address, a cap
on connections that have not sent a full message yet, a handshake timeout, a shorter
timeout for the first request than ``idle_timeout`` for established connections. A
stream message body may be at most ``max_body`` bytes (a larger Content-Length closes
the connection without buffering it). A double CRLF "ping" on a stream gets a single
CRLF "pong" (RFC 5626 §3.5.1); :meth:`Transports.ping_streams` sends such pings on the
connections we opened, which close after ``idle_timeout`` without traffic.

TLS (``sips:``, §26.2) listens on its own port with an :class:`ssl.SSLContext` for the
server side, and connects out with a client context that verifies the peer.
"""

from __future__ import annotations

import asyncio
import ctypes
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sip.admission import AdmissionLimits, Phase
from sip.aio.listener import Gate, StreamListener, listen_socket
from sip.errors import SipParseError
from sip.message import StreamFramer

Address = tuple[str, int]
STREAMS = ("tcp", "tls")
# Datagrams read per wake in batch mode: enough to amortise the loop's cost at 10k/s,
# few enough that the loop still turns (timers, TCP) under a flood.
UDP_BATCH = 64


def server_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The TLS server context from PEM ``cert``/``key`` (None without a certificate: no
    TLS listener)."""
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def client_context(ca: str | None) -> ssl.SSLContext:
    """The TLS client context: verifies the peer's certificate and name (§26.2.1) against
    ``ca`` (None: the system's CAs)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamLimits:
    """Bounds on TCP/TLS connections (see the module docstring and
    :class:`sip.admission.AdmissionLimits`)."""

    max_connections: int = 256
    idle_timeout: float = 300.0
    max_body: int = 65536
    max_per_source: int = 32
    max_pending: int = 64
    handshake_timeout: float = 5.0
    request_timeout: float = 10.0
    ipv6_prefix: int = 64

    def admission(self) -> AdmissionLimits:
        return AdmissionLimits(
            max_connections=self.max_connections,
            max_per_source=self.max_per_source,
            max_pending=self.max_pending,
            handshake_timeout=self.handshake_timeout,
            request_timeout=self.request_timeout,
            idle_timeout=self.idle_timeout,
            ipv6_prefix=self.ipv6_prefix,
        )


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
            # An IPv6 address comes with flow info and scope: (host, port) is the peer.
            batch.append((data, addr if len(addr) == 2 else (addr[0], addr[1])))
        if batch and self.owner.on_datagrams is not None:
            self.owner.on_datagrams(batch)

    def sendto(self, data: bytes, addr: Address) -> None:
        try:
            self.sock.sendto(data, addr)
        except OSError:
            self.owner.errors += 1

    def send_all(self, datagrams: Sequence[tuple[bytes, Address]]) -> None:
        """:meth:`sendto` for each (data, address), in order."""
        sendto = self.sock.sendto
        for data, addr in datagrams:
            try:
                sendto(data, addr)
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
    """One TCP or TLS connection. An accepted one (``admitted``: its id at the gate) has
    its deadlines kept by the gate; one we opened has its own idle timer."""

    def __init__(
        self, owner: Transports, kind: str, peer: Address | None = None,
        admitted: int | None = None,
    ) -> None:  # fmt: skip
        self.owner = owner
        self.kind = kind
        self.peer = peer
        self.admitted = admitted
        self.framer = StreamFramer(max_body=owner.limits.max_body)
        self.transport: asyncio.Transport | None = None
        self._idle: asyncio.TimerHandle | None = None

    @property
    def accepted(self) -> bool:
        return self.admitted is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.peer is None:
            self.peer = _norm(transport.get_extra_info("peername"))
        if self.admitted is not None:
            self.owner.accepted.add(self)
            self.owner.gate.bind(self.admitted, self._close_for_gate)
            if self.kind == "tls":
                self.owner.gate.handshake_done(self.admitted)
        else:
            self._touch()
        self.owner.conns[(self.kind, self.peer)] = self

    def _close_for_gate(self, phase: Phase) -> None:
        if self.transport is None:
            return
        if phase is Phase.ESTABLISHED:
            self.transport.close()
        else:  # nothing worth flushing, and a TLS close would wait for the peer
            self.transport.abort()

    def _touch(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self.owner.limits.idle_timeout, self._expire)

    def _expire(self) -> None:
        self.owner.own_idle_closed += 1
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.transport is None:
            return
        if self.admitted is not None:
            self.owner.gate.activity(self.admitted)
        else:
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
            if self.admitted is not None:
                self.owner.gate.message_seen(self.admitted)
            self.owner.on_parsed(msg, self.peer, self.kind)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle is not None:
            self._idle.cancel()
        if self.admitted is not None:
            self.owner.gate.release(self.admitted)
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
        # The admission policy of accepted connections, shared by TCP and TLS.
        self.gate = Gate(self.limits.admission())
        self.listeners: list[StreamListener] = []
        self.conns: dict[tuple[str, Address], _StreamConn] = {}
        self.local: Address = ("", 0)
        self.tls_local: Address | None = None
        self.errors = 0
        self.malformed = 0
        self.accepted: set[_StreamConn] = set()  # accepted stream connections open now
        self.own_idle_closed = 0  # connections we opened, closed when idle

    @property
    def refused(self) -> int:
        """Accepted connections closed at once (over a cap)."""
        return self.gate.refused

    @property
    def idle_closed(self) -> int:
        """Connections closed at a deadline: handshake, first request or idle."""
        return sum(self.gate.expired.values()) + self.own_idle_closed

    def _listen(self, sock: socket.socket, kind: str) -> StreamListener:
        def factory(conn: int) -> _StreamConn:
            return _StreamConn(self, kind, admitted=conn)

        tls = self.tls_server if kind == "tls" else None
        listener = StreamListener(sock, self.gate, factory, tls)
        self.listeners.append(listener)
        return listener

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
                sock = listen_socket(candidate[0], candidate[1])
            except OSError:
                udp.close()
                if port:
                    raise
                continue  # the UDP port's TCP twin was taken: try another
            self._listen(sock, "tcp")
            self.udp, self.local, bound = udp, candidate, candidate
            break
        if bound is None:
            raise OSError("no port free for both UDP and TCP")
        if self.tls_server is not None:
            self.tls_local = self._listen(listen_socket(bound[0], tls_port), "tls").local
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
            self._listen(tcp, "tcp")
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

    def send_udp(self, datagrams: Sequence[tuple[bytes, Address]]) -> None:
        """Send datagrams at once, in order (as :meth:`send_soon` each over UDP)."""
        udp = self.udp
        if isinstance(udp, _BatchUdp):
            udp.send_all(datagrams)
            return
        for data, dest in datagrams:
            self.send_soon(data, dest, "udp")

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
        self.gate.close_all()  # connections still in their handshake included
        for conn in list(self.conns.values()):
            if conn.transport is not None:
                conn.transport.close()
        self.conns.clear()
        self.accepted.clear()
        listeners, self.listeners = self.listeners, []
        for listener in listeners:
            await listener.close()
        self.tls_local = None
