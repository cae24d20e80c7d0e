"""The endpoint's sockets on the event loop: the current one, read and written, and the
ones it left by a rebind, still read for ``REBIND_LINGER`` seconds (what the peer sent
there before it learnt of the move is not lost). The system calls are ``rudp.sockets``'."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from rudp import sockets
from rudp.errors import RudpError
from rudp.sockets import Address

# After a rebind the old socket is still read this long (and only read).
REBIND_LINGER = 2.0


class UdpSocket(sockets.UdpSender):
    """Writes keep their order across a full kernel buffer and a rebind (``UdpSender``)."""

    __slots__ = ("_buffer", "_lingering", "_loop", "_on_readable")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, buffer: int,
        on_readable: Callable[[socket.socket], None],
    ) -> None:  # fmt: skip
        super().__init__(self._blocked)
        self._loop = loop
        self._buffer = buffer
        self._on_readable = on_readable
        self._lingering: set[socket.socket] = set()

    @property
    def local_addr(self) -> Address:
        if self.sock is None:
            raise RudpError("endpoint closed")
        name = self.sock.getsockname()
        return (str(name[0]), int(name[1]))

    async def bind(self, host: str, port: int) -> None:
        """Read and write on host:port from now on; the socket before lingers. Raises
        OSError when binding fails (the socket before stays in use)."""
        for sock in list(self._lingering):
            if port and sock.getsockname()[:2] == (host, port):
                self._close_lingering(sock)  # moving back to it before it was closed
        # A numeric address needs no resolver thread (a move should not wait for one).
        infos = sockets.numeric_address(host, port)
        if infos is None:
            infos = await self._loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        sock = sockets.open_udp(infos[0], self._buffer)
        self._loop.add_reader(sock.fileno(), self._on_readable, sock)
        old, self.sock = self.sock, sock
        if old is not None:
            if self.backlog:  # what waits for the old socket's buffer goes from the new one
                self._loop.remove_writer(old.fileno())
                self._blocked(sock)
            self._lingering.add(old)
            self._loop.call_later(REBIND_LINGER, self._close_lingering, old)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            if self.backlog:
                self._loop.remove_writer(sock.fileno())
                self.backlog.clear()
            sock.close()
        for old in list(self._lingering):
            self._close_lingering(old)

    def _close_lingering(self, sock: socket.socket) -> None:
        if sock in self._lingering:
            self._lingering.discard(sock)
            self._loop.remove_reader(sock.fileno())
            sock.close()

    def _blocked(self, sock: socket.socket) -> None:
        self._loop.add_writer(sock.fileno(), self._writable)

    def _writable(self) -> None:
        if self.write_ready():
            assert self.sock is not None
            self._loop.remove_writer(self.sock.fileno())
