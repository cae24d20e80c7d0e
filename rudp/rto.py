"""Retransmission timeout estimator, exactly RFC 6298 §2 and §5.

Theory of operation: ``on_sample(r)`` feeds one RTT measurement taken, per
Karn's rule (RFC 6298 §3), only from a packet that was sent once. The first
sample sets SRTT = R and RTTVAR = R/2 (§2.2); later ones use alpha = 1/8 and
beta = 1/4 (§2.3). RTO = SRTT + max(G, K*RTTVAR) with K = 4, clamped to
[rto_min, rto_max] (§2.4, §2.5). ``back_off()`` multiplies the RTO by the
configured factor on each expiry (§5.5); the next valid sample recomputes it, and
so does ``undo_back_off()`` (after a path change).
"""

from __future__ import annotations

from rudp.config import RudpConfig

ALPHA = 1 / 8
BETA = 1 / 4
K = 4


class RtoEstimator:
    """SRTT/RTTVAR/RTO state of one connection."""

    __slots__ = ("_config", "rto", "rttvar", "srtt")  # one per session in a broker

    def __init__(self, config: RudpConfig) -> None:
        self._config = config
        self.srtt: float | None = None
        self.rttvar: float | None = None
        self.rto: float = config.rto_initial

    def _clamp(self, value: float) -> float:
        return max(self._config.rto_min, min(value, self._config.rto_max))

    def on_sample(self, r: float) -> float:
        """Take one RTT measurement ``r`` (seconds); return the new RTO."""
        r = max(r, 0.0)
        if self.srtt is None or self.rttvar is None:
            self.srtt = r
            self.rttvar = r / 2
        else:
            # §2.3: RTTVAR is updated with the old SRTT, then SRTT.
            self.rttvar = (1 - BETA) * self.rttvar + BETA * abs(self.srtt - r)
            self.srtt = (1 - ALPHA) * self.srtt + ALPHA * r
        self.rto = self._clamp(self.srtt + max(self._config.granularity, K * self.rttvar))
        return self.rto

    def back_off(self) -> float:
        """Multiply the RTO by the back-off factor (RFC 6298 §5.5), capped at rto_max."""
        self.rto = self._clamp(self.rto * self._config.backoff)
        return self.rto

    def undo_back_off(self) -> float:
        """The RTO the samples alone give (``rto_initial`` before any): forgets the
        back-offs, keeps the samples. For a path change: the back-off measured the old
        path's silence, not the new path's round trip."""
        if self.srtt is None or self.rttvar is None:
            self.rto = self._config.rto_initial
        else:
            self.rto = self._clamp(self.srtt + max(self._config.granularity, K * self.rttvar))
        return self.rto

    def clear(self) -> None:
        """Forget all samples (RFC 6298 §5.7 permits this after repeated back-offs)."""
        self.srtt = None
        self.rttvar = None
        self.rto = self._config.rto_initial
