"""Every UDP datagram on the loopback interface, as the wire carries it (AF_PACKET).

A packet socket on ``lo`` sees what any on-path observer would: each IPv4 UDP packet
(both directions; the loopback driver shows each one as sent and as received). The
tests filter by port, so traffic of other processes on the machine is ignored.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field

from tests.peers import missing

ETH_P_ALL = 0x0003
ETH_HEADER = 14


@dataclass(frozen=True, slots=True)
class Datagram:
    src: tuple[str, int]
    dst: tuple[str, int]
    payload: bytes


@dataclass(eq=False)
class LoopbackCapture:
    """Capture UDP on ``lo`` while open; ``datagrams`` for those touching ``ports``."""

    ports: set[int] = field(default_factory=set)
    datagrams: list[Datagram] = field(default_factory=list)
    _sock: socket.socket | None = None

    def open(self) -> LoopbackCapture:
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.bind(("lo", 0))
        except (PermissionError, OSError) as exc:
            missing(
                f"a packet socket on lo ({exc})",
                "run the tests as root or grant CAP_NET_RAW to the Python interpreter",
            )
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.setblocking(False)
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._drain)
        return self

    def _drain(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frame = self._sock.recv(70000)
            except BlockingIOError:
                return
            self._take(frame)

    def _take(self, frame: bytes) -> None:
        ip = frame[ETH_HEADER:]
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_UDP:
            return
        ihl = (ip[0] & 0x0F) * 4
        src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
        sport, dport, length = struct.unpack_from("!HHH", ip, ihl)
        if sport not in self.ports and dport not in self.ports:
            return
        payload = ip[ihl + 8 : ihl + length]
        self.datagrams.append(Datagram((src, sport), (dst, dport), bytes(payload)))

    def close(self) -> None:
        if self._sock is not None:
            self._drain()
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
