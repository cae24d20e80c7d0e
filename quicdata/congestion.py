"""The QUIC data channel's congestion control: NewReno with RUDP's window as its floor,
through aioquic's congestion-control registry, so that both data channels meet random
loss alike.

RUDP keeps up to ``window`` packets in flight whatever it loses (``rudp/config.py``): a
data channel carries one user's notifications, far below what a path carries, and the
losses of a radio link are mostly not congestion. aioquic's NewReno (and CUBIC) halve
the window at every loss episode, so at 1-5 % random loss a connection lives on a window
of two or three packets, paced over the round trip: a wake, a timer and a system call
per datagram, several times RUDP's CPU per message for a fraction of its goodput.

:class:`FlooredReno` is NewReno (slow start, congestion avoidance, halving at a loss
episode) whose window starts at and a loss never takes below :data:`FLOOR_PACKETS`
datagrams (RUDP's 64). Persistent congestion (RFC 9002 §7.6: every packet over more
than a PTO period lost) drops it to the minimum, as NewReno does, and the floor holds
again only once the window has grown back to it, so a path that really collapsed is not
flooded. The price: under random loss a data channel keeps its 64 packets in flight
where a TCP flow on the same path halves its window, as RUDP always did.
"""

from __future__ import annotations

from collections.abc import Iterable

from aioquic.quic.congestion.base import register_congestion_control
from aioquic.quic.congestion.reno import RenoCongestionControl
from aioquic.quic.packet_builder import QuicSentPacket

#: The name :class:`FlooredReno` is registered under (``QuicDataConfig.congestion``).
FLOORED_RENO = "mdeci-floored-reno"

#: The window a loss leaves at least, in datagrams: RUDP's default window.
FLOOR_PACKETS = 64


class FlooredReno(RenoCongestionControl):
    def __init__(self, *, max_datagram_size: int) -> None:
        super().__init__(max_datagram_size=max_datagram_size)
        self.floor = FLOOR_PACKETS * max_datagram_size
        # RUDP sends its window from the start; NewReno's initial 10 packets would make
        # the first loss raise the window to the floor.
        self.congestion_window = max(self.congestion_window, self.floor)
        self._floored = True  # False from persistent congestion until the window regrew

    def on_packet_acked(self, *, now: float, packet: QuicSentPacket) -> None:
        super().on_packet_acked(now=now, packet=packet)
        if not self._floored and self.congestion_window >= self.floor:
            self._floored = True

    def on_packets_lost(self, *, now: float, packets: Iterable[QuicSentPacket]) -> None:
        super().on_packets_lost(now=now, packets=packets)
        if self._floored and self.congestion_window < self.floor:
            self.congestion_window = self.floor
            self.ssthresh = self.floor

    def on_persistent_congestion(self) -> None:
        super().on_persistent_congestion()
        self._floored = False


register_congestion_control(FLOORED_RENO, FlooredReno)
