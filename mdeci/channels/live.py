"""Live latency ``L`` and reliability ``V`` per user and channel: moving averages.

The broker feeds samples as they happen: the RUDP round-trip time and the share of its
packets that needed no retransmission (IP), the time from an SMS buffer's send to its
acknowledgement and whether it was acknowledged at all (SMS delivery reports). Each
figure is an exponentially weighted moving average (weight ``alpha`` for the newest
sample), starting at the channel's configured figure.

Reliability is kept in ``[FLOOR_V, 1]``: ``ln(1/V)`` must stay finite.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR_V = 1e-3


@dataclass(frozen=True, slots=True)
class Figures:
    """A channel's current latency (ms) and reliability (0-1] for one user."""

    latency_ms: float
    coverage: float


class LiveFigures:
    """Moving averages of (latency, reliability) per (user, channel)."""

    def __init__(self, defaults: dict[str, Figures], *, alpha: float = 0.2) -> None:
        self.defaults = dict(defaults)
        self.alpha = alpha
        self._now: dict[tuple[str, str], Figures] = {}

    def get(self, user: str, channel: str) -> Figures:
        found = self._now.get((user, channel))
        return found if found is not None else self.defaults[channel]

    def latency(self, user: str, channel: str, ms: float) -> Figures:
        """One latency sample (ms) for ``user`` on ``channel``."""
        old = self.get(user, channel)
        new = Figures(old.latency_ms + self.alpha * (max(ms, 0.001) - old.latency_ms), old.coverage)
        self._now[(user, channel)] = new
        return new

    def delivered(self, user: str, channel: str, ratio: float, weight: float = 1.0) -> Figures:
        """A reliability sample: the share ``ratio`` (0-1) of ``weight`` tries that
        got through (``weight`` > 1 counts as that many samples at once, capped at 1/alpha)."""
        old = self.get(user, channel)
        a = min(1.0, self.alpha * max(weight, 0.0))
        v = old.coverage + a * (min(max(ratio, 0.0), 1.0) - old.coverage)
        new = Figures(old.latency_ms, max(FLOOR_V, min(1.0, v)))
        self._now[(user, channel)] = new
        return new

    def forget(self, user: str) -> None:
        for key in [k for k in self._now if k[0] == user]:
            del self._now[key]
