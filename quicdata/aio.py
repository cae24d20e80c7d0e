"""asyncio glue for the QUIC data channel: sockets, the timer and futures around the
sans-IO cores (``quicdata.connection``, ``quicdata.endpoint``), in the shape of
``rudp.aio``. The cores decide; this file wires them to the loop.

:class:`QuicDataServer` is one UDP socket serving many connections (the broker);
:func:`connect` opens the agent's connection, and :meth:`QuicDataClient.rebind` moves it
to a new local address (QUIC's client migration). Each connection is a
:class:`QuicDataPeer`: :meth:`~QuicDataPeer.send` queues a message, messages go to
``on_message`` or :meth:`~QuicDataPeer.receive`, and the end of the connection to
``on_disconnected`` with its reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from quicdata import sockets
from quicdata.binding import ServerCertificate
from quicdata.connection import DEFAULT_CONFIG, QuicDataConfig, QuicDataConnection, client
from quicdata.endpoint import ServerCore
from quicdata.events import Address, Connected, MessageReceived, PathValidated, PeerDisconnected

__all__ = ["QuicDataClient", "QuicDataPeer", "QuicDataServer", "connect"]


class _Udp:
    """A UDP socket on the loop that reads every datagram waiting per wake (asyncio's
    transports read one per loop turn): the messages of a burst reach the application
    in one turn, so it can take them together (one ``fsync``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int,
                 on_datagram: Callable[[bytes, Address], None]) -> None:  # fmt: skip
        self._sock = sockets.open_udp(host, port)
        self._loop, self._on_datagram = loop, on_datagram
        loop.add_reader(self._sock.fileno(), self._read)

    def _read(self) -> None:
        for data, addr in sockets.read_batch(self._sock):
            self._on_datagram(data, addr)

    def sendto(self, data: bytes, addr: Address) -> None:
        sockets.send(self._sock, data, addr)

    def get_extra_info(self, name: str) -> Address:
        host, port = self._sock.getsockname()[:2]
        return (str(host), int(port))

    def close(self) -> None:
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()


class QuicDataPeer:
    """One connection on the loop; nothing is reported after :meth:`close`."""

    def __init__(
        self,
        connection: QuicDataConnection,
        transmit: Callable[[bytes, Address], None],
        on_closed: Callable[[QuicDataPeer], None] = lambda peer: None,
    ) -> None:
        self.connection = connection
        self._loop = asyncio.get_running_loop()
        self._transmit = transmit
        self._on_closed = on_closed
        self._timer: asyncio.TimerHandle | None = None
        self._flush_soon = False
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._connected: asyncio.Future[None] = self._loop.create_future()
        self._connected.add_done_callback(lambda f: f.cancelled() or f.exception())
        #: Called with each message, in order, instead of keeping it for :meth:`receive`.
        self.on_message: Callable[[bytes], None] | None = None
        #: Called once with the reason when the connection ends.
        self.on_disconnected: Callable[[str], None] | None = None
        #: Called once both key proofs are checked (``session_id`` is known then).
        self.on_connected: Callable[[], None] | None = None
        #: Called with the new address and the one before it after a validated move.
        self.on_path_changed: Callable[[Address, Address | None], None] | None = None
        self.disconnected: str | None = None  # the reason, once over

    @property
    def session_id(self) -> bytes | None:
        return self.connection.session_id

    async def wait_connected(self) -> None:
        """Return once both key proofs are checked. Raises ConnectionError when the
        connection ended before."""
        await asyncio.shield(self._connected)

    def send(self, message: bytes) -> None:
        """Queue one message (sent at the end of this loop turn). Raises QuicDataClosed,
        StreamFramingError."""
        self.connection.send_message(message)
        self._flush_later()

    async def receive(self) -> bytes:
        return await self._inbox.get()

    def close(self, reason: str = "closed") -> None:
        self.connection.close(reason)
        self._flush()
        self._stop()

    def migrated(self) -> None:
        self.connection.migrate(self._loop.time())
        self._flush()

    def _feed(self, data: bytes, source: Address) -> None:
        self.connection.receive_datagram(data, source, self._loop.time())
        self._flush_later()

    def _flush_later(self) -> None:
        if not self._flush_soon:
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        connection = self.connection
        for data, addr in connection.datagrams_to_send(self._loop.time()):
            self._transmit(data, addr)
        self._events()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = connection.get_timer()
        if when is not None and self.disconnected is None:
            self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.connection.handle_timer(self._loop.time())
        self._flush()

    def _events(self) -> None:
        while (event := self.connection.next_event()) is not None:
            if isinstance(event, MessageReceived):
                if self.on_message is not None:
                    self.on_message(event.data)
                else:
                    self._inbox.put_nowait(event.data)
            elif isinstance(event, Connected):
                if not self._connected.done():
                    self._connected.set_result(None)
                if self.on_connected is not None:
                    self.on_connected()
            elif isinstance(event, PathValidated):
                if self.on_path_changed is not None:
                    self.on_path_changed(event.address, event.previous)
            elif isinstance(event, PeerDisconnected):
                self.disconnected = event.reason
                if not self._connected.done():
                    self._connected.set_exception(ConnectionError(event.reason))
                if self.on_disconnected is not None:
                    self.on_disconnected(event.reason)
                self._loop.call_soon(self._stop)  # its CONNECTION_CLOSE goes out first

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.on_message = None
        self.on_disconnected = None
        self.on_connected = None
        if not self._connected.done():
            self._connected.set_exception(ConnectionError("closed"))
        self._on_closed(self)


class QuicDataServer:
    """One UDP socket serving many connections (``ServerCore`` routes them); each new
    one goes to ``on_connection`` before its first event."""

    def __init__(self, core: ServerCore, on_connection: Callable[[QuicDataPeer], None]) -> None:
        self.core = core
        self._on_connection = on_connection
        self._loop = asyncio.get_running_loop()
        self._transport: _Udp | None = None
        self._peers: dict[QuicDataConnection, QuicDataPeer] = {}

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        certificate: ServerCertificate,
        lookup: Callable[[bytes], bytes | None],
        on_connection: Callable[[QuicDataPeer], None],
        config: QuicDataConfig = DEFAULT_CONFIG,
    ) -> QuicDataServer:
        """Bind host:port (0: any free port). Raises OSError."""
        server = cls(ServerCore(certificate, lookup, config), on_connection)
        server._transport = _Udp(server._loop, host, port, server._datagram)
        return server

    @property
    def local_addr(self) -> Address:
        assert self._transport is not None
        name = self._transport.get_extra_info("sockname")
        return (str(name[0]), int(name[1]))

    @property
    def peers(self) -> list[QuicDataPeer]:
        return list(self._peers.values())

    def _datagram(self, data: bytes, source: Address) -> None:
        connection, new = self.core.receive(data, source, self._loop.time())
        if connection is None:
            return
        if new:
            peer = QuicDataPeer(connection, self._send, self._closed)
            self._peers[connection] = peer
            self._on_connection(peer)
        peer = self._peers[connection]
        peer._flush_later()

    def _send(self, data: bytes, addr: Address) -> None:
        if self._transport is not None:
            self._transport.sendto(data, addr)

    def _closed(self, peer: QuicDataPeer) -> None:
        self.core.forget(peer.connection)
        self._peers.pop(peer.connection, None)

    async def close(self) -> None:
        for peer in list(self._peers.values()):
            peer.close("server closing")
        if self._transport is not None:
            self._transport.close()
            self._transport = None


class QuicDataClient:
    """The agent's connection and its socket; :meth:`rebind` moves it."""

    def __init__(self, server: Address) -> None:
        self.server = server
        self._loop = asyncio.get_running_loop()
        self._transport: _Udp | None = None
        self.peer: QuicDataPeer | None = None

    @property
    def local_addr(self) -> Address:
        assert self._transport is not None
        name = self._transport.get_extra_info("sockname")
        return (str(name[0]), int(name[1]))

    async def _bind(self, host: str, port: int) -> None:
        old, self._transport = self._transport, _Udp(self._loop, host, port, self._datagram)
        if old is not None:
            old.close()

    async def rebind(self, host: str, port: int = 0) -> None:
        """Move to host:port: the connection goes on from there (the server validates the
        new path). Raises OSError (the old socket stays)."""
        await self._bind(host, port)
        if self.peer is not None:
            self.peer.migrated()

    def _datagram(self, data: bytes, source: Address) -> None:
        if self.peer is not None:
            self.peer._feed(data, source)

    def _send(self, data: bytes, addr: Address) -> None:
        if self._transport is not None:
            self._transport.sendto(data, addr)

    def close(self) -> None:
        if self.peer is not None and self.peer.disconnected is None:
            self.peer.close()
        if self._transport is not None:
            self._transport.close()
            self._transport = None


async def connect(
    server: Address,
    session_secret: bytes,
    fingerprint: bytes,
    *,
    local_host: str = "0.0.0.0",
    config: QuicDataConfig = DEFAULT_CONFIG,
) -> QuicDataClient:
    """Open the agent's connection to ``server`` (it does not wait for the handshake:
    ``client.peer.wait_connected()`` does). Raises OSError."""
    quic_client = QuicDataClient(server)
    await quic_client._bind(local_host, 0)
    loop = asyncio.get_running_loop()
    connection = client(session_secret, fingerprint, server, loop.time(), config)
    quic_client.peer = QuicDataPeer(connection, quic_client._send)
    quic_client.peer._flush()
    return quic_client
