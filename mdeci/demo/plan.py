"""What the demo does and when: the event stream bob publishes and alice's journey.

Pure data: no I/O. Times are seconds after bob's first publish.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from mdeci.filters import compile_filter
from mdeci.frames import AttrValue

SUBJECT = "StockExchange"
FILTER = "(Stock == 'PETR4') and (Price < 25)"
STOCKS = ("PETR4", "PETR4", "VALE3", "ITUB4")  # PETR4 twice: about a quarter of events match


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoPlan:
    """The schedule of one demo run.

    alice starts on ``hosts[0]`` and moves to each next host at ``moves_at``; at
    ``outage_at`` her radio goes silent for ``outage_for`` seconds and she comes back on
    the last host. bob publishes ``events`` events at ``rate`` per second meanwhile.
    """

    events: int = 600
    rate: float = 25.0  # publishes per second
    moves_at: tuple[float, ...] = (3.0, 6.0)
    outage_at: float = 9.0
    outage_for: float = 9.0
    hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    drain_guard: float = 20.0  # seconds to wait for the last notifications, then judge
    seed: int = 1

    def __post_init__(self) -> None:
        if self.events < 1 or self.rate <= 0:
            raise ValueError("need events >= 1 and rate > 0")
        if len(self.hosts) != len(self.moves_at) + 2:
            raise ValueError("need one host per move, plus the first and the comeback host")
        times = (*self.moves_at, self.outage_at)
        if any(b <= a for a, b in itertools.pairwise(times)) or times[0] <= 0:
            raise ValueError("moves and the outage must come in order, after the start")
        if self.outage_for <= 0 or self.drain_guard <= 0:
            raise ValueError("need outage_for > 0 and drain_guard > 0")

    @property
    def stream_seconds(self) -> float:
        """How long bob publishes."""
        return self.events / self.rate

    @property
    def comeback_at(self) -> float:
        return self.outage_at + self.outage_for


FULL = DemoPlan()
# About 15 s: the same story with fewer events and a shorter outage (tests, CI).
QUICK = DemoPlan(events=250, rate=25.0, moves_at=(1.5, 3.0), outage_at=4.5, outage_for=4.0)


@dataclass(frozen=True, slots=True)
class StockEvent:
    """One event bob publishes; ``matches`` is the filter evaluated locally."""

    index: int
    attrs: Mapping[str, AttrValue]
    matches: bool

    @property
    def payload(self) -> bytes:
        return f"#{self.index} {self.attrs['Stock']} {self.attrs['Price']}".encode()


def stock_events(count: int, seed: int) -> Iterator[StockEvent]:
    """A deterministic stream of ``count`` quotes; the same seed gives the same stream."""
    rng = random.Random(seed)
    accept = compile_filter(FILTER)
    for index in range(count):
        attrs: dict[str, AttrValue] = {
            "Stock": rng.choice(STOCKS),
            "Price": round(rng.uniform(18.0, 32.0), 2),
            "Volume": rng.randrange(100, 10_000, 100),
        }
        yield StockEvent(index, attrs, accept(attrs))
