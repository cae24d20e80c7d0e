"""UDP segmentation offload (GSO) and receive offload (GRO): many datagrams, one system
call each way (Linux).

One ``sendmsg`` with a ``UDP_SEGMENT`` control message (Linux >= 4.18, ``linux/udp.h``)
carries up to :data:`SEGMENTS` datagrams of one size, the last possibly shorter; the
kernel cuts them apart, and each leaves as a complete datagram of its own: the receiver
cannot tell them from datagrams sent one by one. On loopback it costs ~0.5 µs a datagram
against ~3-5 µs for a ``sendto`` each. Used by the endpoint and the impairment proxy; the
caller falls back to ``sendto`` when the kernel or the device refuses it (:data:`REFUSED`).

Receiving, a socket with ``UDP_GRO`` set (Linux >= 5.0) may get such a run whole from
one ``recvmsg``, with the segment size in a control message: :func:`segments` cuts it
back into the datagrams that were sent. Without the option, or on another system, every
``recvmsg`` returns one datagram and no control message.
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
from collections.abc import Iterator, Sequence

UDP_SEGMENT = 103
UDP_GRO = 104
SEGMENTS = 64  # UDP_MAX_SEGMENTS of the oldest kernels that have GSO
MAX_BYTES = 65000  # under the 65,507 payload bytes of one IPv4 UDP datagram
_SIZE = struct.Struct("=H")  # the control message's value: the segment size, native u16
_GRO_SIZE = struct.Struct("=i")  # what UDP_GRO reports: the segment size, native int
ANCILLARY = socket.CMSG_SPACE(_GRO_SIZE.size)  # recvmsg's room for that report
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


def enable_gro(sock: socket.socket) -> bool:
    """Ask for coalesced runs on ``sock`` (:func:`segments` undoes them); False when the
    system has no UDP_GRO (then every read is one datagram anyway)."""
    if not AVAILABLE:
        return False
    try:
        sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    return True


def segments(data: bytes, ancdata: list[tuple[int, int, bytes]]) -> list[bytes]:
    """The datagrams of one ``recvmsg`` result: ``data`` cut at the segment size UDP_GRO
    reported (the last one may be shorter), or ``data`` alone."""
    for level, kind, value in ancdata:
        if level == socket.SOL_UDP and kind == UDP_GRO and len(value) >= _GRO_SIZE.size:
            (size,) = _GRO_SIZE.unpack_from(value)
            if 0 < size < len(data):
                return [data[i : i + size] for i in range(0, len(data), size)]
    return [data]
