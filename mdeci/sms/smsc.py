"""An embedded simulated SMSC (sans-IO): delay, loss, duplication and reordering.

Submitted SMS are delivered later, each after a delay drawn from a histogram of
:class:`DelayBin` (uniform within a bin; a bin at infinity means "never delivered").
:data:`THESIS_DELAYS` is the measured distribution the thesis cites: 73.2% within 10 s,
17% within a minute, 5% after more than 90 minutes, 5.1% never. Those shares add up to
100.3%; the bins are used as relative weights (so each is scaled by 1/1.003), and the
"after more than 90 minutes" bin is taken as uniform over 90-180 minutes (the source
gives no upper bound). ``time_scale`` multiplies every delay, so a test can run the
shape of the distribution faster; with a fake clock the scale only changes the numbers.

Randomness comes from the ``random.Random`` passed in, time from the ``now`` arguments.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

from mdeci.sms.codec import Sms
from mdeci.sms.errors import SmsError


@dataclass(frozen=True, slots=True)
class DelayBin:
    """``weight`` of the deliveries take between ``low`` and ``high`` seconds."""

    weight: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if self.weight < 0 or self.low < 0 or self.high < self.low:
            raise SmsError(f"bad delay bin {self}")


NEVER = math.inf

THESIS_DELAYS: tuple[DelayBin, ...] = (
    DelayBin(0.732, 0.0, 10.0),
    DelayBin(0.170, 10.0, 60.0),
    DelayBin(0.050, 90 * 60.0, 180 * 60.0),
    DelayBin(0.051, NEVER, NEVER),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class SmscConfig:
    """Impairments of the simulated SMSC; probabilities are per submitted SMS."""

    delays: tuple[DelayBin, ...] = field(default=(DelayBin(1.0, 1.0, 5.0),))
    loss: float = 0.0  # dropped outright, on top of any "never" bin
    duplicate: float = 0.0  # delivered twice, each copy with its own delay
    reorder: float = 0.0  # held back an extra ``reorder_delay`` seconds
    reorder_delay: float = 30.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.delays or sum(b.weight for b in self.delays) <= 0:
            raise SmsError("the delay histogram needs a positive weight")
        for p in (self.loss, self.duplicate, self.reorder):
            if not 0.0 <= p <= 1.0:
                raise SmsError("probabilities must be within 0..1")
        if self.time_scale <= 0 or self.reorder_delay < 0:
            raise SmsError("time_scale must be > 0 and reorder_delay >= 0")


@dataclass(slots=True)
class SmscStats:
    submitted: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0


class SimulatedSmsc:
    """Store-and-forward with impairments; the caller routes delivered SMS by recipient."""

    def __init__(self, config: SmscConfig, rng: random.Random) -> None:
        self.config = config
        self.stats = SmscStats()
        self._rng = rng
        self._queue: list[tuple[float, int, Sms]] = []
        self._seq = 0
        total = sum(b.weight for b in config.delays)
        self._weights = [b.weight / total for b in config.delays]

    def _delay(self) -> float:
        cfg = self.config
        (bin_,) = self._rng.choices(cfg.delays, weights=self._weights)
        if bin_.low == NEVER:
            return NEVER
        delay = self._rng.uniform(bin_.low, bin_.high)
        if cfg.reorder and self._rng.random() < cfg.reorder:
            delay += cfg.reorder_delay
        return delay * cfg.time_scale

    def submit(self, sms: Sms, now: float) -> None:
        """Accept one SMS for delivery (it may be lost, late, or delivered twice)."""
        self.stats.submitted += 1
        copies = 1
        if self.config.duplicate and self._rng.random() < self.config.duplicate:
            copies = 2
            self.stats.duplicated += 1
        for _ in range(copies):
            delay = NEVER
            if not (self.config.loss and self._rng.random() < self.config.loss):
                delay = self._delay()
            if delay == NEVER:
                self.stats.lost += 1
                continue
            self._seq += 1
            heapq.heappush(self._queue, (now + delay, self._seq, sms))

    def next_delivery(self) -> float | None:
        """Time of the next delivery, or ``None``."""
        return self._queue[0][0] if self._queue else None

    def deliver_due(self, now: float) -> list[Sms]:
        """SMS whose delivery time has come, earliest first."""
        out = []
        while self._queue and self._queue[0][0] <= now:
            out.append(heapq.heappop(self._queue)[2])
        self.stats.delivered += len(out)
        return out

    def __len__(self) -> int:
        return len(self._queue)
