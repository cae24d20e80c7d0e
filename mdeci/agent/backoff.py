"""Jittered exponential back-off between attempts to reach the broker (pure).

Delay of attempt ``n`` (0-based): ``min(max, base * 2**n)`` scaled by a factor drawn
uniformly from ``[1 - jitter, 1 + jitter]``, then capped at ``max`` again. The jitter
spreads many agents that lost the same broker (no reconnect storm); the random source is
injected so tests get a fixed schedule.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

from mdeci.config import ReconnectConfig


class Backoff:
    """Delays for successive failed attempts; :meth:`reset` after a success."""

    def __init__(
        self, config: ReconnectConfig, random: Callable[[], float] = _random.random
    ) -> None:
        self.config = config
        self.random = random  # uniform in [0, 1)
        self.attempt = 0

    def delay_for(self, attempt: int) -> float:
        """The delay before retry number ``attempt`` (0-based), in seconds."""
        cfg = self.config
        raw = min(cfg.max, cfg.base * 2.0 ** min(attempt, 64))
        factor = 1.0 + cfg.jitter * (2.0 * self.random() - 1.0)
        return min(cfg.max, raw * factor)

    def next_delay(self) -> float:
        """The delay before the next attempt; counts one more failure."""
        delay = self.delay_for(self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0
