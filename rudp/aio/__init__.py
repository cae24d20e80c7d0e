"""asyncio adapter for the RUDP core: one UDP socket per endpoint, many peers.

Glue only (the core is sans-IO; tests/test_layering.py checks it): datagrams go into
``RudpConnection.receive_datagram``, timers are one ``loop.call_at`` per peer, events
become future results, exceptions and queue items. The core decides everything.

Per wake of the event loop the endpoint reads every datagram waiting (up to
``READ_BATCH``), hands each to its connection, and only then asks each connection that
got one for what to send: a burst of DATA costs one ACK per batch, not one per two
packets, and one epoll per batch, not per datagram (asyncio's datagram transport reads
one datagram per wake). Sends made by the application within one loop iteration are
likewise written together, once, just after it; the datagrams of one flush leave in as
few system calls as UDP GSO allows (``rudp.aio.gso``; Linux, else one ``sendto`` each).
For bulk senders, :meth:`RudpPeer.write` and :meth:`RudpPeer.drain` queue messages
without a future each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rudp import packet as wire
from rudp.aio import gso
from rudp.config import RudpConfig
from rudp.connection import (
    MessageAcked,
    MessageFailed,
    MessageReceived,
    PathResponseReceived,
    PeerDisconnected,
    RudpConnection,
    RudpStats,
    derive_connection_id,
)
from rudp.errors import MessageTooLarge, PacketError, PeerUnreachable, RudpError

DEFAULT_CONFIG = RudpConfig()
log = logging.getLogger("rudp")
# A path challenge is sent again (same token) at most this often while the candidate
# address keeps sending; the core's RTO would be too slow for a first packet.
CHALLENGE_INTERVAL = 0.05
# Kernel socket buffers: a window of small datagrams costs ~2 KB each of kernel memory
# (skb truesize), so Linux's 208 KB default drops a 512-packet burst on loopback.
SOCKET_BUFFER = 4 << 20


# Datagrams read per wake before the connections are asked what to send (bounds how long
# one busy socket keeps the loop from everything else).
READ_BATCH = 64
# After a rebind the old socket is still read this long (and only read): datagrams the
# peer sent before it learnt of the move are not lost while the old address still works.
REBIND_LINGER = 2.0
MAX_DATAGRAM = 65535


def set_socket_buffers(sock: socket.socket, size: int) -> None:
    """Ask for ``size``-byte send and receive buffers (the kernel caps it at rmem/wmem_max)."""
    if size <= 0:
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


class RudpPeer:
    """One peer of an endpoint, identified by its session key (never by its address).

    Messages go to :meth:`receive`, or, once :attr:`on_message` is set, to that callback
    (in order, on the loop): a server holding thousands of peers then needs no reader
    task per peer. The inbox queue is only built when :meth:`receive` is first used.
    """

    # A broker holds one peer per session (issue 14): no per-instance __dict__.
    __slots__ = (
        "_candidate",
        "_challenged_at",
        "_closed",
        "_drains",
        "_endpoint",
        "_flush_soon",
        "_inbox",
        "_loop",
        "_source",
        "_timer",
        "_timer_at",
        "_token",
        "_waiters",
        "_written",
        "addr",
        "connection",
        "key",
        "on_disconnected",
        "on_heard",
        "on_message",
        "path_changes",
    )

    def __init__(self, endpoint: RudpEndpoint, key: bytes, addr: tuple[str, int]) -> None:
        self._endpoint = endpoint
        self._loop = endpoint._loop
        self.addr = addr
        self.key = key
        self.connection = RudpConnection(
            key,
            endpoint.config,
            sender_id=int.from_bytes(secrets.token_bytes(4), "big"),
            protection=endpoint.protection,
        )
        # Path validation (docs/rudp.md §2): an address the peer seems to speak from is a
        # candidate until it echoes our PATH_CHALLENGE token from that same address.
        self._candidate: tuple[str, int] | None = None
        self._token = b""
        self._challenged_at = 0.0
        self._source: tuple[str, int] | None = None
        self.path_changes = 0
        self.on_disconnected: Callable[[PeerUnreachable], None] | None = None
        # Called for every authenticated datagram (DATA, ACK or PING): lets the owner see
        # a peer it gave up on talking again, before any message arrives.
        self.on_heard: Callable[[], None] | None = None
        #: Called with each message received, in order, instead of queueing it for
        #: :meth:`receive` (what was queued before it was set stays for ``receive``).
        self.on_message: Callable[[bytes], None] | None = None
        # The future of each message sent with send_nowait, or the _Batch it belongs to.
        self._waiters: dict[int, asyncio.Future[None] | _Batch] = {}
        # write()/drain(): the last message id written, and drains waiting for an id to be
        # acknowledged, oldest first (ids only grow, so acks resolve them in order).
        self._written = -1
        self._drains: deque[tuple[int, asyncio.Future[None]]] | None = None
        self._inbox: asyncio.Queue[bytes] | None = None  # built by the first receive()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._flush_soon = False  # a flush is scheduled for the end of this iteration
        self._closed = False

    @property
    def connected(self) -> bool:
        return self.connection.connected

    @property
    def stats(self) -> RudpStats:
        return self.connection.stats

    def set_address(self, addr: tuple[str, int]) -> None:
        """Send to ``addr`` from now on (e.g. after a re-INVITE carried a new media
        address); if it is a new one, what is in flight is sent there at once
        (:meth:`RudpConnection.path_changed`)."""
        if addr != self.addr:
            self.connection.path_changed(self._loop.time())
        self.addr = addr
        if self._candidate == addr:
            self._candidate = None
        self._pump()

    def path_changed(self) -> None:
        """Our own address changed (the endpoint was rebound): resend what is in flight
        from the new one at once instead of at the next timeout."""
        self.connection.path_changed(self._loop.time())
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
        await self.send_nowait(message)

    def send_nowait(self, message: bytes) -> asyncio.Future[None]:
        """:meth:`send` without a coroutine: queue the message now and return the future
        that :meth:`send` awaits (its result when acknowledged, PeerUnreachable when the
        retries ran out). A server sending many messages needs no task per message.

        Raises PeerUnreachable (endpoint closed, peer DISCONNECTED) and MessageTooLarge
        at once.
        """
        if self._closed:
            raise PeerUnreachable("endpoint closed", message)
        message_id = self.connection.send_message(message, self._loop.time())
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters[message_id] = future
        if not self._flush_soon:  # sends of this iteration leave together (module doc)
            self._flush_soon = True
            self._loop.call_soon(self._flush)
        return future

    def send_many_nowait(self, messages: Sequence[bytes]) -> asyncio.Future[None]:
        """:meth:`send_nowait` for several messages, queued in order, with one future for
        all of them: its result once the peer acknowledged every one, PeerUnreachable as
        soon as one of them failed. A server sending a window of messages at once pays
        one future and one callback for it, not one per message (issue 14).

        Raises PeerUnreachable (endpoint closed, peer DISCONNECTED) and MessageTooLarge
        at once, before any of them is queued; ValueError for no message.
        """
        if not messages:
            raise ValueError("send_many_nowait needs at least one message")
        if self._closed:
            raise PeerUnreachable("endpoint closed", messages[0])
        limit = self.connection.config.max_message_size
        for message in messages:  # all or none: checked before the first is queued
            if len(message) > limit:
                raise MessageTooLarge(f"{len(message)} > {limit} bytes")
        now = self._loop.time()
        send = self.connection.send_message
        batch = _Batch(self._loop.create_future(), len(messages))
        waiters = self._waiters
        queued: list[int] = []
        try:
            for message in messages:
                message_id = send(message, now)
                waiters[message_id] = batch
                queued.append(message_id)
        except PeerUnreachable:
            # DISCONNECTED raises at the first; only an exhausted sequence space midway
            # (re-key) can leave some queued: they go on without a waiter, as write()'s.
            for message_id in queued:
                del waiters[message_id]
            raise
        if not self._flush_soon:
            self._flush_soon = True
            self._loop.call_soon(self._flush)
        return batch.future

    def write(self, message: bytes) -> None:
        """Queue one message without waiting for it (a stream's ``write``): no future per
        message, for bulk senders; :meth:`drain` waits for everything written so far.

        Raises PeerUnreachable when closed or DISCONNECTED; MessageTooLarge.
        """
        if self._closed:
            raise PeerUnreachable("endpoint closed", message)
        self._written = self.connection.send_message(message, self._loop.time())
        if not self._flush_soon:
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    async def drain(self) -> None:
        """Return when the peer acknowledged every message :meth:`write` queued so far.

        Raises PeerUnreachable when one of them failed (retries ran out) or on close.
        """
        if self._written < 0 or not self.connection.is_pending(self._written):
            return
        future: asyncio.Future[None] = self._loop.create_future()
        if self._drains is None:
            self._drains = deque()
        self._drains.append((self._written, future))
        await future

    async def receive(self) -> bytes:
        """The next message, in order."""
        return await self._queue().get()

    def _queue(self) -> asyncio.Queue[bytes]:
        if self._inbox is None:
            self._inbox = asyncio.Queue()
        return self._inbox

    def _feed(self, data: bytes, addr: tuple[str, int]) -> None:
        """Take one datagram; its events are handled now, its answers at :meth:`_flush`."""
        # Known to every _pump this datagram causes, including one run from on_heard
        # (a PATH_RESPONSE is only valid from the address that was challenged).
        self._source = addr
        if self.connection.receive_datagram(data, self._loop.time()):
            if addr != self.addr:
                # Authentic and newest, but a copy with a forged source is too: only an
                # answered challenge moves the peer (QUIC's path validation, RFC 9000 §8.2).
                self._challenge(addr)
            if self.on_heard is not None:
                self.on_heard()
        self._source = addr
        if not self._closed:
            self._events()
        self._source = None

    def _challenge(self, addr: tuple[str, int]) -> None:
        now = self._loop.time()
        if addr == self._candidate and now - self._challenged_at < CHALLENGE_INTERVAL:
            return
        if addr != self._candidate:
            self._candidate = addr
            self._token = secrets.token_bytes(8)
            log.info("rudp peer %s: validating new path %s (was %s)", self._cid, addr, self.addr)
        self._challenged_at = now
        self._endpoint._sendto(self.connection.path_challenge(self._token, now), addr)

    @property
    def _cid(self) -> str:
        return f"{self.connection.cid:016x}"

    def _path_response(self, token: bytes) -> bool:
        """Follow the peer to the challenged address if ``token`` answers our challenge
        from there; whether it moved."""
        source = self._source
        if source is None or source != self._candidate or token != self._token:
            log.info("rudp peer %s: path response from %s ignored", self._cid, source)
            return False
        log.info("rudp peer %s: path %s validated; moved from %s", self._cid, source, self.addr)
        self.connection.path_changed(self._loop.time())
        self.addr = source
        self._candidate = None
        self.path_changes += 1
        return True

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.connection.handle_timer(self._loop.time())
        self._pump()

    def _pump(self) -> None:
        if self._closed:
            return
        self._events()
        self._flush()

    def _flush(self) -> None:
        """Write what the connection has to send; re-arm the timer."""
        self._flush_soon = False
        if self._closed:
            return
        datagrams = self.connection.datagrams_to_send(self._loop.time())
        if datagrams:
            self._endpoint._send_many(datagrams, self.addr)
        self._events()
        when = self.connection.get_timer()
        # Only an earlier deadline moves the timer: one that fires early finds nothing due
        # and re-arms (deadlines move later on nearly every ACK; a call_at each is dearer).
        if when is not None and (self._timer_at is None or when < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(when, self._on_timer)
            self._timer_at = when

    def _events(self) -> None:
        """Turn the connection's events into future results and inbox items."""
        moved = False
        while (event := self.connection.next_event()) is not None:
            if isinstance(event, MessageReceived):
                if self.on_message is not None:
                    self.on_message(event.data)
                else:
                    self._queue().put_nowait(event.data)
            elif isinstance(event, MessageAcked):
                waiter = self._waiters.pop(event.message_id, None)
                if isinstance(waiter, _Batch):
                    waiter.left -= 1
                    if not waiter.left and not waiter.future.done():
                        waiter.future.set_result(None)
                elif waiter is not None and not waiter.done():
                    waiter.set_result(None)
                drains = self._drains
                while drains and drains[0][0] <= event.message_id:
                    _, future = drains.popleft()
                    if not future.done():
                        future.set_result(None)
            elif isinstance(event, MessageFailed):
                failed = _future_of(self._waiters.pop(event.message_id, None))
                if failed is not None and not failed.done():
                    failed.set_exception(PeerUnreachable("no ACK after retries", event.data))
                if self._drains:
                    # Every drain still waiting covers this message (those below it were
                    # resolved by its predecessors' acks): it fails.
                    error = PeerUnreachable("no ACK after retries", event.data)
                    for _, future in self._drains:
                        if not future.done():
                            future.set_exception(error)
                    self._drains = None
            elif isinstance(event, PathResponseReceived):
                moved = self._path_response(event.token) or moved
            elif isinstance(event, PeerDisconnected) and self.on_disconnected is not None:
                self.on_disconnected(PeerUnreachable(f"{event.failed} messages failed"))
        if not self._waiters:
            self._waiters.clear()  # an emptied dict keeps its table; clear() frees it
        if moved:  # what was in flight goes to the validated address now, not at the RTO
            self._flush()

    def _close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for waiter in self._waiters.values():
            future = _future_of(waiter)
            if future is not None and not future.done():
                future.set_exception(PeerUnreachable("endpoint closed"))
        self._waiters.clear()
        for _, future in self._drains or ():
            if not future.done():
                future.set_exception(PeerUnreachable("endpoint closed"))
        self._drains = None


class _Batch:
    """The messages of one :meth:`RudpPeer.send_many_nowait`: their future, and how many
    of them are not acknowledged yet."""

    __slots__ = ("future", "left")

    def __init__(self, future: asyncio.Future[None], left: int) -> None:
        self.future = future
        self.left = left


def _future_of(waiter: asyncio.Future[None] | _Batch | None) -> asyncio.Future[None] | None:
    return waiter.future if isinstance(waiter, _Batch) else waiter


class RudpEndpoint:
    """One UDP socket serving many RUDP peers, routed by connection id."""

    def __init__(
        self,
        config: RudpConfig,
        socket_buffer: int = SOCKET_BUFFER,
        protection: wire.Protection = wire.Protection.AEAD,
    ) -> None:
        self.config = config
        self.protection = protection
        self.socket_buffer = socket_buffer
        self.stats = EndpointStats()
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._backlog: deque[tuple[bytes, tuple[str, int]]] = deque()  # socket buffer full
        self._lingering: set[socket.socket] = set()  # old sockets after a rebind, read only
        self._peers: dict[int, RudpPeer] = {}
        self._gso = gso.AVAILABLE  # cleared when the kernel refuses it
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
        protection: wire.Protection = wire.Protection.AEAD,
    ) -> RudpEndpoint:
        """Bind a UDP socket on host:port (0 = any free port); ``socket_buffer`` sizes its
        kernel buffers (0 keeps the system default); ``protection``: AEAD, or the
        integrity-only reference of the benchmark. Raises OSError when binding fails."""
        endpoint = cls(config, socket_buffer, protection)
        await endpoint._bind(host, port)
        return endpoint

    async def _bind(self, host: str, port: int) -> None:
        try:  # a numeric address needs no resolver thread (a move should not wait for one)
            infos = socket.getaddrinfo(
                host, port, type=socket.SOCK_DGRAM, flags=socket.AI_NUMERICHOST
            )
        except socket.gaierror:
            infos = await self._loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        family, kind, proto, _, where = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.bind(where)
        except OSError:
            sock.close()
            raise
        set_socket_buffers(sock, self.socket_buffer)
        gso.enable_gro(sock)  # a GSO run from the peer (or the proxy) is one read here
        self._loop.add_reader(sock.fileno(), self._read_ready, sock)
        self._sock = sock

    def _unbind(self, sock: socket.socket) -> None:
        self._loop.remove_reader(sock.fileno())
        if self._backlog:
            self._loop.remove_writer(sock.fileno())
            self._backlog.clear()
        sock.close()
        for old in list(self._lingering):
            self._close_lingering(old)

    def _close_lingering(self, sock: socket.socket) -> None:
        if sock in self._lingering:
            self._lingering.discard(sock)
            self._loop.remove_reader(sock.fileno())
            sock.close()

    @property
    def local_addr(self) -> tuple[str, int]:
        if self._sock is None:
            raise RudpError("endpoint closed")
        name = self._sock.getsockname()
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
        """Move to a new local address. Peers keep their state; what they have in flight
        is sent again from the new address at once (:meth:`RudpPeer.path_changed`), and
        the remote end follows after validating the new path. The old socket is still
        read for ``REBIND_LINGER`` seconds (what was on its way there is not lost)."""
        for sock in list(self._lingering):
            if port and sock.getsockname()[:2] == (host, port):
                self._close_lingering(sock)  # moving back to it before it was closed
        old = self._sock
        await self._bind(host, port)
        if old is not None:
            if self._backlog:  # what waits for the old socket's buffer goes from the new one
                self._loop.remove_writer(old.fileno())
                self._loop.add_writer(self._sock.fileno(), self._write_ready)  # type: ignore[union-attr]
            self._lingering.add(old)
            self._loop.call_later(REBIND_LINGER, self._close_lingering, old)
        for peer in self._peers.values():
            peer.path_changed()

    async def close(self) -> None:
        for peer in self._peers.values():
            peer._close()
        self._peers.clear()
        if self._sock is not None:
            self._unbind(self._sock)
            self._sock = None

    def _sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        sock = self._sock
        if sock is None:
            return
        if self._backlog:
            self._backlog.append((data, addr))
            return
        try:
            sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            self._backlog.append((data, addr))
            self._loop.add_writer(sock.fileno(), self._write_ready)
        except OSError:
            pass  # ICMP errors on UDP: the retransmission timer is the only judge

    def _send_many(self, datagrams: list[bytes], addr: tuple[str, int]) -> None:
        """Send ``datagrams`` to ``addr`` in order; runs of one size share a system call
        (``rudp.aio.gso``) where the kernel allows it."""
        if not self._gso or len(datagrams) == 1 or self._backlog:
            for data in datagrams:
                self._sendto(data, addr)
            return
        for start, end in gso.runs(datagrams):
            if end - start == 1 or not self._gso or self._backlog:
                for data in datagrams[start:end]:
                    self._sendto(data, addr)
            else:
                self._send_run(datagrams[start:end], addr)

    def _send_run(self, run: list[bytes], addr: tuple[str, int]) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            gso.send_run(sock, run, addr)
        except (BlockingIOError, InterruptedError):
            self._backlog.extend((data, addr) for data in run)
            self._loop.add_writer(sock.fileno(), self._write_ready)
        except OSError as error:
            if error.errno in gso.REFUSED:
                log.info("rudp endpoint: UDP GSO refused (%s); sending one by one", error)
                self._gso = False
            # Else an ICMP error queued on the socket was reported (and cleared) instead
            # of sending: nothing went out, so send them one by one.
            for data in run:
                self._sendto(data, addr)

    def _write_ready(self) -> None:
        sock = self._sock
        assert sock is not None
        while self._backlog:
            data, addr = self._backlog[0]
            try:
                sock.sendto(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                pass
            self._backlog.popleft()
        self._loop.remove_writer(sock.fileno())

    def _read_ready(self, sock: socket.socket) -> None:
        """Read what waits (up to READ_BATCH), then let each peer that got some answer once."""
        touched: dict[int, RudpPeer] = {}
        read = 0
        while read < READ_BATCH and sock.fileno() >= 0:  # closed by what a datagram caused
            read += 1
            try:
                data, ancdata, _, addr = sock.recvmsg(MAX_DATAGRAM, gso.ANCILLARY)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue  # an ICMP error queued on the socket: nothing to read in it
            source = (str(addr[0]), int(addr[1]))
            grams = gso.segments(data, ancdata)
            read += len(grams) - 1  # the batch bounds datagrams, not reads
            for datagram in grams:
                peer = self._route(datagram)
                if peer is not None:
                    peer._feed(datagram, source)
                    touched[id(peer)] = peer
                if sock.fileno() < 0:
                    break
        for peer in touched.values():
            peer._flush()

    def _route(self, data: bytes) -> RudpPeer | None:
        self.stats.datagrams_received += 1
        if self.drop_incoming:
            self.stats.dropped_incoming += 1
            return None
        try:
            cid = wire.peek_cid(data)
        except PacketError:
            self.stats.malformed += 1
            return None
        peer = self._peers.get(cid)
        if peer is None:
            self.stats.unknown_cid += 1
        return peer
