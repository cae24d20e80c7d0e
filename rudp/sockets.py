"""Non-blocking UDP socket calls for an endpoint: opening, batched reads, and writes that
keep their order while the kernel buffer is full, with runs of one size in one GSO call
(``rudp.gso``). Plain system calls, no event loop and no protocol: the adapter
(``rudp.aio.udp``) watches the sockets and says when one is readable or writable."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from rudp import gso

Address = tuple[str, int]
log = logging.getLogger("rudp")
# Kernel socket buffers: a window of small datagrams costs ~2 KB each of kernel memory
# (skb truesize), so Linux's 208 KB default drops a 512-packet burst on loopback.
SOCKET_BUFFER = 4 << 20
# Datagrams read per wake before the connections are asked what to send (bounds how long
# one busy socket keeps the loop from everything else).
READ_BATCH = 64
MAX_DATAGRAM = 65535


def set_socket_buffers(sock: socket.socket, size: int) -> None:
    """Ask for ``size``-byte send and receive buffers (the kernel caps it at rmem/wmem_max)."""
    if size <= 0:
        return
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)


def numeric_address(host: str, port: int) -> list[tuple[Any, ...]] | None:
    """``getaddrinfo`` for a numeric host (no resolver involved), or None for a name."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        return None


def open_udp(info: tuple[Any, ...], buffer: int) -> socket.socket:
    """A non-blocking UDP socket bound to where ``info`` (a ``getaddrinfo`` entry) says.
    Raises OSError when binding fails."""
    family, kind, proto, _, where = info
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.bind(where)
    except OSError:
        sock.close()
        raise
    set_socket_buffers(sock, buffer)
    gso.enable_gro(sock)  # a GSO run from the peer (or the proxy) is one read here
    return sock


def read_batch(sock: socket.socket) -> Iterator[tuple[bytes, Address]]:
    """The datagrams waiting on ``sock``, up to READ_BATCH, with their source; stops once
    the socket is closed (by what a datagram caused)."""
    read = 0
    while read < READ_BATCH and sock.fileno() >= 0:
        read += 1
        try:
            data, ancdata, _, addr = sock.recvmsg(MAX_DATAGRAM, gso.ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            continue  # an ICMP error queued on the socket: nothing to read in it
        source = (str(addr[0]), int(addr[1]))
        grams = gso.segments(data, ancdata)
        read += len(grams) - 1  # the batch bounds datagrams, not reads
        for datagram in grams:
            yield datagram, source
            if sock.fileno() < 0:
                return


class UdpSender:
    """Writes to one socket in order: once the kernel buffer is full, everything waits in
    a backlog until :meth:`write_ready`; ``on_blocked`` is called when the backlog starts
    (the adapter then watches the socket for room)."""

    __slots__ = ("_gso", "_on_blocked", "backlog", "sock")

    def __init__(self, on_blocked: Callable[[socket.socket], None]) -> None:
        self.sock: socket.socket | None = None
        self.backlog: deque[tuple[bytes, Address]] = deque()
        self._on_blocked = on_blocked
        self._gso = gso.AVAILABLE  # cleared when the kernel refuses it

    def sendto(self, data: bytes, addr: Address) -> None:
        sock = self.sock
        if sock is None:
            return
        if self.backlog:
            self.backlog.append((data, addr))
            return
        try:
            sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            self.backlog.append((data, addr))
            self._on_blocked(sock)
        except OSError:
            pass  # ICMP errors on UDP: the retransmission timer is the only judge

    def send_many(self, datagrams: list[bytes], addr: Address) -> None:
        """Send ``datagrams`` to ``addr`` in order; runs of one size share a system call
        where the kernel allows it."""
        if not self._gso or len(datagrams) == 1 or self.backlog:
            for data in datagrams:
                self.sendto(data, addr)
            return
        for start, end in gso.runs(datagrams):
            if end - start == 1 or not self._gso or self.backlog:
                for data in datagrams[start:end]:
                    self.sendto(data, addr)
            else:
                self._send_run(datagrams[start:end], addr)

    def _send_run(self, run: list[bytes], addr: Address) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            gso.send_run(sock, run, addr)
        except (BlockingIOError, InterruptedError):
            self.backlog.extend((data, addr) for data in run)
            self._on_blocked(sock)
        except OSError as error:
            if error.errno in gso.REFUSED:
                log.info("rudp endpoint: UDP GSO refused (%s); sending one by one", error)
                self._gso = False
            # Else an ICMP error queued on the socket was reported (and cleared) instead
            # of sending: nothing went out, so send them one by one.
            for data in run:
                self.sendto(data, addr)

    def write_ready(self) -> bool:
        """Send what the backlog holds while the kernel takes it; True once it is empty."""
        sock = self.sock
        assert sock is not None
        backlog = self.backlog
        while backlog:
            data, addr = backlog[0]
            try:
                sock.sendto(data, addr)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                pass
            backlog.popleft()
        return True
