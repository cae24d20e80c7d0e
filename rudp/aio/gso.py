"""UDP generic segmentation offload (GSO): many datagrams, one system call (Linux).

One ``sendmsg`` with a ``UDP_SEGMENT`` control message (Linux >= 4.18, ``linux/udp.h``)
carries up to :data:`SEGMENTS` datagrams of one size, the last possibly shorter; the
kernel cuts them apart, and each leaves as a complete datagram of its own: the receiver
cannot tell them from datagrams sent one by one. On loopback it costs ~0.5 µs a datagram
against ~3-5 µs for a ``sendto`` each. Used by the endpoint and the impairment proxy; the
caller falls back to ``sendto`` when the kernel or the device refuses it (:data:`REFUSED`).
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
from collections.abc import Iterator, Sequence

UDP_SEGMENT = 103
SEGMENTS = 64  # UDP_MAX_SEGMENTS of the oldest kernels that have GSO
MAX_BYTES = 65000  # under the 65,507 payload bytes of one IPv4 UDP datagram
_SIZE = struct.Struct("=H")  # the control message's value: the segment size, native u16
# What a kernel or device without GSO answers (no support, no checksum offload, a path
# MTU below the segment size): stop trying and send one by one.
REFUSED = frozenset({errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EMSGSIZE})
AVAILABLE = sys.platform == "linux"


def runs(datagrams: Sequence[bytes]) -> Iterator[tuple[int, int]]:
    """``[start, end)`` slices of ``datagrams``, in order, each sendable as one GSO write:
    equal sizes except a shorter last one, at most SEGMENTS and MAX_BYTES in all."""
    i, n = 0, len(datagrams)
    while i < n:
        size = len(datagrams[i])
        j, total, end = i + 1, size, min(n, i + SEGMENTS)
        while j < end:
            length = len(datagrams[j])
            if length > size or total + length > MAX_BYTES:
                break
            total += length
            j += 1
            if length < size:
                break  # a shorter datagram can only be a run's last segment
        yield i, j
        i = j


def send_run(sock: socket.socket, run: Sequence[bytes], addr: tuple[str, int] | None) -> None:
    """Send ``run`` (one of :func:`runs`) in one system call; ``addr`` None on a connected
    socket. Raises what ``sendmsg`` raises."""
    control = [(socket.SOL_UDP, UDP_SEGMENT, _SIZE.pack(len(run[0])))]
    if addr is None:
        sock.sendmsg([b"".join(run)], control)
    else:
        sock.sendmsg([b"".join(run)], control, 0, addr)
