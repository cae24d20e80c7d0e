"""The RFC 3261 transaction timers, alone in a module so that a configuration load can take
their defaults without importing the SIP parser (a client starts faster).
``sip.transaction.TimerConfig`` is the same class."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class TimerConfig:
    """Transaction timer base values (RFC 3261 §17.1.1.1, table 4).

    ``t1``: RTT estimate, 0.5 s; ``t2``: maximum retransmit interval for
    non-INVITE requests and INVITE responses, 4 s; ``t4``: maximum time a
    message stays in the network, 5 s; ``timer_d``: the floor of timer D, the
    wait for response retransmissions after a non-2xx INVITE final over UDP,
    32 s. Timer D is ``max(timer_d, 64*t1)``: §17.1.1.2 sets it to at least
    32 s because that is how long the server retransmits (timer H, 64*T1).

    Raises :class:`ValueError` for a non-positive ``t1``/``t2`` or a negative
    ``t4``/``timer_d``.
    """

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0
    timer_d: float = 32.0

    def __post_init__(self) -> None:
        if not (self.t1 > 0 and self.t2 > 0):
            raise ValueError("t1 and t2 must be positive")
        if not (self.t4 >= 0 and self.timer_d >= 0):
            raise ValueError("t4 and timer_d must not be negative")

    @property
    def d(self) -> float:
        """Timer D over an unreliable transport (§17.1.1.2)."""
        return max(self.timer_d, 64 * self.t1)
