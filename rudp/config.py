"""Configuration of the RUDP core (one frozen, keyword-only dataclass)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class RudpConfig:
    """Every tunable of a RUDP connection; the defaults are documented in docs/rudp.md.

    Times are seconds. RTO rules follow RFC 6298 (alpha 1/8, beta 1/4, K 4).
    """

    rto_initial: float = 1.0  # RFC 6298 §2.1 initial RTO
    rto_min: float = 0.2  # lower clamp (RFC 6298 §2.4 says 1 s; LAN/mobile links want less)
    rto_max: float = 60.0  # upper clamp (RFC 6298 §2.5 allows >= 60 s)
    granularity: float = 0.001  # G, the clock granularity of RFC 6298 §2
    backoff: float = 2.0  # RTO multiplier on each expiry (RFC 6298 §5.5)
    max_retries: int = 6  # expiries tolerated; the next one fails the connection
    window: int = 64  # packets in flight (sender) and accepted ahead (receiver)
    mtu: int = 1200  # largest datagram written, header and tag included
    max_message_size: int = 1 << 20  # bytes; bounds the fragment count too
    max_buffer_bytes: int = 4 << 20  # per-peer reordering + reassembly memory cap
    ack_delay: float = 0.02  # delayed ACK timer (RFC 1122 §4.2.3.2 allows up to 0.5 s)
    ack_every: int = 2  # ACK at once after this many in-order packets (RFC 5681 §4.2)
    reorder_threshold: int = 3  # packets sent later and acked before a packet is lost
    reorder_time: float = 1.25  # ...and its age must exceed this many RTTs (RFC 9002 §6.1.2)
    keepalive_interval: float = 15.0  # idle time before a PING (0 disables)
    # Seconds a sent PING or DATA may wait with nothing authentic heard from the peer
    # before the connection fails, whatever the RTO back-off would still allow (0: the
    # back-off and max_retries alone decide). Bounds how long a dead peer looks alive.
    dead_after: float = 0.0
    replay_window: int = 1024  # packet numbers remembered below the highest seen
    max_sack_blocks: int = 32  # selective-ACK ranges per ACK
    tail_probe: bool = True  # tail-loss probe after 2 SRTT without ACK progress (RFC 8985 §7)

    def __post_init__(self) -> None:
        if not 0 < self.rto_min <= self.rto_initial <= self.rto_max:
            raise ValueError("need 0 < rto_min <= rto_initial <= rto_max")
        if self.backoff < 1.0:
            raise ValueError("backoff must be >= 1")
        if self.max_retries < 0 or self.window < 1 or self.ack_every < 1:
            raise ValueError("max_retries >= 0, window >= 1, ack_every >= 1")
        if self.mtu < 128 or self.mtu > 65000:
            raise ValueError("mtu must be within 128..65000")
        if self.max_message_size < 0 or self.max_sack_blocks < 1 or self.replay_window < 1:
            raise ValueError("max_message_size >= 0, max_sack_blocks >= 1, replay_window >= 1")
        if self.keepalive_interval < 0 or self.dead_after < 0:
            raise ValueError("keepalive_interval >= 0, dead_after >= 0")
        if self.max_buffer_bytes < self.max_message_size + self.mtu:
            # Reassembly of the largest message must always fit (see RudpConnection).
            raise ValueError("max_buffer_bytes must be >= max_message_size + mtu")
