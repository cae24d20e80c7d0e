"""The QUIC glue's socket system calls (no event loop, nothing of QUIC): a non-blocking
UDP socket, every datagram waiting read in one call, and a send that never blocks."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

Address = tuple[str, int]
READ_BATCH = 64  # datagrams read per call, at most
SOCKET_BUFFER = 4 << 20


def open_udp(host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to host:port (an IP literal). Raises OSError."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        sock.setblocking(False)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def read_batch(sock: socket.socket) -> Iterator[tuple[bytes, Address]]:
    """The datagrams waiting on ``sock``, up to :data:`READ_BATCH`."""
    for _ in range(READ_BATCH):
        try:
            data, addr = sock.recvfrom(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            continue  # an ICMP error: QUIC's own timers notice a dead path
        yield data, (str(addr[0]), int(addr[1]))


def send(sock: socket.socket, data: bytes, addr: Address) -> None:
    """Send one datagram; a full kernel buffer (or an ICMP error) is a loss QUIC
    recovers."""
    with contextlib.suppress(OSError):
        sock.sendto(data, addr)
